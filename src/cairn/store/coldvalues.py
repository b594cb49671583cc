"""The cold copy of a long-term memory item's value: its stored bytes,
compressed, and checked when they come back.

zlib (the standard library) rather than zstd: Python 3.11 has no zstd of its
own, and the ``zstandard`` package would be a compiled dependency for a path
that runs in a background pass (compression) and on reads of items nobody
used for ``cold_after`` (decompression, microseconds for the kilobytes an
inline value holds). On JSON values zstd would save a little more; the
``codec`` stored with each copy lets it come later without a migration of
the copies already cold.

The store compresses exactly the bytes it holds, never a decoded value: the
codec layer (``cairn.codec``) is where payloads would be encrypted, so with
encryption at rest the cold copy is of the ciphertext, and plaintext never
reaches the cold table.
"""

from __future__ import annotations

import zlib

from cairn.errors import PayloadError

#: The codec of new cold copies.
CODEC = "zlib"

#: Values shorter than this stay hot: a cold row (its keys, its index entry)
#: costs more than the bytes compression could save.
MIN_COLD_BYTES = 64

#: zlib's default trade-off; a higher level saves a few percent more on JSON
#: at several times the compression time.
_LEVEL = 6


def freeze(value: bytes) -> tuple[str, int, bytes]:
    """``(codec, size, compressed)``: the cold copy of ``value``."""
    return CODEC, len(value), zlib.compress(value, _LEVEL)


def thaw(codec: str, size: int, data: bytes | None, *, what: str) -> bytes:
    """The value a cold copy holds; ``PayloadError`` naming ``what`` when the
    copy is missing, of an unknown codec, or damaged (zlib checks an Adler-32
    of the bytes, and the size is checked too): never wrong bytes."""
    if data is None:
        raise PayloadError(f"cannot load {what}: it is cold and its cold copy is missing")
    if codec != CODEC:
        raise PayloadError(f"cannot load {what}: its cold copy has the unknown codec {codec!r}")
    try:
        value = zlib.decompress(data)
    except zlib.error as exc:
        raise PayloadError(f"cannot load {what}: its cold copy is damaged ({exc})") from None
    if len(value) != size:
        raise PayloadError(f"cannot load {what}: its cold copy is damaged ({len(value)} bytes, "
                           f"{size} expected)")
    return value


__all__ = ["CODEC", "MIN_COLD_BYTES", "freeze", "thaw"]
