"""The sandbox's process limit: a ``pids`` cgroup of its own.

``RLIMIT_NPROC`` cannot do it: bwrap runs as this process's user, and for
root (the sandbox's processes are root's outside their user namespace,
though they have no capability there) the kernel does not enforce it. A
``pids`` cgroup counts every task in it, however it was made, so a fork
bomb stops at ``pids.max``. Both hierarchies are handled: cgroup v1 (a
``pids`` hierarchy) and v2 (the unified one, where this process's cgroup
must have ``pids`` delegated to its children). Where neither can be used,
``available`` says why and the ``processes`` control is missing.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def _own(hierarchy: str) -> str | None:
    """This process's cgroup path in a hierarchy (``pids`` for v1, ``""`` for v2)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if (hierarchy in controllers.split(",")) if hierarchy else controllers == "":
            return path
    return None


def parent() -> Path | None:
    """The directory under which a sandbox's cgroup is made, or ``None``."""
    v1 = _own("pids")
    if v1 is not None and (ROOT / "pids").is_dir():
        base = ROOT / "pids" / v1.lstrip("/")
        if os.access(base, os.W_OK):
            return base
    v2 = _own("")
    if v2 is not None and (ROOT / "cgroup.controllers").is_file():
        base = ROOT / v2.lstrip("/")
        with contextlib.suppress(OSError):
            if "pids" in (base / "cgroup.subtree_control").read_text().split() and os.access(base, os.W_OK):
                return base
    return None


def available() -> str | None:
    """Why no pids cgroup can be made here, or ``None`` (made and removed once)."""
    base = parent()
    if base is None:
        return "no writable pids cgroup (cgroup v1 'pids' hierarchy, or v2 with pids delegated)"
    try:
        group = Group.make(2)
    except OSError as exc:
        return f"cannot make a pids cgroup under {base}: {exc}"
    group.remove()
    return None


class Group:
    """One sandbox's cgroup: ``procs`` is the file a process joins by
    writing its pid (the launcher writes ``$$`` before exec'ing bwrap)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.procs = str(path / "cgroup.procs")

    @classmethod
    def make(cls, max_pids: int) -> Group:
        base = parent()
        if base is None:
            raise OSError("no writable pids cgroup")
        path = base / f"cairn-sandbox-{uuid.uuid4().hex}"
        path.mkdir()
        try:
            (path / "pids.max").write_text(str(max_pids))
        except OSError:
            path.rmdir()
            raise
        return cls(path)

    def remove(self) -> None:
        """Remove the cgroup, now if its tasks are gone, else from a thread
        once they are (the kernel reaps a killed PID namespace
        asynchronously; the caller does not wait for it)."""
        if not self._try_remove():
            threading.Thread(target=self._reap, name="cairn-sandbox-cgroup", daemon=True).start()

    def _try_remove(self) -> bool:
        try:
            self.path.rmdir()
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True

    def _reap(self, wait: float = 10.0) -> None:
        deadline = time.monotonic() + wait
        while not self._try_remove() and time.monotonic() < deadline:
            time.sleep(0.01)


__all__ = ["Group", "available", "parent"]
