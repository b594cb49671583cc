"""The objects of a workspace tree, as stored: ids, compression and the
checks that make a stored object safe to materialize.

Three kinds of object, each identified by the BLAKE2b-256 of its kind byte
and its plain bytes (so the id says nothing of how it is compressed, and
the same file in two snapshots of one tenant is one object):

* ``b`` a blob: a file's bytes, or one ``CHUNK``-sized piece of a larger file;
* ``c`` a chunk list: the ids of a large file's blobs, in order;
* ``t`` a tree: one directory's entries, sorted by name (msgpack).

A tree entry is ``[name, kind, mode, size, ref]``: ``name`` the raw bytes of
one path component (any bytes a POSIX file name may hold, so non-UTF-8
names survive), ``kind`` ``f`` (file), ``d`` (directory) or ``l`` (symlink),
``mode`` the permission bits (``0o777``: set-id and sticky bits are not
kept), ``size`` the file's length, and ``ref`` the id of its blob, chunk
list or tree, or a symlink's target (kept as a symlink, never followed).

A stored object is one codec byte (``z`` zstd, ``d`` zlib, ``n`` none)
and its compressed bytes. Reading one checks everything a hostile or
damaged row could get wrong before a byte of it reaches a disk: it must
hash to its id, and a tree's names must be single components (no ``/``,
``.``, ``..`` or NUL: neither ``../`` nor an absolute path can be
spelled), its entries sorted and unique, its kinds, modes and refs well
formed (``UnsafeSnapshot`` otherwise).
"""

from __future__ import annotations

import hashlib
import threading
import zlib
from typing import Any

import msgspec

from cairn.errors import UnsafeSnapshot, WorkspaceError

_zstd: Any
try:  # the workspace extra: faster than zlib at a better ratio
    import zstandard as _zstd
except ImportError:  # pragma: no cover - the extra is installed in CI
    _zstd = None

#: bytes of an object id (BLAKE2b-256)
ID_SIZE = 32
#: files larger than this are stored as a chunk list of blobs this large
CHUNK = 1 << 20
#: the largest object a reader inflates (a tree of a directory of ~500,000
#: entries, a chunk list of a 2 TiB file); a larger one is refused
MAX_OBJECT = 64 << 20
#: the longest symlink target a snapshot accepts (Linux's PATH_MAX)
MAX_TARGET = 4096
#: the longest file name (Linux's NAME_MAX)
MAX_NAME = 255

BLOB, CHUNKS, TREE = b"b", b"c", b"t"
FILE, DIR, LINK = "f", "d", "l"

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder()
#: one compressor and decompressor per thread: zstandard's are not thread-safe, and snapshots and
#: restores run in several threads at once (the parallel branches of a graph super-step): one
#: shared compressor wrote corrupt objects (tests/workspace/test_branches.py, PostgreSQL)
_ZSTD_LOCAL = threading.local()


def _zstd_c() -> Any:
    compressor = getattr(_ZSTD_LOCAL, "c", None)
    if compressor is None:
        compressor = _ZSTD_LOCAL.c = _zstd.ZstdCompressor(level=3)
    return compressor


def _zstd_d() -> Any:
    decompressor = getattr(_ZSTD_LOCAL, "d", None)
    if decompressor is None:
        decompressor = _ZSTD_LOCAL.d = _zstd.ZstdDecompressor()
    return decompressor
#: objects below this size are stored uncompressed (a header would outweigh the gain)
_TINY = 64


def object_id(kind: bytes, data: bytes) -> str:
    """The id (hex) of the object of ``kind`` with plain bytes ``data``."""
    h = hashlib.blake2b(kind, digest_size=ID_SIZE)
    h.update(data)
    return h.hexdigest()


def pack(kind: bytes, data: bytes) -> bytes:
    """The stored form of an object: a codec byte, then its kind and bytes,
    compressed when that makes them smaller."""
    plain = kind + data
    if len(plain) >= _TINY:
        packed = _zstd_c().compress(plain) if _zstd is not None else zlib.compress(plain, 6)
        if len(packed) + 1 < len(plain):
            return (b"z" if _zstd is not None else b"d") + packed
    return b"n" + plain


def unpack(oid: str, stored: bytes) -> tuple[bytes, bytes]:
    """``(kind, data)`` of the stored object ``oid``; ``UnsafeSnapshot`` if
    it cannot be read or does not hash to ``oid`` (damaged, or another
    object's bytes under this id)."""
    codec, body = stored[:1], stored[1:]
    if codec == b"n":
        plain = body
    elif codec == b"z":
        if _zstd is None:
            raise WorkspaceError(f"workspace object {oid} is zstd-compressed: install cairn-runtime"
                                 "[workspace] (zstandard)")
        try:
            declared = _zstd.frame_content_size(body)
            if 0 <= declared <= MAX_OBJECT:  # one shot: zstd refuses output beyond the declared size
                plain = _zstd_d().decompress(body)
            else:  # undeclared, or a bomb's claim: streamed and bounded, never allocated
                with _zstd_d().stream_reader(body) as reader:
                    plain = reader.read(MAX_OBJECT + 1)
        except Exception as exc:  # zstandard.ZstdError: damaged
            raise UnsafeSnapshot(f"workspace object {oid} cannot be decompressed: {exc}") from None
        if len(plain) > MAX_OBJECT:
            raise UnsafeSnapshot(f"workspace object {oid} inflates beyond the largest object")
    elif codec == b"d":
        inflater = zlib.decompressobj()
        try:
            plain = inflater.decompress(body, MAX_OBJECT + 1)
        except zlib.error as exc:
            raise UnsafeSnapshot(f"workspace object {oid} cannot be decompressed: {exc}") from None
        if inflater.unconsumed_tail or len(plain) > MAX_OBJECT:
            raise UnsafeSnapshot(f"workspace object {oid} inflates beyond the largest object")
    else:
        raise UnsafeSnapshot(f"workspace object {oid} has an unknown codec {codec!r}")
    kind, data = plain[:1], plain[1:]
    if object_id(kind, data) != oid:
        raise UnsafeSnapshot(f"workspace object {oid} is damaged: its bytes no longer hash to its id")
    return kind, data


class Entry(msgspec.Struct, array_like=True, frozen=True):
    """One entry of a directory: see the module doc. A msgspec struct: a
    tree decodes straight into these (``decode_tree``), types checked by the
    decoder (``ref`` is checked there too: msgspec takes no ``str | bytes``)."""

    name: bytes
    kind: str
    mode: int
    size: int
    ref: Any  # str: an object id (hex) for files and directories; bytes: the target of a symlink

    @property
    def text(self) -> str:
        """The name as text (undecodable bytes as surrogates, like ``os.fsdecode``)."""
        return self.name.decode("utf-8", "surrogateescape")


def encode_tree(entries: list[Entry]) -> bytes:
    """A tree's plain bytes; ``entries`` sorted by name."""
    return _ENCODER.encode(entries)


def encode_rows(rows: list[list[object]]) -> bytes:
    """``encode_tree`` of rows ``[name, kind, mode, size, ref]`` sorted by name
    (a scan builds rows, not ``Entry`` objects: it makes one per file)."""
    return _ENCODER.encode(rows)


_ENTRIES = msgspec.msgpack.Decoder(list[Entry])
_HEX = frozenset("0123456789abcdef")
_NOT_NAMES = frozenset({b"", b".", b".."})


def decode_tree(oid: str, data: bytes) -> list[Entry]:
    """The entries of tree ``oid``, each checked (``UnsafeSnapshot``).

    Every tree a restore, diff or collection reads passes here, so the
    checks run over whole columns at C speed (joins, sets, min/max); only a
    tree that fails one is walked entry by entry, for the message."""
    try:
        entries = _ENTRIES.decode(data)
    except msgspec.DecodeError as exc:  # a ValidationError too (an entry of the wrong shape or types)
        raise UnsafeSnapshot(f"workspace tree {oid} is not a list of [name, kind, mode, size, ref] entries: "
                             f"{exc}") from None
    if entries and not _columns_ok(entries):
        _check_each(f"workspace tree {oid}", entries)
    return entries


def _columns_ok(entries: list[Entry]) -> bool:
    names = [e.name for e in entries]
    joined = b"/".join(names)
    if (joined.count(b"/") != len(names) - 1 or b"\0" in joined or not _NOT_NAMES.isdisjoint(names)
            or max(map(len, names)) > MAX_NAME or names != sorted(set(names))):
        return False
    modes = [e.mode for e in entries]
    if min(modes) < 0 or max(modes) > 0o777 or min(e.size for e in entries) < 0:
        return False
    ids = [e.ref for e in entries if e.kind == FILE or e.kind == DIR]
    targets = [e.ref for e in entries if e.kind == LINK]
    if len(ids) + len(targets) != len(entries):
        return False  # an unknown kind
    try:
        hexes, links = "".join(ids), b"".join(targets)  # TypeError: a ref of the wrong type
    except TypeError:
        return False
    return (len(hexes) == 2 * ID_SIZE * len(ids) and set(map(len, ids)) <= {2 * ID_SIZE}
            and _HEX.issuperset(hexes) and (not targets or (min(map(len, targets)) > 0
                                                           and max(map(len, targets)) <= MAX_TARGET
                                                           and b"\0" not in links)))


def _check_each(where: str, entries: list[Entry]) -> None:
    """Raise ``UnsafeSnapshot`` naming the first bad entry."""
    previous: bytes | None = None
    for e in entries:
        name, kind, ref = e.name, e.kind, e.ref
        check_name(name, where)
        if not 0 <= e.mode <= 0o777 or e.size < 0:
            raise UnsafeSnapshot(f"{where}: entry {name!r} has a bad mode or size")
        if kind in (FILE, DIR):
            if type(ref) is not str or len(ref) != 2 * ID_SIZE or not _HEX.issuperset(ref):
                raise UnsafeSnapshot(f"{where}: entry {name!r} does not name an object")
        elif kind == LINK:
            if type(ref) is not bytes or not ref or b"\0" in ref or len(ref) > MAX_TARGET:
                raise UnsafeSnapshot(f"{where}: symlink {name!r} has a bad target")
        else:
            raise UnsafeSnapshot(f"{where}: entry {name!r} has an unknown kind {kind!r}")
        if previous is not None and name <= previous:
            raise UnsafeSnapshot(f"{where}: entries are not sorted and unique at {_text(name)!r}")
        previous = name
    raise UnsafeSnapshot(f"{where}: a malformed entry")  # pragma: no cover - the columns said so


def _text(name: bytes) -> str:
    return name.decode("utf-8", "surrogateescape")


def check_name(name: bytes, where: str) -> None:
    """Refuse anything but one path component (no ``/``, ``.``, ``..``, NUL)."""
    if not name or name in (b".", b"..") or b"/" in name or b"\0" in name or len(name) > MAX_NAME:
        raise UnsafeSnapshot(f"{where}: {name!r} is not a single file name (a path with '/' or '..', an "
                             "absolute path, or an empty or overlong name is refused)")


def split_chunks(oid: str, data: bytes) -> list[str]:
    """The blob ids of chunk list ``oid``."""
    if len(data) % ID_SIZE:
        raise UnsafeSnapshot(f"workspace chunk list {oid} is not a list of ids")
    return [data[i:i + ID_SIZE].hex() for i in range(0, len(data), ID_SIZE)]


def join_chunks(oids: list[str]) -> bytes:
    return b"".join(bytes.fromhex(o) for o in oids)


__all__ = [
    "BLOB", "CHUNK", "CHUNKS", "DIR", "FILE", "ID_SIZE", "LINK", "TREE", "Entry", "check_name", "decode_tree",
    "encode_rows", "encode_tree", "join_chunks", "object_id", "pack", "split_chunks", "unpack",
]
