"""Envelopes: AES-256-GCM ciphertext bound to the place it is stored at.

An envelope is the bytes stored in place of a value when encryption at rest
is on (``cairn.store.sealed``)::

    magic 0xCE | version 1 | algorithm 1 (AES-256-GCM) | flags
    | key version (4 bytes, big endian) | tenant tag (4 bytes)
    | nonce (12 random bytes) | ciphertext + 16-byte tag

The header (everything before the nonce) is authenticated with the
ciphertext, and so is the ``Place``: tenant, run, table, position/key and
kind (the column). A row copied to another tenant, run, table, position or
column therefore fails to open, and the error names the place it was read
at. The key version names which of the tenant's data keys sealed it
(rotation, ``cairn keys``); the tenant tag (4 bytes of BLAKE2b of the
tenant) lets a reader say "sealed for another tenant" without a decryption
attempt, and is authenticated too.

Nonces are 96 random bits per envelope (``os.urandom``): NIST SP 800-38D
allows 2**32 random-nonce encryptions under one key; a data key is per
tenant and per version, and rotation bounds its use. They are drawn from
``os.urandom`` 64 at a time (``take_nonce``, ``fresh_nonce``): each is
handed out once, by ``list.pop``, atomic under the interpreter's lock, and a
forked child empties the pool it inherited before it seals anything, so it
never reuses its parent's.

``flags`` bit 0: the plaintext was zlib-compressed before sealing (large
JSON compresses well; ciphertext does not, so it is compressed first). Any
zlib stream opens (``zlib.decompress`` reads the window size from its
header): values sealed under a random nonce are compressed with a window
just large enough for them (``compress``), content-addressed ones
(``synthetic_nonce``) as they always were, so that equal content keeps
sealing to equal bytes.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import struct
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from cairn.errors import MissingExtra, PayloadError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

MAGIC = 0xCE
VERSION = 1
AES_256_GCM = 1
FLAG_ZLIB = 1
HEADER_SIZE = 12
NONCE_SIZE = 12
TAG_SIZE = 16
KEY_SIZE = 32
#: plaintexts at least this long are compressed before sealing when that saves space
COMPRESS_AT = 512


def aesgcm(key: bytes) -> AESGCM:
    """An AES-256-GCM cipher of ``key``; ``MissingExtra`` (one line naming
    the ``encryption`` extra) when ``cryptography`` is not installed."""
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise MissingExtra("encryption at rest", "encryption") from None
    if len(key) != KEY_SIZE:
        raise ValueError(f"an AES-256 key is {KEY_SIZE} bytes, not {len(key)}")
    return AESGCM(key)


@functools.lru_cache(maxsize=4096)
def tenant_tag(tenant: str) -> bytes:
    """4 bytes naming ``tenant`` in an envelope's header."""
    return hashlib.blake2b(tenant.encode(), digest_size=4).digest()


#: a place's associated data (``Place.associated``), for a ``Place`` or a plain tuple of its five parts
_ENCODE_PLACE = msgspec.msgpack.Encoder().encode
encode_place = _ENCODE_PLACE
_urandom = os.urandom

#: how many nonces one ``os.urandom`` call draws (``fresh_nonce``)
NONCE_BATCH = 64
#: one ``os.urandom`` draw cut into ``NONCE_BATCH`` nonces in one C call (issue 25, 2026-12-07:
#: the list comprehension it replaces ran 64 turns of Python a refill, 56 bytecodes a 3-step run)
_split_nonces = struct.Struct(f"{NONCE_SIZE}s" * NONCE_BATCH).unpack
#: nonces drawn and not yet used: each is taken once (``take_nonce``, ``list.pop``), never put back
_nonces: list[bytes] = []
#: a nonce from the pool, ``IndexError`` when it is empty (then ``fresh_nonce``): a C call, where
#: ``os.urandom`` per nonce was a system call and about 660 instructions (bench/encryption.py)
take_nonce = _nonces.pop


def fresh_nonce() -> bytes:
    """A nonce, the pool refilled first (``NONCE_BATCH`` from one ``os.urandom``
    call). Two threads refilling at once both add theirs: each nonce is
    still handed out once."""
    batch: list[bytes] = list(_split_nonces(_urandom(NONCE_SIZE * NONCE_BATCH)))
    nonce = batch.pop()
    _nonces.extend(batch)
    return nonce


def nonce() -> bytes:
    """A fresh random nonce (``take_nonce``, else ``fresh_nonce``)."""
    try:
        return take_nonce()
    except IndexError:
        return fresh_nonce()


# A forked child starts with its parent's pool: emptied before anything else runs in it, or
# parent and child would seal with the same nonces under the same keys.
os.register_at_fork(after_in_child=_nonces.clear)


class Place(NamedTuple):
    """Where a sealed value is stored: what its ciphertext is bound to.

    A named tuple rather than a frozen dataclass: one is built per value
    sealed or opened, and a frozen dataclass sets each field through
    ``object.__setattr__`` (about a microsecond of a step's sealing).
    ``Place(...)`` still runs the named tuple's ``__new__``, a Python
    function (about 2,200 instructions, callgrind); ``place_of`` builds one
    from a tuple of its parts in one C call."""

    tenant: str
    run: str
    table: str
    position: str
    kind: str

    def associated(self) -> bytes:
        """The associated data: the five parts as one MessagePack array, in
        which each string is length-prefixed, so no two places share it
        (``("a", "bc")`` and ``("ab", "c")`` differ); one C call per value."""
        return _ENCODE_PLACE(self)

    def __str__(self) -> str:
        return (f"{self.table}.{self.kind} at {self.position} of run {self.run!r} "
                f"(tenant {self.tenant!r})")


#: a ``Place`` from a tuple of its five parts, in one C call (``tuple.__new__``), where
#: ``Place(...)`` runs the named tuple's ``__new__`` in Python: for what opens a value per row read
place_of: Callable[[tuple[str, str, str, str, str]], Place] = functools.partial(tuple.__new__, Place)


class SealError(PayloadError):
    """A stored value that should be an envelope cannot be opened: not an
    envelope (plaintext, damaged), sealed for another place, or sealed with
    a key this keyring does not hold. The message names the place."""


class Header(NamedTuple):
    """The parsed header of an envelope (a named tuple: one is built per value opened)."""

    flags: int
    key_version: int
    tenant_tag: bytes


def is_envelope(data: bytes | None) -> bool:
    """Whether ``data`` starts like an envelope (not whether it opens)."""
    return data is not None and len(data) >= HEADER_SIZE + NONCE_SIZE + TAG_SIZE and data[0] == MAGIC


def key_version(data: bytes, place: Place) -> int:
    """The data key version that sealed envelope ``data`` read at ``place``
    (its header checked: an envelope, of this format and algorithm);
    ``SealError`` if it is none. What an opener needs to pick the key,
    without a ``Header`` built (``header_of``)."""
    if not is_envelope(data):
        raise SealError(f"{place} is not encrypted (plaintext or damaged): refused, encryption is on")
    if data[1] != VERSION or data[2] != AES_256_GCM:
        raise SealError(f"{place} is sealed in an unknown format (version {data[1]}, algorithm {data[2]})")
    return int.from_bytes(data[4:8], "big")


def header_of(data: bytes, place: Place) -> Header:
    """The header of envelope ``data`` read at ``place``; ``SealError`` if it is none."""
    version = key_version(data, place)  # checked before any byte of it is read
    return Header(data[3], version, bytes(data[8:12]))


@functools.lru_cache(maxsize=4096)
def header(flags: int, key_version: int, tenant: str) -> bytes:
    """The header of an envelope sealed with ``tenant``'s data key ``key_version``."""
    return bytes((MAGIC, VERSION, AES_256_GCM, flags)) + key_version.to_bytes(4, "big") + tenant_tag(tenant)


_nonce = nonce


def compress(plaintext: bytes) -> bytes:
    """``plaintext`` zlib-compressed at level 1 with a window just large
    enough to hold it (and a hash table to match), without
    ``zlib.compress`` setting up and clearing about 256 KB of state whatever
    the input's size (under callgrind 58,000 of the 65,000 instructions
    sealing added to a journaled step of 1 KiB: issue 25, 2026-12-07). The
    plain store packs a large payload with it too (``cairn.store.rows``).
    Its bytes are not ``zlib.compress``'s (the header names the window), but
    ``zlib.decompress`` reads any window size from that header."""
    if len(plaintext) > 16384:
        return zlib.compress(plaintext, 1)
    wbits = fitted_window(len(plaintext))
    compressor = zlib.compressobj(1, zlib.DEFLATED, wbits, wbits - 6)
    return compressor.compress(plaintext) + compressor.flush()


def fitted_window(size: int) -> int:
    """The smallest DEFLATE window (zlib's ``wbits``, 9 to 15) holding ``size``
    bytes: a compressor set up with it, and a hash table of ``wbits - 6``
    (``memLevel``), clears and allocates a fraction of the ~256 KB zlib's
    defaults do whatever the input's size (``compress``). No match is lost
    while the window holds the whole input, and any inflater with a window
    at least as large (zlib's default: 32 KB) reads the stream."""
    return max(9, min(15, (size - 1).bit_length()))


def deflate_raw(data: bytes, level: int, zdict: bytes) -> bytes:
    """``data`` as raw DEFLATE primed with the preset dictionary ``zdict``, in a
    window holding both (``fitted_window``): a LangGraph checkpoint or message
    of a few hundred bytes spent ~150,000 instructions of a compressor's set-up
    with zlib's defaults (callgrind, issue 24, 2026-12-07). Read by
    ``zlib.decompressobj(-15, zdict=zdict)`` as before: rows compressed with the
    full window read the same."""
    wbits = fitted_window(len(zdict) + len(data))
    key = (level, wbits, zdict)
    primed = _PRIMED.get(key)
    if primed is None:
        if len(_PRIMED) >= _PRIMED_MAX:  # callers pass a few constant dictionaries: never reached by them
            _PRIMED.clear()
        primed = _PRIMED.setdefault(key, zlib.compressobj(level, zlib.DEFLATED, -wbits, wbits - 6,
                                                          zlib.Z_DEFAULT_STRATEGY, zdict=zdict))
    compressor = primed.copy()
    out: bytes = compressor.compress(data) + compressor.flush()
    return out


#: compressors set up and primed with a dictionary, never fed: ``deflate_raw``
#: copies one (zlib's ``deflateCopy``: the same state, so the same bytes out)
#: instead of clearing a hash table and hashing the dictionary into it again
#: (``deflateSetDictionary``: ~26,000 instructions of a LangGraph super-step's
#: ~1.65 million in CairnSaver, callgrind, issue 24, 2026-12-07); by (level, wbits, dictionary)
_PRIMED: dict[tuple[int, int, bytes], Any] = {}
_PRIMED_MAX = 64


def seal(cipher: AESGCM, key_version: int, place: Place, plaintext: bytes,
         nonce: bytes | None = None, *, fitted: bool | None = None) -> bytes:
    """``plaintext`` sealed for ``place`` with ``cipher`` (the tenant's data
    key of ``key_version``), under a random nonce; or under ``nonce``, which
    must then be a keyed hash of the plaintext and place (``synthetic_nonce``:
    one nonce per distinct value, so equal values seal to equal bytes), or
    the nonce of an envelope sealed again to its very bytes (an archive's
    values, ``store.archiveseal``). ``fitted``: whether a long plaintext is
    compressed in a window fitted to it (``compress``) or by
    ``zlib.compress``; by default fitted under a random nonce only."""
    flags = 0
    if len(plaintext) >= COMPRESS_AT:
        # a synthetic nonce's value keeps its compressor: equal content, equal bytes, one artifact
        if fitted is None:
            fitted = nonce is None
        packed = compress(plaintext) if fitted else zlib.compress(plaintext, 1)
        if len(packed) < len(plaintext):
            plaintext, flags = packed, FLAG_ZLIB
    head = header(flags, key_version, place[0])
    if nonce is None:
        nonce = _nonce()
    return b"".join((head, nonce, cipher.encrypt(nonce, plaintext, head + _ENCODE_PLACE(place))))


def synthetic_nonce(nonce_key: bytes, place: Place, plaintext: bytes) -> bytes:
    """A nonce derived from the value (HMAC-SHA-256 with a key of its own,
    derived from the data key): the same value at the same place under the
    same key always gets the same nonce, and two different values collide
    only as HMAC truncated to 96 bits does (``nonce_key``: a key derived
    from the data key, ``cairn.store.sealing.DataKeys.subkey``). Artifacts use it, so identical
    content stored twice by one tenant is one file (dedup within a tenant),
    while another tenant's key gives other bytes (no dedup, nothing learnt
    across tenants)."""
    return hmac.new(nonce_key, place.associated() + plaintext, hashlib.sha256).digest()[:NONCE_SIZE]


@functools.cache
def _invalid_tag() -> type[Exception]:
    """``cryptography``'s ``InvalidTag`` (the extra's): looked up only when a
    decryption raises, since an ``except`` clause's class is evaluated only
    then. Until 2026-12-07 (issue 25) ``open_sealed`` imported it at every
    call, an import statement per value opened."""
    from cryptography.exceptions import InvalidTag

    return InvalidTag


def open_sealed(cipher: AESGCM, place: Place, data: bytes) -> bytes:
    """The plaintext of envelope ``data`` (its header checked by
    ``key_version`` or ``header_of``, which named the key of ``cipher``)
    stored at ``place``; ``SealError`` naming the place if it was sealed for
    another place or damaged. The tenant tag and flags are read from the
    header bytes themselves (authenticated with the ciphertext below)."""
    if data[8:HEADER_SIZE] != tenant_tag(place[0]):
        raise SealError(f"{place} was sealed for another tenant: refused")
    try:
        plaintext = cipher.decrypt(data[HEADER_SIZE:HEADER_SIZE + NONCE_SIZE],
                                   data[HEADER_SIZE + NONCE_SIZE:], data[:HEADER_SIZE] + _ENCODE_PLACE(place))
    except _invalid_tag():
        raise SealError(f"{place} does not decrypt: sealed for another run, table or position, "
                        f"or damaged") from None
    if data[3] & FLAG_ZLIB:
        try:
            return zlib.decompress(plaintext)
        except zlib.error as exc:  # authenticated, so only a bug could get here
            raise SealError(f"{place} does not decompress: {exc}") from None
    return plaintext
