"""Where a worker keeps runs' workspace directories, and its caches of them.

One ``Workspaces`` per process (``Runtime.workspaces``): each run's
directory is ``root/<32 hex digits>``, a hash of the tenant and run id (a
run id may hold ``/`` or any text: it never becomes a path), and each
directory has one ``TreeCache`` for as long as the process lives, so a
run claimed again on the same worker finds its tree verified by stat, not
re-read.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from pathlib import Path

from cairn.workspace.restore import _remove
from cairn.workspace.scan import TreeCache

#: the environment variable naming the directory of workspaces
ENV_ROOT = "CAIRN_WORKSPACES"


class Workspaces:
    """The workspace directories of one process."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self._root = Path(root) if root is not None else None
        self._caches: dict[Path, TreeCache] = {}
        self._lock = threading.Lock()

    @property
    def root(self) -> Path:
        """``root`` as given, else ``$CAIRN_WORKSPACES``, else ``./.cairn/workspaces``."""
        if self._root is None:
            self._root = Path(os.environ.get(ENV_ROOT) or Path(".cairn", "workspaces")).absolute()
        return self._root

    def path_for(self, tenant: str, run_id: str) -> Path:
        digest = hashlib.blake2b(f"{tenant}\0{run_id}".encode("utf-8", "surrogatepass"), digest_size=16)
        return self.root / digest.hexdigest()

    def forget(self, path: Path) -> None:
        """Delete a run's directory and its cache (its run has ended). A
        failure to delete is left for later: the run's end is committed."""
        with self._lock:
            self._caches.pop(path, None)
        with contextlib.suppress(OSError):
            _remove_tree(path)

    def cache_for(self, path: Path) -> TreeCache:
        with self._lock:
            cache = self._caches.get(path)
            if cache is None:
                cache = self._caches[path] = TreeCache()
            return cache


def _remove_tree(path: Path) -> None:
    """Remove ``path`` and everything in it, read-only directories too,
    never following a symlink (``restore``'s removal, from its parent)."""
    parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _remove(parent, os.fsencode(path.name), os.lstat(path))
    finally:
        os.close(parent)


__all__ = ["ENV_ROOT", "Workspaces"]
