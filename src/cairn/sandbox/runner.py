"""Run one command in a sandbox: the controls required, the workspace
handed to the sandbox's uid, the proxy started if egress is on, bwrap
launched by a shell that joins the sandbox's cgroups and sets its rlimits
(``launcher``), and the whole sandbox killed at the wall-clock limit.

The whole sandbox is one PID namespace whose first process is bwrap's
init: when it dies the kernel kills every process in the namespace,
whatever they did to detach (double fork, ``setsid``, ``nohup``). It dies
when the command exits, when bwrap dies (``--die-with-parent`` chains to it
from this process), or here at the timeout (it and bwrap are killed).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from cairn.errors import InvalidArgument
from cairn.sandbox import bridge, bwrap, cgroups, controls, gvisor, launcher, seccomp
from cairn.sandbox.egress import Proxy
from cairn.sandbox.policy import Limits, Policy
from cairn.sandbox.result import Result
from cairn.sandbox.result import exited as _exited
from cairn.sandbox.result import memory_file as _memory_file
from cairn.sandbox.result import read_output as _read

#: the whole environment of the launcher and bwrap (never this process's: see ``run``)
LAUNCH_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


def _kill(process: subprocess.Popen[bytes], info: int) -> None:
    """Kill the sandbox's init (the kernel then kills its whole PID
    namespace) and bwrap; the init's pid comes from bwrap's ``--info-fd``."""
    with contextlib.suppress(OSError, ValueError):
        os.set_blocking(info, False)
        pid = json.loads(os.read(info, 4096) or b"{}").get("child-pid")
        if isinstance(pid, int) and pid > 1:
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        process.kill()


def check_command(argv: Sequence[str], env: Mapping[str, str] | None,
                  workspace: str | os.PathLike[str]) -> Path:
    """The workspace's absolute path, once the command, its environment and
    the workspace are checked (``InvalidArgument`` naming the problem)."""
    if not argv or not argv[0] or not all(isinstance(a, str) and "\0" not in a for a in argv):
        raise InvalidArgument("a sandbox command is a non-empty list of strings without NUL")
    for key, value in (env or {}).items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise InvalidArgument(f"bad sandbox environment variable {key!r}")
    ws = Path(workspace).absolute()
    if not ws.is_dir():
        raise InvalidArgument(f"sandbox workspace {str(ws)!r} is not a directory")
    return ws


class Sandbox:
    """One sandbox's processes and all that is made for it (cgroups, the
    egress proxy, the filter's pipe, the memory files of its streams), from
    the launcher's start to ``close``, which kills whatever of it is left
    and releases the rest. ``run`` makes one per command; a warm pool
    (``pool``) makes one ahead of its command."""

    def __init__(self, command: Sequence[str], ws: Path, policy: Policy, degraded: frozenset[str], *,
                 env: Mapping[str, str] | None = None, stdin: bytes | None = None, egress: bool = False,
                 pass_fds: Sequence[int] = ()) -> None:
        self.degraded = degraded
        self._reap_later = False
        self.group: cgroups.Group | None = None
        self.proxy: Proxy | None = None
        self._cleanup = contextlib.ExitStack()  # whatever fails below, nothing made here outlives close()
        try:
            self._start(command, ws, policy, env, stdin, egress, pass_fds)
        except BaseException:
            self._cleanup.close()
            raise

    def _start(self, command: Sequence[str], ws: Path, policy: Policy, env: Mapping[str, str] | None,
               stdin: bytes | None, egress: bool, pass_fds: Sequence[int]) -> None:
        cleanup, degraded = self._cleanup, self.degraded
        if not {"processes", "memory"} <= degraded:
            group = self.group = cgroups.Group.make(
                pids_max=None if "processes" in degraded else policy.limits.processes,
                memory_max=None if "memory" in degraded else policy.limits.memory_bytes)
            cleanup.callback(group.remove)
            cleanup.callback(self._stop)  # runs first: nothing of the sandbox outlives the call
        command, extra_env = list(command), dict(env or {})
        if egress and policy.egress is not None:
            proxy = self.proxy = Proxy(policy.egress)
            cleanup.callback(proxy.close)
            command = bridge.wrap(command, controls.SANDBOX_PYTHON)
            extra_env.update(bridge.PROXY_ENV)
        owned: list[int] = []  # descriptors still ours to close (each closed exactly once: a number
        cleanup.callback(_close_all, owned)  # closed twice could be another thread's file by then)
        filter_fd = None if "seccomp" in degraded else seccomp.filter_fd(unix_sockets=self.proxy is not None)
        if filter_fd is not None:
            owned.append(filter_fd)
        info_read, info_write = os.pipe()
        owned += [info_read, info_write]
        self._info = info_read
        passed = [info_write] + ([filter_fd] if filter_fd is not None else [])
        spec = bwrap.Spec(workspace=str(ws), argv=command, env=extra_env,
                          tmp_bytes=policy.limits.tmp_bytes, seccomp_fd=filter_fd,
                          proxy_socket=self.proxy.path if self.proxy else None, info_fd=info_write)
        # the launcher joins the cgroups and sets the rlimits before it execs bwrap, so every process of
        # the sandbox is counted and limited
        joins = self.group.joins if self.group is not None else ()
        self.out, self.err, self.stdin = (cleanup.enter_context(_memory_file(n))
                                          for n in ("stdout", "stderr", "stdin"))
        self.give_stdin(stdin)
        self.started = time.perf_counter()
        self.process = subprocess.Popen(
            launcher.command(joins, policy.limits, bwrap.command(spec)), stdin=self.stdin, stdout=self.out,
            stderr=self.err,
            # bwrap's init (the sandbox's pid 1) keeps the environment bwrap was given, and the
            # sandbox can read /proc/1/environ: give it nothing of this process's
            env=LAUNCH_ENV, pass_fds=[*passed, *pass_fds], start_new_session=True)
        cleanup.callback(self._end)
        for fd in passed:  # the child has its copies
            owned.remove(fd)
            os.close(fd)

    def give_stdin(self, data: bytes | None) -> None:
        """What the command reads on its standard input: before it starts
        (a pooled sandbox's stub never reads it; the command shares the
        file's offset, so it reads from the start)."""
        self.stdin.write(data or b"")
        self.stdin.flush()
        self.stdin.seek(0)

    def wait(self, wall_seconds: float) -> tuple[int, bool]:
        """Wait for the sandbox to end, killing it after ``wall_seconds``:
        ``(exit code, timed out)``. An interruption kills it too."""
        try:
            timed_out = not _exited(self.process, wall_seconds)
        except BaseException:  # interrupted while waiting: the sandbox does not outlive the call
            self._end()
            raise
        if timed_out:
            _kill(self.process, self._info)
        return self.process.wait(), timed_out

    def result(self, code: int, timed_out: bool, seconds: float, limits: Limits) -> Result:
        oom_killed = self.group is not None and self.group.oom_kills() > 0
        stdout, cut_out = _read(self.out, limits.output_bytes)
        stderr, cut_err = _read(self.err, limits.output_bytes)
        return Result(exit_code=code, stdout=stdout, stderr=stderr, timed_out=timed_out, seconds=seconds,
                      truncated=cut_out or cut_err, degraded=tuple(sorted(self.degraded)),
                      refused=tuple(self.proxy.refusals) if self.proxy else (), oom_killed=oom_killed)

    def _end(self) -> None:
        if self.process.poll() is None:
            _kill(self.process, self._info)
            if self._reap_later:  # SIGKILLed: it runs nothing more; its exit is reaped off the caller's path
                threading.Thread(target=self.process.wait, name="cairn-sandbox-reap", daemon=True).start()
            else:
                self.process.wait()

    def kill(self) -> None:
        """SIGKILL every process of the sandbox now, without waiting for
        their exits (``cgroups.Group.kill``): a warm sandbox's command has
        reported its exit, and what it left running must not write to its
        streams while they are read."""
        _kill(self.process, self._info)
        if self.group is not None:
            self.group.kill()

    def _stop(self) -> None:
        assert self.group is not None
        if self._reap_later:
            self.group.kill()
        else:
            self.group.stop()

    def close(self, *, wait: bool = True) -> None:
        """Kill what is left of the sandbox and release all that was made
        for it; ``wait=False``: without waiting for its processes' exits
        (each is SIGKILLed, through the cgroup where there is one; bwrap is
        reaped by a thread of its own)."""
        self._reap_later = not wait
        self._cleanup.close()


def run(argv: Sequence[str], workspace: str | os.PathLike[str], policy: Policy | None = None, *,
        stdin: bytes | None = None, env: Mapping[str, str] | None = None, python: bool = False) -> Result:
    """Run ``argv`` in a sandbox whose only writable, lasting directory is
    ``workspace`` (at ``/workspace``, the working directory). ``env`` is
    added to a clean environment (nothing of this process's). Raises
    ``SandboxUnavailable`` if a required control is missing here.
    ``Policy(tier="gvisor")`` runs it under gVisor instead (``gvisor``)."""
    policy = policy or Policy()
    ws = check_command(argv, env, workspace)
    if policy.tier == "gvisor":
        return gvisor.run(argv, ws, policy, stdin=stdin, env=env)
    degraded = controls.require(policy, python=python or policy.egress is not None)
    sandbox = Sandbox(argv, ws, policy, degraded, env=env, stdin=stdin, egress=True)
    try:
        code, timed_out = sandbox.wait(policy.limits.wall_seconds)
        return sandbox.result(code, timed_out, time.perf_counter() - sandbox.started, policy.limits)
    finally:
        sandbox.close()


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def run_python(code: str, workspace: str | os.PathLike[str], policy: Policy | None = None, *,
               stdin: bytes | None = None, env: Mapping[str, str] | None = None) -> Result:
    """Run Python ``code`` in a sandbox (the system's ``python3``, isolated mode)."""
    if "\0" in code:
        raise InvalidArgument("sandboxed Python code may not contain NUL")
    return run([controls.SANDBOX_PYTHON, "-I", "-c", code], workspace, policy, stdin=stdin, env=env,
               python=True)


__all__ = ["Result", "Sandbox", "check_command", "run", "run_python"]
