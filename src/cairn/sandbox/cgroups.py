"""The sandbox's cgroups: a process limit (``pids``) and a memory limit
(``memory``) over every process of one sandbox.

Why cgroups: ``RLIMIT_NPROC`` cannot limit processes (bwrap runs as this
process's user, and for root the kernel does not enforce it), and
``RLIMIT_AS`` bounds one process's address space, not the sandbox's total
(``processes x memory_bytes``). A cgroup counts every task and every
charged page in it, however they were made.

Both hierarchies are handled: cgroup v1 (a ``pids`` and a ``memory``
hierarchy, one directory in each) and v2 (one directory, both controllers
delegated to this process's cgroup). Where a controller cannot be used,
``available`` says why and its control is missing.

Launch cost. The launcher joins the sandbox's cgroups itself, writing
``0`` (itself) to v1's ``tasks``: the kernel moves that one thread without
the global ``cgroup_threadgroup_rwsem``, whose write side waits for an RCU
grace period (``$$`` into ``cgroup.procs`` took it: ~11 ms a launch on a
loaded machine). Making and removing a directory is tens of microseconds;
a removal the kernel is not ready for (the sandbox's tasks still being
reaped) is retried off the caller's path.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
#: every sandbox cgroup's name starts with this, then the making process's pid
PREFIX = "cairn-sandbox-"
#: the kernel's task flag of a task that has begun to exit (include/linux/sched.h)
PF_EXITING = 0x4
#: a leftover (its maker dead) is removed once it is older than this, never one just made
STALE_SECONDS = 60.0


def _own(controller: str) -> str | None:
    """This process's cgroup path in a hierarchy (a v1 controller's name, ``""`` for v2)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if (controller in controllers.split(",")) if controller else controllers == "":
            return path
    return None


@dataclass(frozen=True, slots=True)
class Place:
    """Where one controller's sandbox cgroups are made: ``parent`` (this
    process's own cgroup in that hierarchy) and whether it is v2."""

    controller: str
    parent: Path
    v2: bool

    @property
    def join(self) -> str:
        """The file a process writes ``0`` to, to move itself in: v1's
        ``tasks`` moves just the writer (no global lock); v2 has only
        ``cgroup.procs``."""
        return "cgroup.procs" if self.v2 else "tasks"


def place(controller: str) -> Place | None:
    """Where sandbox cgroups of ``controller`` (``pids``, ``memory``) are made, or ``None``."""
    v1 = _own(controller)
    if v1 is not None and (ROOT / controller).is_dir():
        base = ROOT / controller / v1.lstrip("/")
        if os.access(base, os.W_OK):
            return Place(controller, base, v2=False)
    v2 = _own("")
    if v2 is not None and (ROOT / "cgroup.controllers").is_file():
        base = ROOT / v2.lstrip("/")
        with contextlib.suppress(OSError):
            delegated = (base / "cgroup.subtree_control").read_text().split()
            if controller in delegated and os.access(base, os.W_OK):
                return Place(controller, base, v2=True)
    return None


def available(controller: str) -> str | None:
    """Why no ``controller`` cgroup can be made here, or ``None`` (one is made and removed)."""
    if place(controller) is None:
        return (f"no writable {controller} cgroup (cgroup v1 '{controller}' hierarchy, or v2 with "
                f"{controller} delegated to this process's cgroup)")
    try:
        group = Group.make(pids_max=2) if controller == "pids" else Group.make(memory_max=64 << 20)
    except OSError as exc:
        return f"cannot make a {controller} cgroup: {exc}"
    group.remove()
    return None


@functools.lru_cache(maxsize=8)
def _swept(parent: Path) -> bool:
    """Remove, once per process and parent, the sandbox cgroups a dead
    process left behind (a SIGKILLed worker cannot remove its own). Only
    empty ones go (``rmdir`` refuses the others) and only old ones (never
    one another process is about to join)."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(parent):
            if not entry.name.startswith(PREFIX) or not entry.is_dir(follow_symlinks=False):
                continue
            maker = entry.name[len(PREFIX):].split("-", 1)[0]
            if not maker.isdigit() or _alive(int(maker)):
                continue
            with contextlib.suppress(OSError):
                if time.time() - entry.stat(follow_symlinks=False).st_mtime > STALE_SECONDS:
                    os.rmdir(entry.path)
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


class Group:
    """One sandbox's cgroups: a directory per hierarchy (one on v2). The
    launcher writes ``0`` to each of ``joins`` before it execs bwrap, so
    every process of the sandbox is in them."""

    def __init__(self, paths: Sequence[Path], joins: Sequence[str], memory: Path | None, v2: bool) -> None:
        self.paths = tuple(paths)
        self.joins = tuple(joins)
        self._memory = memory
        self._v2 = v2

    @classmethod
    def make(cls, *, pids_max: int | None = None, memory_max: int | None = None) -> Group:
        """A group limiting what is not ``None``: ``pids.max`` tasks and
        ``memory_max`` bytes (RAM and swap alike: swap would otherwise
        extend it)."""
        wanted = {c: v for c, v in (("pids", pids_max), ("memory", memory_max)) if v is not None}
        places = {c: place(c) for c in wanted}
        missing = [c for c, p in places.items() if p is None]
        if missing:
            raise OSError(f"no writable {' or '.join(missing)} cgroup")
        name = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:16]}"
        made: list[Path] = []
        joins: list[str] = []
        memory: Path | None = None
        v2 = False
        try:
            for controller, value in wanted.items():
                where = places[controller]
                assert where is not None
                _swept(where.parent)
                path = where.parent / name
                v2 = where.v2
                if path not in made:  # v2: one directory holds both controllers
                    path.mkdir()
                    made.append(path)
                    joins.append(str(path / where.join))
                if controller == "pids":
                    (path / "pids.max").write_text(str(value))
                else:
                    memory = path
                    _limit_memory(path, int(value), v2=where.v2)
        except BaseException:
            for path in reversed(made):
                with contextlib.suppress(OSError):
                    path.rmdir()
            raise
        return cls(made, joins, memory, v2)

    def oom_kills(self) -> int:
        """How many processes the kernel killed for going over the memory limit."""
        if self._memory is None:
            return 0
        name = "memory.events" if self._v2 else "memory.oom_control"
        with contextlib.suppress(OSError, ValueError):
            for line in (self._memory / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def stop(self, wait: float = 5.0) -> bool:
        """SIGKILL every task still in the group and wait (up to ``wait``
        seconds) until none is left; whether none is. The sandbox's PID
        namespace normally ends them all when its init dies, but only once
        bwrap has started it: a caller interrupted during bwrap's setup
        kills bwrap before the init's pid is known, and the init then dies
        only through its parent-death signal, later. The cgroup holds every
        process of the sandbox from the launcher on, so this is the one
        place that knows them all. On the usual path (the command exited,
        its namespace ended) the group holds at most bwrap's own helper on
        its way out: a task already exiting runs no more user code, so it
        is not waited for (that wait was a millisecond or more a launch)."""
        deadline = time.monotonic() + wait
        while True:
            tasks = {pid for pid in self._tasks() if not exiting(pid)}
            if not tasks:
                return True
            if time.monotonic() > deadline:
                return False
            for pid in tasks:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.001)

    def kill(self) -> None:
        """SIGKILL every task in the group, without waiting for them to
        exit: a task with SIGKILL pending never returns to user space (one
        running on another CPU is interrupted for it), so none of them runs
        another instruction of its own. For a caller that has its result
        already (a warm sandbox's command reported its exit) and must not
        wait for the kernel to schedule the rest's exits."""
        for pid in self._tasks():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def _tasks(self) -> set[int]:
        found: set[int] = set()
        for join in self.joins:
            # the procs file beside the join file lists every process of the group
            with contextlib.suppress(OSError, ValueError):
                found.update(int(line) for line in (Path(join).parent / "cgroup.procs").read_text().split())
        return found

    def remove(self) -> None:
        """Remove the directories, now if their tasks are gone, else from a
        thread once they are (the kernel reaps a killed PID namespace
        asynchronously; the caller does not wait for it). Not a daemon
        thread: a process that ends right after its last sandbox waits the
        few milliseconds (at most ``_reap``'s bound) rather than leave the
        directories behind (seen: pytest workers exiting left one each)."""
        left = [path for path in self.paths if not _try_remove(path)]
        if left:
            threading.Thread(target=_reap, args=(left,), name="cairn-sandbox-cgroup", daemon=False).start()


def exiting(pid: int) -> bool:
    """Whether ``pid`` is gone or on its way out: the kernel's
    ``PF_EXITING`` flag (``/proc/PID/stat``'s ninth field) is set once a
    task starts to exit, after which it never returns to user space."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces and ')'
    return fields[0] in ("Z", "X") or bool(int(fields[6]) & PF_EXITING)


def _limit_memory(path: Path, limit: int, *, v2: bool) -> None:
    if v2:
        (path / "memory.max").write_text(str(limit))
        swap = path / "memory.swap.max"
        if swap.exists():
            swap.write_text("0")
        return
    (path / "memory.limit_in_bytes").write_text(str(limit))
    memsw = path / "memory.memsw.limit_in_bytes"  # present with swap accounting; must be >= the limit
    if memsw.exists():
        memsw.write_text(str(limit))


def _try_remove(path: Path) -> bool:
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _reap(paths: list[Path], wait: float = 10.0) -> None:
    deadline = time.monotonic() + wait
    while paths and time.monotonic() < deadline:
        paths = [path for path in paths if not _try_remove(path)]
        if paths:
            time.sleep(0.01)


__all__ = ["PREFIX", "Group", "Place", "available", "exiting", "place"]
