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
import select
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from cairn.errors import InvalidArgument
from cairn.sandbox import bridge, bwrap, cgroups, controls, launcher, seccomp
from cairn.sandbox.egress import Proxy
from cairn.sandbox.policy import Policy

#: the whole environment of the launcher and bwrap (never this process's: see ``run``)
LAUNCH_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


@dataclass(frozen=True, slots=True)
class Result:
    """How a sandboxed command ended. ``exit_code`` is negative for a signal
    (``-9``: killed, as at the timeout); ``timed_out`` says the wall clock
    ended it; ``oom_killed`` that the kernel killed a process of it for
    going over ``Limits.memory_bytes`` (the command itself, or one of its
    children); outputs are cut at ``Limits.output_bytes`` (``truncated``);
    ``degraded`` names controls it ran without; ``refused`` lists the egress
    proxy's refusals."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float
    truncated: bool = False
    degraded: tuple[str, ...] = ()
    refused: tuple[str, ...] = field(default_factory=tuple)
    oom_killed: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"exit_code": self.exit_code, "stdout": self.stdout, "stderr": self.stderr,
                "timed_out": self.timed_out, "oom_killed": self.oom_killed, "seconds": round(self.seconds, 3),
                "truncated": self.truncated, "degraded": list(self.degraded), "refused": list(self.refused)}


def _memory_file(name: str) -> IO[bytes]:
    """An anonymous in-memory file for one of the command's standard
    streams: a file, not a pipe, so a command that writes much never blocks
    on a reader; in memory (``memfd``), since a temporary file on the
    worker's disk cost milliseconds a launch on a busy machine (the
    filesystem's journal). What the sandbox writes to it is charged to the
    sandbox's memory cgroup and capped by its ``file_bytes`` rlimit."""
    return open(os.memfd_create(f"cairn-sandbox-{name}", os.MFD_CLOEXEC), "w+b")


def _read(file: IO[bytes], limit: int) -> tuple[str, bool]:
    file.seek(0)
    data = file.read(limit + 1)
    return data[:limit].decode("utf-8", "replace"), len(data) > limit


def _exited(process: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait until the process exits or ``timeout`` passes; whether it exited.
    A pidfd wakes this thread the moment it exits: ``Popen.wait(timeout=)``
    polls with sleeps growing to 50 ms, which was most of a launch's cost."""
    try:
        fd = os.pidfd_open(process.pid)
    except OSError:  # a kernel before 5.3
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                if poller.poll(left * 1000):
                    return True
            except InterruptedError:
                continue
    finally:
        os.close(fd)


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


def run(argv: Sequence[str], workspace: str | os.PathLike[str], policy: Policy | None = None, *,
        stdin: bytes | None = None, env: Mapping[str, str] | None = None, python: bool = False) -> Result:
    """Run ``argv`` in a sandbox whose only writable, lasting directory is
    ``workspace`` (at ``/workspace``, the working directory). ``env`` is
    added to a clean environment (nothing of this process's). Raises
    ``SandboxUnavailable`` if a required control is missing here."""
    policy = policy or Policy()
    if not argv or not argv[0] or not all(isinstance(a, str) and "\0" not in a for a in argv):
        raise InvalidArgument("a sandbox command is a non-empty list of strings without NUL")
    for key, value in (env or {}).items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise InvalidArgument(f"bad sandbox environment variable {key!r}")
    ws = Path(workspace).absolute()
    if not ws.is_dir():
        raise InvalidArgument(f"sandbox workspace {str(ws)!r} is not a directory")
    needs_python = python or policy.egress is not None
    degraded = controls.require(policy, python=needs_python)
    with contextlib.ExitStack() as cleanup:  # whatever fails below, nothing made here outlives the call
        group = None
        if not {"processes", "memory"} <= degraded:
            group = cgroups.Group.make(
                pids_max=None if "processes" in degraded else policy.limits.processes,
                memory_max=None if "memory" in degraded else policy.limits.memory_bytes)
            cleanup.callback(group.remove)
            cleanup.callback(group.stop)  # runs first: nothing of the sandbox outlives the call
        proxy = None
        if policy.egress is not None:
            proxy = Proxy(policy.egress)
            cleanup.callback(proxy.close)
        command, extra_env = list(argv), dict(env or {})
        if proxy is not None:
            command = bridge.wrap(command, controls.SANDBOX_PYTHON)
            extra_env.update(bridge.PROXY_ENV)
        owned: list[int] = []  # descriptors still ours to close (each closed exactly once: a number
        cleanup.callback(_close_all, owned)  # closed twice could be another thread's file by then)
        filter_fd = None if "seccomp" in degraded else seccomp.filter_fd(unix_sockets=proxy is not None)
        if filter_fd is not None:
            owned.append(filter_fd)
        info_read, info_write = os.pipe()
        owned += [info_read, info_write]
        passed = [info_write] + ([filter_fd] if filter_fd is not None else [])
        spec = bwrap.Spec(workspace=str(ws), argv=command, env=extra_env,
                          tmp_bytes=policy.limits.tmp_bytes, seccomp_fd=filter_fd,
                          proxy_socket=proxy.path if proxy else None, info_fd=info_write)
        # the launcher joins the cgroups and sets the rlimits before it execs bwrap, so every process of
        # the sandbox is counted and limited
        joins = group.joins if group is not None else ()
        out, err, given = (cleanup.enter_context(_memory_file(n)) for n in ("stdout", "stderr", "stdin"))
        given.write(stdin or b"")
        given.seek(0)
        started = time.perf_counter()
        process = subprocess.Popen(
            launcher.command(joins, policy.limits, bwrap.command(spec)), stdin=given, stdout=out, stderr=err,
            # bwrap's init (the sandbox's pid 1) keeps the environment bwrap was given, and the
            # sandbox can read /proc/1/environ: give it nothing of this process's
            env=LAUNCH_ENV, pass_fds=passed, start_new_session=True)
        for fd in passed:  # the child has its copies
            owned.remove(fd)
            os.close(fd)
        try:
            timed_out = not _exited(process, policy.limits.wall_seconds)
        except BaseException:  # interrupted while waiting: the sandbox does not outlive the call
            _kill(process, info_read)
            process.wait()
            raise
        if timed_out:
            _kill(process, info_read)
        code = process.wait()
        seconds = time.perf_counter() - started
        oom_killed = group is not None and group.oom_kills() > 0
        stdout, cut_out = _read(out, policy.limits.output_bytes)
        stderr, cut_err = _read(err, policy.limits.output_bytes)
    return Result(exit_code=code, stdout=stdout, stderr=stderr, timed_out=timed_out, seconds=seconds,
                  truncated=cut_out or cut_err, degraded=tuple(sorted(degraded)),
                  refused=tuple(proxy.refusals) if proxy else (), oom_killed=oom_killed)


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


__all__ = ["Result", "run", "run_python"]
