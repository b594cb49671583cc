"""The stronger sandbox tier: the command runs under gVisor (``runsc``), a
user-space kernel, so a kernel bug it reaches is gVisor's, not the host's.

Selected by ``Policy(tier="gvisor")``; ``runner.run`` sends it here. It is
never a silent fallback: where ``runsc`` is missing, ``SandboxUnavailable``.

Not ``runsc do``: that shows the command an overlay of the HOST's root
(the database, ``~/.ssh``, other runs' workspaces). Each run gets its own
OCI bundle whose root is an empty read-only directory holding only mount
points, with the same read-only system binds as the standard tier
(``bwrap.SYSTEM``, the ``/etc`` view), the workspace read-write at
``/workspace``, a size-capped ``/tmp``, its own ``/proc``; no network
interfaces (``--network=none``); memory and process limits as cgroups;
rlimits from ``Limits`` (``processes`` as ``RLIMIT_NPROC``). The process is uid ``bwrap.INNER_UID`` (not root)
holding ``CAP_DAC_OVERRIDE``/``CAP_FOWNER`` inside gVisor only, so it can
write the caller's root-owned workspace as the standard tier's command can
(there its uid maps to the host's root); what it creates is owned by that
uid on the host. Each run has its own state directory and container id,
and the container is force-deleted and both directories removed at the
end, whatever happened (timeout: ``runsc kill`` then ``delete --force``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cairn.sandbox import bwrap
from cairn.sandbox.controls import SandboxUnavailable
from cairn.sandbox.policy import Limits, Policy
from cairn.sandbox.result import Result, exited, memory_file, read_output

#: the environment ``runsc`` itself runs with (nothing of this process's)
LAUNCH_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
#: capabilities the command holds inside gVisor's kernel (never on the host): enough to write the workspace
CAPABILITIES = ["CAP_DAC_OVERRIDE", "CAP_FOWNER"]


def runsc_path() -> str:
    """Where ``runsc`` is, or ``SandboxUnavailable`` naming it (looked up on
    each call, on this process's ``PATH``)."""
    path = shutil.which("runsc")
    if path is None:
        raise SandboxUnavailable("sandbox tier 'gvisor' unavailable: runsc is not installed "
                                 "(apt-get install runsc)")
    return path


def config(argv: Sequence[str], env: Mapping[str, str], workspace: str, limits: Limits,
           cgroup: str) -> dict[str, Any]:
    """The OCI ``config.json`` of one run (a pure function, so the binds are
    read and tested in one place)."""
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
         "options": [f"size={limits.tmp_bytes}", "mode=1777", "nosuid", "nodev"]},
    ]
    for path in bwrap.SYSTEM:
        if os.path.isdir(path) and not os.path.islink(path):
            mounts.append({"destination": path, "type": "bind", "source": path, "options": ["rbind", "ro"]})
    mounts += [
        {"destination": "/etc", "type": "bind", "source": bwrap.etc_view(), "options": ["rbind", "ro"]},
        {"destination": bwrap.WORKSPACE, "type": "bind", "source": workspace, "options": ["rbind", "rw"]},
    ]
    rlimits = [("RLIMIT_FSIZE", limits.file_bytes), ("RLIMIT_CPU", limits.cpu_seconds),
               ("RLIMIT_NOFILE", limits.open_files), ("RLIMIT_CORE", 0),
               ("RLIMIT_NPROC", limits.processes)]
    caps = {kind: list(CAPABILITIES) for kind in ("bounding", "effective", "permitted")}
    return {
        "ociVersion": "1.0.0",
        "process": {
            "terminal": False, "user": {"uid": bwrap.INNER_UID, "gid": bwrap.INNER_UID},
            "args": list(argv), "env": [f"{k}={v}" for k, v in {**bwrap.BASE_ENV, **env}.items()],
            "cwd": bwrap.WORKSPACE, "capabilities": caps, "noNewPrivileges": True,
            "rlimits": [{"type": name, "hard": value, "soft": value} for name, value in rlimits],
        },
        "root": {"path": "rootfs", "readonly": True},
        "hostname": "sandbox",
        "mounts": mounts,
        "linux": {
            "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
            # memory: the whole sandbox, gVisor's own kernel included. No pids cgroup: it would count
            # gVisor's host threads (ptrace stubs, Go runtime), not the command's processes, and kill
            # the sandbox at a few background processes; RLIMIT_NPROC (enforced by gVisor) counts those
            "resources": {"memory": {"limit": limits.memory_bytes, "swap": limits.memory_bytes}},
            "cgroupsPath": cgroup,
        },
    }


def _rootfs(root: Path) -> None:
    """The empty root: a mount point per bind, the host's top-level symlinks
    (``/bin -> usr/bin``) as symlinks, nothing else."""
    for path in (*bwrap.SYSTEM, "/proc", "/dev", "/tmp", "/etc", bwrap.WORKSPACE):
        target = root / path.lstrip("/")
        if os.path.islink(path):
            target.symlink_to(os.readlink(path))
        elif path in bwrap.SYSTEM and not os.path.isdir(path):
            continue
        else:
            target.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o555)


def _runsc(runsc: str, state: str, *args: str, timeout: float = 30) -> None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run([runsc, "--root", state, *args], env=LAUNCH_ENV, stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=timeout)


def run(argv: Sequence[str], ws: Path, policy: Policy, *, stdin: bytes | None = None,
        env: Mapping[str, str] | None = None) -> Result:
    """Run ``argv`` under ``runsc`` in a fresh bundle; the same ``Result``
    as the standard tier (``degraded`` empty, ``oom_killed`` not detected)."""
    runsc = runsc_path()
    limits = policy.limits
    name = f"cairn-{uuid.uuid4().hex}"
    with contextlib.ExitStack() as stack:
        work = Path(tempfile.mkdtemp(prefix="cairn-gvisor-"))
        stack.callback(shutil.rmtree, work, ignore_errors=True)
        bundle, state = work / "bundle", work / "state"
        bundle.mkdir()
        state.mkdir(mode=0o700)
        _rootfs(bundle / "rootfs")
        (bundle / "config.json").write_text(json.dumps(config(argv, env or {}, str(ws), limits, f"/{name}")))
        out, err, inp = (stack.enter_context(memory_file(n)) for n in ("stdout", "stderr", "stdin"))
        inp.write(stdin or b"")
        inp.flush()
        inp.seek(0)
        started = time.perf_counter()
        process = subprocess.Popen(
            [runsc, "--root", str(state), "--network=none", "run", "--bundle", str(bundle), name],
            stdin=inp, stdout=out, stderr=err, env=LAUNCH_ENV, start_new_session=True)
        # runs last-registered first: the container is killed and deleted before its directories go
        stack.callback(_end, process, runsc, str(state), name)
        try:
            timed_out = not exited(process, limits.wall_seconds)
        except BaseException:
            _kill(process, runsc, str(state), name)
            raise
        if timed_out:
            _kill(process, runsc, str(state), name)
        code = process.wait()
        seconds = time.perf_counter() - started
        stdout, cut_out = read_output(out, limits.output_bytes)
        stderr, cut_err = read_output(err, limits.output_bytes)
        if timed_out:
            code = -signal.SIGKILL
        elif code > 128 and code - 128 in (signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV, signal.SIGXCPU,
                                            signal.SIGXFSZ, signal.SIGABRT):
            code = 128 - code  # runsc reports a signal death as 128+N; the standard tier as -N
        return Result(exit_code=code, stdout=stdout, stderr=stderr, timed_out=timed_out,
                             seconds=seconds, truncated=cut_out or cut_err)
    raise AssertionError("unreachable")  # pragma: no cover


def _kill(process: subprocess.Popen[bytes], runsc: str, state: str, name: str) -> None:
    """Kill every process of the container (gVisor's sandbox, gofer and the
    command inside), then ``runsc`` itself."""
    _runsc(runsc, state, "kill", "--all", name, "KILL")
    _runsc(runsc, state, "delete", "--force", name)
    with contextlib.suppress(OSError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _end(process: subprocess.Popen[bytes], runsc: str, state: str, name: str) -> None:
    if process.poll() is None:
        _kill(process, runsc, state, name)
    _runsc(runsc, state, "delete", "--force", name)


__all__ = ["CAPABILITIES", "config", "run", "runsc_path"]
