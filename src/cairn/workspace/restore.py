"""Make a directory exactly a stored snapshot, writing through nothing.

Two passes. The plan reads the disk (``lstat`` only) against the snapshot's
trees and fetches the contents of the files it cannot keep, in batches; a
file is kept when it is a regular file whose stat and content id match the
``TreeCache`` (its mode is fixed if it differs). The apply pass works
through directory file descriptors, each opened with ``O_NOFOLLOW``: it
removes what the snapshot does not hold, removes a file it must rewrite
(whatever it is: a symlink, or a hard link to a file elsewhere) and creates
it anew with ``O_EXCL`` (never into anything that exists), creates symlinks
as symlinks, and sets each directory's mode after filling it. No path of
the snapshot is ever resolved through a symlink on disk, whether the
symlink came from the snapshot or from a step (a symlink to ``/etc/passwd``
is restored as that symlink; a file of the same name is written beside
it, never into ``/etc/passwd``). Every object is checked on read
(``workspace.trees``), and the whole snapshot's trees are loaded and
checked before the disk is touched.

A crash midway leaves a directory that is neither snapshot (perhaps with a
file removed or partly written): the next restore makes it exact.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

from cairn.errors import WorkspaceError
from cairn.workspace.objects import DIR, FILE, LINK, Entry
from cairn.workspace.scan import Cached, TreeCache, stat_key
from cairn.workspace.trees import Objects, Source

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


@dataclass(slots=True)
class Restored:
    """What a restore did."""

    root: str
    written: int = 0
    written_bytes: int = 0
    kept: int = 0
    removed: int = 0


def restore(
    path: str | bytes | os.PathLike[str], root: str, source: Source, cache: TreeCache, *,
    trust_cache: bool = False,
) -> Restored:
    """Make directory ``path`` (created if absent, never followed if a
    symlink) exactly snapshot ``root``; update ``cache`` to what was written.

    ``trust_cache``: the directory is exactly ``cache.root`` now (a scan just
    said so), so a subdirectory whose tree id is the one the cache recorded
    for it is left unvisited: a warm restore touches only what differs."""
    known_dirs = cache.dirs if trust_cache and cache.root is not None else {}
    objects = Objects(source, root)
    # every tree checked before anything is written, but those already on disk (a tree with
    # such an id holds what a scan of this disk found: it needs no check)
    trees = objects.load_all(skip=set(known_dirs.values()) - {root})
    where = os.fsencode(path)
    os.makedirs(where, mode=0o700, exist_ok=True)
    try:
        top = os.open(where, _DIR_FLAGS)
    except OSError as exc:
        raise WorkspaceError(f"cannot open workspace {os.fsdecode(where)!r}: {exc.strerror}") from None
    done = Restored(root)
    seen: dict[bytes, Cached] = dict(cache.files) if known_dirs else {}
    dirs: dict[bytes, str] = dict(known_dirs)
    work = _Work(trees, objects, cache, seen, dirs, known_dirs, done)
    try:
        if known_dirs.get(b"") != root:
            work.stored = _prefetch(objects, where, root, trees, cache, known_dirs)
            _apply(top, root, b"", work)
    finally:
        os.close(top)
    dirs[b""] = root
    cache.files = seen
    cache.dirs = dirs
    cache.root = root
    cache.known.update(trees)  # what a snapshot reads is stored: a scan need not send it again
    cache.known.update(work.contents)
    return done


@dataclass(slots=True)
class _Work:
    trees: dict[str, list[Entry]]
    objects: Objects
    cache: TreeCache
    seen: dict[bytes, Cached]
    dirs: dict[bytes, str]
    known_dirs: dict[bytes, str]
    done: Restored
    stored: dict[str, bytes] = field(default_factory=dict)
    #: the content ids of the files this restore kept or wrote (stored: the snapshot holds them)
    contents: list[str] = field(default_factory=list)


def _prefetch(objects: Objects, where: bytes, root: str, trees: dict[str, list[Entry]],
              cache: TreeCache, known_dirs: dict[bytes, str]) -> dict[str, bytes]:
    """The stored contents of every file the disk does not already hold."""
    trusted = bool(known_dirs)
    wanted: list[str] = []
    stack = [(root, b"", True)]
    while stack:
        oid, rel, present = stack.pop()
        for e in objects.tree(oid) if oid not in trees else trees[oid]:
            child = rel + b"/" + e.name if rel else e.name
            if e.kind == DIR:
                if known_dirs.get(child) != e.ref:  # a directory absent from the cache holds nothing kept
                    stack.append((str(e.ref), child, present and child in cache.dirs))
            elif e.kind == FILE and not (present and _kept(where + b"/" + child, child, e, cache, trusted)):
                wanted.append(str(e.ref))
    return objects.fetch(wanted) if wanted else {}  # a large file's chunks come with it (``content``)


def _kept(full: bytes, rel: bytes, entry: Entry, cache: TreeCache, trusted: bool) -> bool:
    """The file at ``full`` likely holds ``entry``'s content already (``_apply``
    decides; a wrong guess costs a fetch there). ``trusted``: a scan just
    stat'd every file, so its cache entry says so without another ``lstat``."""
    if trusted:
        cached = cache.files.get(rel)
        return cached is not None and cached.trusted and cached.oid == entry.ref
    try:
        st = os.lstat(full)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode):
        return False
    cached = cache.hit(rel, stat_key(st), stored=False)
    return cached is not None and cached.oid == entry.ref


def _apply(dfd: int, oid: str, rel: bytes, work: _Work, *, empty: bool = False) -> None:
    target = work.trees[oid] if oid in work.trees else work.objects.tree(oid)
    done, seen, cache = work.done, work.seen, work.cache
    names = {e.name for e in target}
    present: dict[bytes, os.stat_result] = {}
    if not empty:  # a directory this restore just made has nothing to look at
        with os.scandir(dfd) as found:
            present = {os.fsencode(item.name): item.stat(follow_symlinks=False) for item in found}
    prefix = rel + b"/" if rel else b""
    for name, gone in present.items():
        if name not in names:
            _remove(dfd, name, gone)
            _forget(work, prefix + name, gone)
            done.removed += 1
    for e in target:
        child = prefix + e.name
        st = present.get(e.name)
        if e.kind == DIR:
            if st is not None and not stat.S_ISDIR(st.st_mode):
                _remove(dfd, e.name, st)
                _forget(work, child, st)
                st = None
            if st is not None and work.known_dirs.get(child) == e.ref:  # unchanged since the scan
                if stat.S_IMODE(st.st_mode) != e.mode:
                    sub = os.open(e.name, _DIR_FLAGS, dir_fd=dfd)
                    try:
                        os.fchmod(sub, e.mode)
                    finally:
                        os.close(sub)
                continue
            if st is None:
                os.mkdir(e.name, 0o700, dir_fd=dfd)
            sub = os.open(e.name, _DIR_FLAGS, dir_fd=dfd)
            try:
                if st is None or st.st_mode & 0o700 != 0o700:
                    os.fchmod(sub, 0o700)  # writable while it is filled
                _apply(sub, str(e.ref), child, work, empty=st is None)
                os.fchmod(sub, e.mode)
            finally:
                os.close(sub)
            work.dirs[child] = str(e.ref)
        elif e.kind == LINK:
            assert isinstance(e.ref, bytes)
            if st is not None and stat.S_ISLNK(st.st_mode) and os.readlink(e.name, dir_fd=dfd) == e.ref:
                done.kept += 1
                continue
            if st is not None:
                _remove(dfd, e.name, st)
                _forget(work, child, st)
            os.symlink(e.ref, e.name, dir_fd=dfd)
            done.written += 1
        else:
            work.contents.append(str(e.ref))
            regular = st if st is not None and stat.S_ISREG(st.st_mode) else None
            cached = cache.hit(child, stat_key(regular), stored=False) if regular is not None else None
            if regular is not None and cached is not None and cached.oid == e.ref:
                if stat.S_IMODE(regular.st_mode) == e.mode:
                    seen[child] = cached
                    done.kept += 1
                    continue
                fd = os.open(e.name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
                try:
                    os.fchmod(fd, e.mode)  # the chmod changes its ctime: stat it again below
                finally:
                    os.close(fd)
            else:
                if st is not None:
                    # removed, then made anew: never written into (a hard link's other names keep
                    # their bytes), and no rename over a file (which ext4 flushes synchronously)
                    _remove(dfd, e.name, st)
                    _forget(work, child, st)
                # a crash leaves a file the next restore rewrites: its stat matches no cache entry
                after = _write_new(dfd, e, work.objects, work.stored, done)
                seen[child] = Cached(stat_key(after), str(e.ref), (), trusted=False)
                continue
            after = os.stat(e.name, dir_fd=dfd, follow_symlinks=False)
            seen[child] = Cached(stat_key(after), str(e.ref), (), trusted=False)


def _forget(work: _Work, rel: bytes, st: os.stat_result) -> None:
    """``rel`` (whose stat was ``st``) is gone from disk: so are the cache
    entries of it and, if it was a directory, below it."""
    work.seen.pop(rel, None)
    work.dirs.pop(rel, None)
    if work.known_dirs and stat.S_ISDIR(st.st_mode):
        below = rel + b"/"
        for table in (work.seen, work.dirs):
            for key in [k for k in table if k.startswith(below)]:
                del table[key]


def _write_new(dfd: int, e: Entry, objects: Objects, stored: dict[str, bytes], done: Restored
               ) -> os.stat_result:
    """Create ``e`` where nothing is (``O_EXCL``: never over anything, never
    through a symlink); its stat once written."""
    fd = os.open(e.name, _NEW_FILE, 0o600, dir_fd=dfd)
    try:
        for chunk in objects.content(e, stored):
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
            done.written_bytes += len(chunk)
        os.fchmod(fd, e.mode)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    done.written += 1
    return after


def _remove(dfd: int, name: bytes, st: os.stat_result) -> None:
    """Remove ``name`` (a whole directory, never following a symlink in it)."""
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dfd)
        return
    sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
    try:
        os.fchmod(sub, 0o700)
        with os.scandir(sub) as found:
            inside = [(os.fsencode(item.name), item.stat(follow_symlinks=False)) for item in found]
        for child, child_st in inside:
            _remove(sub, child, child_st)
    finally:
        os.close(sub)
    os.rmdir(name, dir_fd=dfd)


__all__ = ["Restored", "restore"]
