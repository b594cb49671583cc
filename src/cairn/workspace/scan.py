"""Snapshot a directory into tree objects (``workspace.objects``).

A scan walks the directory without following any symlink (``lstat`` and
``O_NOFOLLOW``), hashes each regular file it cannot vouch for, and hands the
objects the store may not have yet to a sink in batches. What makes a scan
of a large, mostly unchanged workspace cheap is the ``TreeCache``: for each
path the ``(inode, size, mtime, ctime)`` it had when last hashed (or
written by a restore) and the object ids it hashed to, plus the ids known to
be stored. A file whose stat matches is not read again; a changed file
always changes its ctime, which no user code can set back.

A file modified within the filesystem's timestamp granularity of the scan
that hashed it could keep all four fields; so a cache entry is trusted only
if the file's mtime was at least ``RACY_NS`` before that scan started
(git's "racy clean" rule): a file written just before a snapshot is hashed
again by the next one, which costs little and is never wrong.

Kept: regular files (content and permission bits), directories (empty ones
too), symlinks (as symlinks, whatever they point to). Refused with
``WorkspaceError``: sockets, FIFOs and devices. Not kept: owners,
timestamps, set-id and sticky bits, extended attributes, hard links (each
name is a file of its own; identical contents are one object).
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from stat import S_ISDIR, S_ISLNK, S_ISREG

from cairn.errors import WorkspaceError
from cairn.workspace.objects import (
    BLOB,
    CHUNK,
    CHUNKS,
    DIR,
    FILE,
    LINK,
    MAX_OBJECT,
    TREE,
    encode_rows,
    join_chunks,
    object_id,
    pack,
)

#: a file whose mtime is this close to the scan that hashed it is hashed again next time
RACY_NS = 2_000_000_000
#: a scan hands objects to its sink once this many stored bytes are pending
BATCH_BYTES = 8 << 20

#: receives ``{object id: stored bytes}``; returns once they are durable
Sink = Callable[[dict[str, bytes]], None]

_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


@dataclass(slots=True)
class Cached:
    """What a path held when last hashed or written: its stat ``key``, the
    object id of its content and every object that content needs."""

    key: tuple[int, int, int, int]
    oid: str
    parts: tuple[str, ...]
    #: the file's mtime was old enough, at that time, to trust ``key`` (RACY_NS)
    trusted: bool


@dataclass(slots=True)
class TreeCache:
    """One workspace directory's stat cache and the object ids known to be
    in its tenant's store (a cache is per directory, and so per tenant)."""

    files: dict[bytes, Cached] = field(default_factory=dict)
    known: set[str] = field(default_factory=set)
    #: the root of the last scan or restore of this directory
    root: str | None = None
    #: the tree id of each directory (``b""``: the root) at that scan or restore
    dirs: dict[bytes, str] = field(default_factory=dict)

    def hit(self, rel: bytes, key: tuple[int, int, int, int], stored: bool) -> Cached | None:
        """The cached content of ``rel`` if its stat is ``key`` (and, when
        ``stored``, every object of it is known to be stored)."""
        found = self.files.get(rel)
        if found is None or found.key != key or not found.trusted:
            return None
        if stored and not self.known.issuperset(found.parts):
            return None
        return found


@dataclass(slots=True)
class Scan:
    """What a snapshot found and did."""

    root: str
    files: int = 0
    dirs: int = 0
    links: int = 0
    #: bytes of files read and hashed (not vouched for by the cache)
    hashed: int = 0
    #: objects handed to the sink, and their stored bytes
    stored: int = 0
    stored_bytes: int = 0


def stat_key(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class _Walk:
    def __init__(self, cache: TreeCache, sink: Sink | None) -> None:
        self.cache = cache
        self.sink = sink
        self.seen: dict[bytes, Cached] = {}
        self.dirs: dict[bytes, str] = {}
        self.pending: dict[str, bytes] = {}
        self.pending_bytes = 0
        self.started = time.time_ns()
        self.scan = Scan(root="")

    def emit(self, oid: str, kind: bytes, data: bytes) -> None:
        if self.sink is None or oid in self.cache.known or oid in self.pending:
            return
        stored = pack(kind, data)
        self.pending[oid] = stored
        self.pending_bytes += len(stored)
        if self.pending_bytes >= BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        if not self.pending or self.sink is None:
            return
        self.sink(self.pending)
        self.cache.known.update(self.pending)
        self.scan.stored += len(self.pending)
        self.scan.stored_bytes += self.pending_bytes
        self.pending = {}
        self.pending_bytes = 0

    def directory(self, path: bytes, rel: bytes) -> str:
        rows: list[list[object]] = []
        try:
            with os.scandir(path) as found:
                items = list(found)
        except OSError as exc:
            raise WorkspaceError(f"cannot read workspace directory {_show(rel)}: {exc.strerror}") from None
        cache, seen, scan = self.cache, self.seen, self.scan
        files, trusted, stored = cache.files, cache.known, self.sink is not None
        prefix = rel + b"/" if rel else b""
        for item in items:
            name = item.name
            child = prefix + name
            st = item.stat(follow_symlinks=False)
            mode = st.st_mode
            if S_ISREG(mode):
                # the stat cache's hit, inlined (``TreeCache.hit``): this runs once per file
                cached = files.get(child)
                if (cached is not None and cached.trusted and cached.key == (st.st_ino, st.st_size,
                                                                            st.st_mtime_ns, st.st_ctime_ns)
                        and (not stored or trusted.issuperset(cached.parts))):
                    seen[child] = cached
                    oid, size = cached.oid, st.st_size
                else:
                    oid, size = self.file(item.path, child, st)
                rows.append([name, FILE, mode & 0o777, size, oid])
                scan.files += 1
            elif S_ISDIR(mode):
                rows.append([name, DIR, mode & 0o777, 0, self.directory(item.path, child)])
                scan.dirs += 1
            elif S_ISLNK(mode):
                target = os.readlink(item.path)
                rows.append([name, LINK, 0o777, len(target), target])
                scan.links += 1
            else:
                raise WorkspaceError(f"workspace entry {_show(child)} is a {_kind(mode)}: a snapshot holds "
                                     "files, directories and symlinks only")
        rows.sort(key=_name)
        data = encode_rows(rows)
        if len(data) > MAX_OBJECT:
            raise WorkspaceError(f"workspace directory {_show(rel)} has too many entries ({len(rows)})")
        oid = object_id(TREE, data)
        self.emit(oid, TREE, data)
        self.dirs[rel] = oid
        return oid

    def file(self, path: bytes, rel: bytes, st: os.stat_result) -> tuple[str, int]:
        cached = self.cache.hit(rel, stat_key(st), self.sink is not None)
        if cached is not None:
            self.seen[rel] = cached
            return cached.oid, st.st_size
        try:
            fd = os.open(path, _OPEN_FILE)
        except OSError as exc:
            raise WorkspaceError(f"cannot read workspace file {_show(rel)}: {exc.strerror}") from None
        try:
            before = os.fstat(fd)
            chunks: list[str] = []
            size = 0
            while True:
                data = os.read(fd, CHUNK)
                if not data and chunks:
                    break
                oid = object_id(BLOB, data)
                self.emit(oid, BLOB, data)
                chunks.append(oid)
                size += len(data)
                if len(data) < CHUNK:
                    break
            after = os.fstat(fd)
        finally:
            os.close(fd)
        self.scan.hashed += size
        parts: tuple[str, ...]
        if len(chunks) == 1:
            oid, parts = chunks[0], (chunks[0],)
        else:
            listing = join_chunks(chunks)
            oid = object_id(CHUNKS, listing)
            self.emit(oid, CHUNKS, listing)
            parts = (*chunks, oid)
        key = stat_key(after)
        if key == stat_key(before) and size == after.st_size:  # not written to while read
            self.seen[rel] = Cached(key, oid, parts, self.started - after.st_mtime_ns > RACY_NS)
        return oid, size


def snapshot(path: str | bytes | os.PathLike[str], cache: TreeCache, sink: Sink | None) -> Scan:
    """Snapshot directory ``path``: its root tree's id and what was done.

    With a ``sink``, every object the store may lack (not in
    ``cache.known``) is handed to it, in batches, before this returns (so a
    root recorded after it names only stored objects); without one, only
    the ids are computed (a verification: nothing packed or sent)."""
    walk = _Walk(cache, sink)
    walk.scan.root = walk.directory(os.fsencode(path), b"")
    walk.flush()
    cache.files = walk.seen
    cache.dirs = walk.dirs
    cache.root = walk.scan.root
    return walk.scan


def _name(row: list[object]) -> bytes:
    name = row[0]
    assert isinstance(name, bytes)
    return name


def _show(rel: bytes) -> str:
    return repr(os.fsdecode(rel) or ".")


def _kind(mode: int) -> str:
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "special file"


__all__ = ["RACY_NS", "Cached", "Scan", "Sink", "TreeCache", "snapshot", "stat_key"]
