"""A per-user cache, on disk, of what the code hash parses out of source.

Why: a bundle's code hash (``bundles.code_hash``) covers what a workflow
reaches, and a fresh worker computing it tokenizes and parses the source of
every function, class and module-level binding reached, then dumps their
syntax trees. A resume in a new process paid that before its first step
(issue 21). What such a dump is depends only on the source text and where
in it the object is, so it is kept here, keyed by a SHA-256 of the text
itself (the lines ``linecache`` holds, which are what ``inspect`` reads),
never by a file's size, mtime or inode: an edit that keeps all three (a
rewrite in place within the clock's granularity) changes the key. What
the walk reads at run time (constants by value, closures, defaults) is
never cached: it is walked again in every process, so the hash stays
exactly the one computed without this cache.

Where: ``$XDG_CACHE_HOME/cairn/code/<python>/`` (``~/.cache/cairn/...``
without it), one JSON file per entry: ``{"key", "value", "check"}``, the
check being a SHA-256 of key and value. The key also covers the Python
version (``ast.dump`` and ``tokenize`` differ between them), Cairn's
version and the size and mtime of the modules that make the dumps (a
changed Cairn cannot reuse an old dump). ``CAIRN_CODE_CACHE=off`` switches
it off; the directory can be deleted at any time.

Pruning: an entry's mtime says when it was last used (a hit refreshes it,
at most once a day), and an entry unused for ``RETAIN_DAYS`` is deleted.
The sweep runs after a process writes an entry (a miss: new code), at most
once a day per directory (the ``.swept`` marker's mtime), so a steady
deployment never lists the directory and a cache left to code that keeps
changing stays the size of the code used in the last month.

Trust: an entry is read only if it is a regular file (not a symlink) owned
by this process's user and writable by nobody else, holds JSON of the
expected shape, names its key and passes its check; anything else (garbage,
another user's file, a read-only or missing directory, a failed write) is a
miss, computed again, never an error. A user's own cache is trusted as the
user's own code is: whoever can write it can edit the code too.
"""

from __future__ import annotations

import contextlib
import hashlib
import linecache
import os
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

#: bumped when what an entry holds changes shape
CACHE_FORMAT = 1
#: an entry no process has used for this long is deleted by the next sweep
RETAIN_DAYS = 30
_DAY = 86400.0

_lock = threading.Lock()
#: per source file: the ``linecache`` lines last hashed (held, so their id is never reused) and their digest
_digests: dict[str, tuple[list[str], str]] = {}
_stamp: str | None = None
#: entries this process read or made, by key (a new app in the same process walks again)
_memo: dict[str, str] = {}


class _Entry(msgspec.Struct, forbid_unknown_fields=True):
    key: str
    value: str
    check: str


_DECODER = msgspec.json.Decoder(_Entry)
_ENCODER = msgspec.json.Encoder()


def entry_check(key: str, value: str) -> str:
    """The check an entry holds: what tells a whole entry from a damaged one."""
    return hashlib.sha256(f"{key}\x00{value}".encode()).hexdigest()


def enabled() -> bool:
    return os.environ.get("CAIRN_CODE_CACHE", "").strip().lower() not in {"off", "0", "no", "false"}


def directory() -> Path:
    """Where entries live: per user, per Python version."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cairn" / "code" / sys.implementation.cache_tag


def cached(kind: str, file: str | None, module_globals: dict[str, Any] | None, where: str,
           compute: Callable[[], str]) -> str:
    """``compute()`` (a value derived from the source of ``file`` as
    ``linecache`` holds it, at ``where`` in it), from the cache when an
    entry for this very source is there. ``compute`` raising is passed on
    (nothing is cached)."""
    if file is None or not enabled():
        return compute()
    digest = _digest(file, module_globals, refresh=True)
    if digest is None:
        return compute()
    # ``compute`` reads the file through linecache itself: keep it only if it read what was hashed
    return _lookup(_key(kind, f"{digest}\x00{where}"), compute,
                   lambda: _digest(file, module_globals, refresh=False) == digest)


def keyed(kind: str, material: str, compute: Callable[[], str]) -> str:
    """``compute()``, a value that is a function of ``material`` alone (a
    canonical form of some bytecode), from the cache when it is there."""
    if not enabled():
        return compute()
    return _lookup(_key(kind, material), compute, lambda: True)


def _key(kind: str, material: str) -> str:
    return hashlib.sha256(f"{_engine_stamp()}\x00{kind}\x00{material}".encode("utf-8", "surrogatepass")
                          ).hexdigest()


def _lookup(key: str, compute: Callable[[], str], keep: Callable[[], bool]) -> str:
    """The value of ``key``: this process's, else the disk's, else
    ``compute()``'s (written to disk if ``keep()`` says it is still true)."""
    with _lock:
        hit = _memo.get(key)
    if hit is not None:
        return hit
    path = directory() / f"{key}.json"
    hit = _read(path, key)
    if hit is None:
        hit = compute()
        if not keep():
            return hit
        _write(path, key, hit)
        sweep(path.parent)
    with _lock:
        _memo[key] = hit
    return hit


def _digest(file: str, module_globals: dict[str, Any] | None, *, refresh: bool) -> str | None:
    """SHA-256 of ``file``'s lines as ``inspect`` would read them (after
    ``linecache.checkcache`` when ``refresh``, as ``inspect`` does), hashed
    once per process per version of the lines."""
    if refresh:
        linecache.checkcache(file)
    lines = linecache.getlines(file, module_globals)
    if not lines:
        return None
    with _lock:
        known = _digests.get(file)
        if known is not None and known[0] is lines:
            return known[1]
    digest = hashlib.sha256("".join(lines).encode("utf-8", "surrogatepass")).hexdigest()
    with _lock:
        _digests[file] = (lines, digest)
    return digest


def _engine_stamp() -> str:
    """What the dumps' makers are: Python's version, Cairn's, and the size
    and mtime of the modules that make them (an edited Cairn, same version)."""
    global _stamp
    if _stamp is None:
        parts = [f"format={CACHE_FORMAT}", sys.version,
                 str(getattr(sys.modules.get("cairn"), "__version__", ""))]
        for name in ("cairn.engine.bundles", __name__):
            source = getattr(sys.modules.get(name), "__file__", None)
            try:
                st = os.stat(source) if source else None
            except OSError:
                st = None
            parts.append(f"{name}:{st.st_size}:{st.st_mtime_ns}" if st else f"{name}:?")
        _stamp = "\x00".join(parts)
    return _stamp


def _read(path: Path, key: str) -> str | None:
    """The entry's value, or ``None`` for anything not a whole, trusted entry."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return None
        if st.st_size > 64 * 1024 * 1024:
            return None
        if st.st_mtime < time.time() - _DAY:
            with contextlib.suppress(OSError):
                os.utime(fd)  # used: the sweep keeps it
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read()
        entry = _DECODER.decode(raw)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError, ValueError):
        return None
    finally:
        os.close(fd)
    if entry.key != key or entry.check != entry_check(key, entry.value):
        return None
    return entry.value


def _write(path: Path, key: str, value: str) -> None:
    """Store the entry atomically (a temporary file renamed over it);
    any failure leaves the cache as it was."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".entry-", suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_ENCODER.encode(_Entry(key=key, value=value, check=entry_check(key, value))))
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)


def sweep(folder: Path, *, now: float | None = None) -> int:
    """Delete the entries of ``folder`` unused for ``RETAIN_DAYS``, unless
    a sweep ran there in the last day; return how many were deleted. Only
    this user's regular ``*.json`` and stale ``.entry-*.tmp`` files are
    touched; any failure leaves the rest as it was."""
    now = time.time() if now is None else now
    marker = folder / ".swept"
    try:
        if marker.stat().st_mtime > now - _DAY:
            return 0
    except OSError:
        pass
    try:
        marker.touch()
        os.utime(marker, (now, now))
        listing = list(os.scandir(folder))
    except OSError:
        return 0
    cutoff = now - RETAIN_DAYS * _DAY
    removed = 0
    for item in listing:
        if not (item.name.endswith(".json") or item.name.startswith(".entry-")):
            continue
        try:
            st = item.stat(follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mtime >= cutoff:
                continue
            os.unlink(item.path)
        except OSError:
            continue
        removed += 1
    return removed
