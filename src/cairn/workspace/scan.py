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
if the file was last changed before the scan started, in an earlier tick of
the filesystem's own clock (git's "racy clean" rule): the scan reads that
clock from the timestamps of an unnamed file it creates in the directory
(``O_TMPFILE``: nothing appears in the directory), so a change after the
scan began gets a timestamp no older than that one. Where no such file can
be made, an entry is trusted only if its mtime is ``RACY_NS`` older than
the scan's start by the system clock. A file written just before a
snapshot is hashed again by the next one, which costs little and is never
wrong.

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
    #: the file was last changed before the scan that hashed it began, so ``key`` changes
    #: with any later change (the racy-clean rule, module doc)
    trusted: bool
    #: every object of ``parts`` is known to be stored (the ``known`` check, done once: a scan
    #: with a sink sets it; ``TreeCache.revoke`` clears it)
    stored: bool = False


#: a directory's entries as listed: ``(name, mode, inode, size, mtime_ns, ctime_ns)`` each
Sig = list[tuple[bytes, int, int, int, int, int]]


@dataclass(slots=True)
class _Memo:
    """One directory as a scan found it: each entry's ``(name, mode, inode,
    size, mtime, ctime)`` in listing order, its subdirectories' tree ids, its
    tree id and its files' cache entries. A later scan that lists the same
    ``sig`` and subdirectory ids has the same tree (when ``clean``: every
    file's entry was trusted and matched the listing)."""

    sig: Sig
    subdirs: dict[bytes, str]
    oid: str
    files: dict[bytes, Cached]
    links: int
    clean: bool
    #: its tree and every file's objects were stored (the scan had a sink)
    stored: bool


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
    #: what the last scan found in each directory (``_Memo``)
    memo: dict[bytes, _Memo] = field(default_factory=dict)

    def revoke(self, oids: set[str]) -> None:
        """Forget that ``oids`` are stored (a snapshot that stored them was
        never recorded, so nothing keeps them from the collector: the next
        scan sends them again if it needs them)."""
        if not oids:
            return
        self.known.difference_update(oids)
        for cached in self.files.values():
            if cached.stored and not oids.isdisjoint(cached.parts):
                cached.stored = False
        self.memo = {}

    def hit(self, rel: bytes, key: tuple[int, int, int, int], stored: bool) -> Cached | None:
        """The cached content of ``rel`` if its stat is ``key`` (and, when
        ``stored``, every object of it is known to be stored)."""
        found = self.files.get(rel)
        if found is None or found.key != key or not found.trusted:
            return None
        if stored and not found.stored:
            if not self.known.issuperset(found.parts):
                return None
            found.stored = True
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
    #: the ids of those objects
    sent: set[str] = field(default_factory=set)


def stat_key(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class _Walk:
    def __init__(self, cache: TreeCache, sink: Sink | None) -> None:
        self.cache = cache
        self.sink = sink
        self.seen: dict[bytes, Cached] = {}
        self.dirs: dict[bytes, str] = {}
        self.memo: dict[bytes, _Memo] = {}
        self.pending: dict[str, bytes] = {}
        self.pending_bytes = 0
        self.started = time.time_ns()
        #: the filesystem's clock at the start (``fs_clock``), if it can be read
        self.clock: int | None = None
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
        self.scan.sent.update(self.pending)
        self.scan.stored += len(self.pending)
        self.scan.stored_bytes += self.pending_bytes
        self.pending = {}
        self.pending_bytes = 0

    def directory(self, path: bytes, rel: bytes) -> str:
        try:
            with os.scandir(path) as found:
                items = list(found)
            stats = [item.stat(follow_symlinks=False) for item in items]
        except OSError as exc:
            raise WorkspaceError(f"cannot read workspace directory {_show(rel)}: {exc.strerror}") from None
        cache, stored = self.cache, self.sink is not None
        prefix = rel + b"/" if rel else b""
        # every entry's stat at once, compared with the last scan's in one step: a directory
        # whose entries all stat as they did (and were trusted then) needs no per-file work
        sig = [(item.name, st.st_mode, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
               for item, st in zip(items, stats, strict=True)]
        subdirs = {item.name: self.directory(item.path, prefix + item.name)
                   for item, st in zip(items, stats, strict=True) if S_ISDIR(st.st_mode)}
        memo = cache.memo.get(rel)
        if (memo is not None and memo.clean and memo.sig == sig and memo.subdirs == subdirs
                and (not stored or memo.stored)):
            self.seen.update(memo.files)
            self.scan.files += len(memo.files)
            self.scan.dirs += len(subdirs)
            self.scan.links += memo.links
            self.memo[rel] = memo
            oid = memo.oid
        else:
            oid = self.build(items, stats, rel, prefix, sig, subdirs)
        self.dirs[rel] = oid
        return oid

    def build(self, items: list[os.DirEntry[bytes]], stats: list[os.stat_result], rel: bytes, prefix: bytes,
              sig: Sig, subdirs: dict[bytes, str]) -> str:
        """A directory's tree id from its entries, one by one (a file through the stat cache)."""
        cache, seen, scan = self.cache, self.seen, self.scan
        files, stored = cache.files, self.sink is not None
        rows: list[list[object]] = []
        mine: dict[bytes, Cached] = {}
        clean, links = True, 0
        for item, st in zip(items, stats, strict=True):
            name = item.name
            child = prefix + name
            mode = st.st_mode
            if S_ISREG(mode):
                # the stat cache's hit, inlined (``TreeCache.hit``)
                cached = files.get(child)
                key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                if (cached is not None and cached.trusted and cached.key == key
                        and (not stored or cached.stored or cache.hit(child, key, True) is not None)):
                    seen[child] = mine[child] = cached
                    oid, size = cached.oid, st.st_size
                else:
                    oid, size, fresh = self.file(item.path, child)
                    if fresh is not None:
                        seen[child] = mine[child] = fresh
                    if fresh is None or not fresh.trusted or fresh.key != key:
                        clean = False  # racy, or changed since listed or while read: looked at again
                rows.append([name, FILE, mode & 0o777, size, oid])
                scan.files += 1
            elif S_ISDIR(mode):
                rows.append([name, DIR, mode & 0o777, 0, subdirs[name]])
                scan.dirs += 1
            elif S_ISLNK(mode):
                target = os.readlink(item.path)
                rows.append([name, LINK, 0o777, len(target), target])
                links += 1
            else:
                raise WorkspaceError(f"workspace entry {_show(child)} is a {_kind(mode)}: a snapshot holds "
                                     "files, directories and symlinks only")
        scan.links += links
        rows.sort()  # by name: names are unique, so no later field is ever compared
        data = encode_rows(rows)
        if len(data) > MAX_OBJECT:
            raise WorkspaceError(f"workspace directory {_show(rel)} has too many entries ({len(rows)})")
        oid = object_id(TREE, data)
        self.emit(oid, TREE, data)
        self.memo[rel] = _Memo(sig, subdirs, oid, mine, links, clean, stored)
        return oid

    def file(self, path: bytes, rel: bytes) -> tuple[str, int, Cached | None]:
        """Hash (and emit) one file: its content id, its size as read, and its
        cache entry (``None`` if it was written to while read)."""
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
        if key != stat_key(before) or size != after.st_size:  # written to while read
            return oid, size, None
        if self.clock is not None:
            trusted = max(after.st_mtime_ns, after.st_ctime_ns) < self.clock
        else:
            trusted = self.started - after.st_mtime_ns > RACY_NS
        return oid, size, Cached(key, oid, parts, trusted, stored=self.sink is not None)


def snapshot(path: str | bytes | os.PathLike[str], cache: TreeCache, sink: Sink | None) -> Scan:
    """Snapshot directory ``path``: its root tree's id and what was done.

    With a ``sink``, every object the store may lack (not in
    ``cache.known``) is handed to it, in batches, before this returns (so a
    root recorded after it names only stored objects); without one, only
    the ids are computed (a verification: nothing packed or sent)."""
    walk = _Walk(cache, sink)
    where = os.fsencode(path)
    walk.clock = fs_clock(where)
    walk.scan.root = walk.directory(where, b"")
    walk.flush()
    cache.files = walk.seen
    cache.dirs = walk.dirs
    cache.memo = walk.memo
    cache.root = walk.scan.root
    return walk.scan


def fs_clock(path: bytes) -> int | None:
    """The time by the clock of the filesystem holding directory ``path``:
    the mtime of an unnamed file created there now (``None`` where
    ``O_TMPFILE`` is not supported, or the directory is not writable)."""
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag:  # pragma: no cover - Linux has it
        return None
    try:
        fd = os.open(path, flag | os.O_WRONLY | getattr(os, "O_CLOEXEC", 0), 0o600)
    except OSError:
        return None
    try:
        return os.fstat(fd).st_mtime_ns
    finally:
        os.close(fd)


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


__all__ = ["RACY_NS", "Cached", "Scan", "Sink", "TreeCache", "fs_clock", "snapshot", "stat_key"]
