"""Warm sandboxes: launched ahead of their command, so a command's launch
is a pipe write.

Most of a sandbox's launch is the same whatever the command (the cgroups,
the launcher, bwrap's namespaces and mounts, the seccomp filter); only the
workspace, the limits and the command differ. A ``Pool`` launches
sandboxes ahead, each for one workspace and one set of limits, with a stub
as their command: a Python interpreter (the system's, isolated) inside the
finished sandbox, under its filter and limits, blocked reading a pipe. A
command is handed over by writing it (argv and environment) to that pipe;
the stub starts it and reports its exit code the moment it ends. So a
pooled sandbox is a cold one whose command started later:

* one sandbox, one command: once handed over it leaves the pool, and it
  ends when its command does (its PID namespace, cgroups and streams with
  it), as a cold one;
* one workspace: a sandbox is launched for a workspace, bound at launch as
  a cold sandbox's is, and only a command whose workspace path names that
  same directory now (same device and inode: the bound inode is pinned by
  the mount, so no other directory has it) is handed to it: a directory
  that replaced the workspace at its path is never served by the old bind;
* nothing outlives the worker: every pooled sandbox is bwrap's
  ``--die-with-parent`` child of the pool's own thread, which lives as
  long as the pool (the kernel's parent-death signal follows the thread
  that started a process, not the process), so a SIGKILLed worker takes
  its pooled sandboxes with it; ``close`` (and this process's exit) kills
  those still waiting.

The pool refills the workspace it served after each command (the next
command of a run usually comes from the same workspace): the first
command of a workspace is cold, the next ones are warm. ``prepare``
launches ahead explicitly. Egress sandboxes are always cold (their proxy
and relay are per command). Differences from a cold launch: the stub is
one more process of the sandbox (``Limits.processes``), its start-up CPU
time (tens of ms) counts against ``Limits.cpu_seconds``, and a sandbox
waits with its stub's memory (~10 MB) charged to its own cgroup.
docs/sandbox.md has the threat model's side of it.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import queue
import select
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cairn.errors import InvalidArgument
from cairn.sandbox import controls
from cairn.sandbox.controls import SandboxUnavailable
from cairn.sandbox.policy import Policy
from cairn.sandbox.runner import Result, Sandbox, check_command, run

#: the stub: says it is ready (the workspace's device and inode, as bound), reads its command to the
#: end of the pipe (a pipe closed empty, the sandbox discarded, ends it), starts the command, and
#: reports its exit code on the status pipe the moment it ends, then exits with it (as bwrap would:
#: 128+N for a signal; a command that cannot be started is bwrap's message and exit code 1, so a
#: recorded result never depends on the launch being warm). The status pipe is the stub's alone: the
#: command inherits its standard streams only
STUB = """
import json, os, signal, sys
ctl, ready, status = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
os.set_inheritable(status, False)
st = os.stat("/workspace")
os.write(ready, json.dumps([st.st_dev, st.st_ino]).encode())
os.close(ready)
data = b""
while True:
    chunk = os.read(ctl, 1 << 16)
    if not chunk:
        break
    data += chunk
os.close(ctl)
if not data:
    os._exit(0)
argv, env = json.loads(data)
pid = os.fork()
if pid == 0:
    # the signals Python ignores at its default again, as under bwrap (an ignored signal stays so
    # across exec: a writer to a closed pipe, or over the file size limit, must die of it)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        os.write(2, f"bwrap: execvp {argv[0]}: {exc.strerror}\\n".encode())  # as a cold launch says it
    os._exit(1)
code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
code = code if code >= 0 else 128 - code
os.write(status, str(code).encode())
os._exit(code)
"""
#: how long a launch may take to be ready before it is given up
READY_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class Key:
    """What a pooled sandbox was launched for: its workspace (path, device,
    inode) and what of its policy is fixed at launch."""

    workspace: str
    device: int
    inode: int
    limits: tuple[int, ...]
    allow_degraded: frozenset[str]


def _key(ws: Path, policy: Policy) -> Key:
    st = os.stat(ws)
    lim = policy.limits
    return Key(str(ws), st.st_dev, st.st_ino,
               (lim.processes, lim.memory_bytes, lim.file_bytes, lim.cpu_seconds, lim.open_files,
                lim.tmp_bytes),
               frozenset(policy.allow_degraded))


class Warm:
    """One sandbox launched ahead, its stub ready (or failed)."""

    def __init__(self, key: Key, policy: Policy) -> None:
        self.key = key
        degraded = controls.require(policy, python=True)  # the stub is the sandbox's Python
        ctl_read, self._ctl = os.pipe()
        ready_read, ready_write = os.pipe()
        self.status, status_write = os.pipe()
        theirs = (ctl_read, ready_write, status_write)
        try:
            stub = [controls.SANDBOX_PYTHON, "-I", "-S", "-c", STUB, *map(str, theirs),
                    key.workspace]  # the last: what `ps` shows of whose sandbox it is
            self.sandbox = Sandbox(stub, Path(key.workspace), policy, degraded, pass_fds=theirs)
        except BaseException:
            for fd in (self._ctl, ready_read, self.status):
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        try:
            self.bound = _ready(ready_read, READY_SECONDS)
        finally:
            os.close(ready_read)
        if self.bound != (key.device, key.inode):
            why = self._failure()
            self.discard()
            raise OSError(f"sandbox for {key.workspace} did not start: {why}")

    def _failure(self) -> str:
        if self.sandbox.process.poll() is None:
            return "not ready in time" if self.bound is None else "another directory was bound"
        self.sandbox.err.seek(0)
        return self.sandbox.err.read(500).decode("utf-8", "replace").strip() or "exited"

    def hand_over(self, argv: Sequence[str], env: Mapping[str, str], stdin: bytes | None) -> bool:
        """Start ``argv`` in this sandbox; whether it started (the stub was
        still waiting). Either way the sandbox is no longer the pool's."""
        self.sandbox.give_stdin(stdin)
        payload = json.dumps([list(argv), env]).encode()
        try:
            view = memoryview(payload)
            while view:  # blocks while the stub has not read a pipe's worth: it is reading
                view = view[os.write(self._ctl, view):]
        except OSError:  # the stub is gone (killed): nothing was started
            return False
        finally:
            os.close(self._ctl)
            self._ctl = -1
        self.sandbox.started = time.perf_counter()
        return True

    def wait(self, wall_seconds: float) -> tuple[int, bool]:
        """As ``Sandbox.wait``, but done the moment the stub reports the
        command's exit code: what is left of the sandbox then (the stub on
        its way out, bwrap's init, anything the command left running) is
        SIGKILLed (``Sandbox.kill``) without being waited for. A
        sandbox that ends without a report (its stub killed) gives bwrap's
        exit code."""
        process = self.sandbox.process
        try:
            fd = os.pidfd_open(process.pid)
        except OSError:
            return self.sandbox.wait(wall_seconds)
        try:
            poller = select.poll()
            poller.register(self.status, select.POLLIN)
            poller.register(fd, select.POLLIN)
            deadline = time.monotonic() + wall_seconds
            while (left := deadline - time.monotonic()) > 0:
                try:
                    events = dict(poller.poll(left * 1000))
                except InterruptedError:
                    continue
                except BaseException:  # interrupted: the sandbox does not outlive the call (its
                    self.discard(wait=True)  # processes' exits waited for, as a cold one's)
                    raise
                if self.status in events:
                    report = os.read(self.status, 32)
                    if report.strip().isdigit():
                        return int(report), False
                    poller.unregister(self.status)  # closed without a report: bwrap's code says
                elif fd in events:
                    break
        finally:
            os.close(fd)
        return self.sandbox.wait(max(deadline - time.monotonic(), 0.001))

    def discard(self, *, wait: bool = False) -> None:
        """End the sandbox (``Sandbox.close``)."""
        if self._ctl >= 0:
            os.close(self._ctl)  # an empty pipe: the stub exits
            self._ctl = -1
        if self.status >= 0:
            os.close(self.status)
            self.status = -1
        self.sandbox.close(wait=wait)


def _ready(fd: int, timeout: float) -> tuple[int, int] | None:
    """The (device, inode) the stub reports, or ``None`` if none came in ``timeout``."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    if not poller.poll(timeout * 1000):
        return None
    try:
        dev, ino = json.loads(os.read(fd, 256) or b"null")
        return int(dev), int(ino)
    except (TypeError, ValueError):
        return None


class Pool:
    """Sandboxes launched ahead (see the module doc): ``run`` and
    ``run_python`` as ``cairn.sandbox``'s, each command in a sandbox of its
    own, warm when one is ready for its workspace. At most ``per_key``
    ready per workspace and policy, ``size`` in all (the least recently
    used workspace's go first). ``refill``: launch the next sandbox of a
    workspace when one is used (else only ``prepare`` launches)."""

    def __init__(self, size: int = 4, *, per_key: int = 1, refill: bool = True) -> None:
        if not isinstance(size, int) or size < 1 or not isinstance(per_key, int) or per_key < 1:
            raise InvalidArgument("a sandbox pool's size and per_key are positive integers")
        self.size, self.per_key, self.refill = size, per_key, refill
        self._ready: dict[Key, list[Warm]] = {}  # least recently used first
        self._lock = threading.Lock()
        self._wanted: queue.SimpleQueue[tuple[Key, Policy, threading.Event] | None] = queue.SimpleQueue()
        self._closed = False
        self.warm_runs = self.cold_runs = 0
        #: why the last launch ahead failed, if it did (the pool then runs cold)
        self.last_failure: str | None = None
        # the one thread that starts pooled sandboxes: their parent-death signal is tied to it
        self._thread = threading.Thread(target=self._fill, name="cairn-sandbox-pool", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def prepare(self, workspace: str | os.PathLike[str], policy: Policy | None = None, *,
                wait: bool = True) -> None:
        """Launch a sandbox ahead for ``workspace`` and ``policy`` (if
        fewer than ``per_key`` are ready); with ``wait``, return once it is."""
        policy = policy or Policy()
        ws = Path(workspace).absolute()
        if not ws.is_dir():
            raise InvalidArgument(f"sandbox workspace {str(ws)!r} is not a directory")
        if policy.egress is not None:
            return
        done = threading.Event()
        self._wanted.put((_key(ws, policy), policy, done))
        if wait:
            done.wait()

    def run(self, argv: Sequence[str], workspace: str | os.PathLike[str], policy: Policy | None = None, *,
            stdin: bytes | None = None, env: Mapping[str, str] | None = None, python: bool = False) -> Result:
        """As ``cairn.sandbox.run``; ``Result.warm`` says whether a pooled sandbox ran it."""
        policy = policy or Policy()
        ws = check_command(argv, env, workspace)
        if policy.egress is not None:
            return run(argv, ws, policy, stdin=stdin, env=env, python=python)
        controls.require(policy, python=python)
        key = _key(ws, policy)
        try:
            return self._run(key, argv, ws, policy, stdin, env, python)
        finally:
            if self.refill:  # the workspace's next command is warm; launched once this one is done, so
                # the launch does not compete with the command for the CPU (a run's commands come in turn)
                self._wanted.put((key, policy, threading.Event()))

    def _run(self, key: Key, argv: Sequence[str], ws: Path, policy: Policy, stdin: bytes | None,
             env: Mapping[str, str] | None, python: bool) -> Result:
        warm = self._take(key)
        if warm is None or not warm.hand_over(argv, {**_base_env(), **(env or {})}, stdin):
            if warm is not None:
                warm.discard()
            self.cold_runs += 1
            return run(argv, ws, policy, stdin=stdin, env=env, python=python)
        self.warm_runs += 1
        sandbox = warm.sandbox
        try:
            code, timed_out = warm.wait(policy.limits.wall_seconds)
            sandbox.kill()  # the streams are read once nothing of the sandbox can write to them
            result = sandbox.result(code, timed_out, time.perf_counter() - sandbox.started, policy.limits)
        finally:
            warm.discard()
        return dataclasses.replace(result, warm=True)

    def run_python(self, code: str, workspace: str | os.PathLike[str], policy: Policy | None = None, *,
                   stdin: bytes | None = None, env: Mapping[str, str] | None = None) -> Result:
        if "\0" in code:
            raise InvalidArgument("sandboxed Python code may not contain NUL")
        return self.run([controls.SANDBOX_PYTHON, "-I", "-c", code], workspace, policy, stdin=stdin, env=env,
                        python=True)

    def ready(self) -> int:
        """How many sandboxes are ready."""
        with self._lock:
            return sum(len(v) for v in self._ready.values())

    def _take(self, key: Key) -> Warm | None:
        with self._lock:
            found = self._ready.pop(key, [])
            warm = found.pop(0) if found else None
            if found:
                self._ready[key] = found  # most recently used: last
        # the key holds the workspace's device and inode as the caller's path names them now, and
        # the bound directory's inode cannot be another's while the sandbox's mount holds it: a
        # directory that replaced it at the same path has another key
        return warm

    def _fill(self) -> None:
        while True:
            wanted = self._wanted.get()
            if wanted is None:
                return
            key, policy, done = wanted
            try:
                with self._lock:
                    enough = self._closed or len(self._ready.get(key, ())) >= self.per_key
                if not enough and _still(key):
                    self._add(Warm(key, policy))
            except (OSError, SandboxUnavailable) as exc:  # the pool runs cold; run() says why if it must
                self.last_failure = str(exc)
            finally:
                done.set()

    def _add(self, warm: Warm) -> None:
        evicted: list[Warm] = []
        with self._lock:
            if self._closed:
                evicted.append(warm)
            else:
                self._ready.setdefault(warm.key, []).append(warm)
                while sum(len(v) for v in self._ready.values()) > self.size:
                    oldest = next(iter(self._ready))
                    evicted.append(self._ready[oldest].pop(0))
                    if not self._ready[oldest]:
                        del self._ready[oldest]
        for old in evicted:
            old.discard()

    def discard(self, workspace: str | os.PathLike[str]) -> None:
        """End the sandboxes ready for ``workspace`` (its run is over)."""
        ws = str(Path(workspace).absolute())
        with self._lock:
            gone = [k for k in self._ready if k.workspace == ws]
            ended = [w for k in gone for w in self._ready.pop(k)]
        for warm in ended:
            warm.discard()

    def close(self) -> None:
        """End every ready sandbox and the pool's thread."""
        with self._lock:
            self._closed = True
            ended = [w for ws in self._ready.values() for w in ws]
            self._ready.clear()
        for warm in ended:
            with contextlib.suppress(OSError):
                warm.discard()
        self._wanted.put(None)
        atexit.unregister(self.close)


def _still(key: Key) -> bool:
    """Whether ``key``'s path is still the directory it was (never a
    replacement at the same path: its inode differs while the bound one
    lives, as a mount holds it)."""
    try:
        st = os.stat(key.workspace)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (key.device, key.inode)


def _base_env() -> dict[str, str]:
    from cairn.sandbox.bwrap import BASE_ENV

    return dict(BASE_ENV)


__all__ = ["STUB", "Pool"]
