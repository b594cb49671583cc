"""The audit chain's links: one per history entry, chaining a run's entries
in ``seq`` order (issue 26; docs/design.md, "Audit chain").

::

    digest(n) = SHA-256(msgpack([payload plaintext, detail plaintext]))          (no keyring)
              = BLAKE2b-256(the same bytes, person = "cairn digest 3")   (no keyring, link version 3)
              = BLAKE2b-256(the same bytes, key = audit key of the run's tenant,
                            person = "cairn audit 2")                        (encryption on)
              = HMAC-SHA-256(audit key, the same bytes)    (encryption on, written before v2)
    link(n)   = 0x03 || BLAKE2b-256(link(n-1) || body(n), person = "cairn link 3")   (version 3)
              = 0x02 || BLAKE2b-256(link(n-1) || body(n), person = "cairn link 2")   (version 2)
              = SHA-256(link(n-1) || body(n))                                      (version 1)
    body(n)   = msgpack([run_id, seq, event, at, epoch, worker, position, step_kind, name,
                         input_hash, attempt, started_at, payload_ref, digest(n)])

with 32 zero bytes before a run's first entry. A stored link says its own
version: 33 bytes starting 0x03 is version 3, starting 0x02 version 2, 32
bytes version 1, anything else no version (it matches nothing: TAMPERED).
Version 3 (issue 26, chain26, 2026-12-07) is version 2 with the plain
digest (no keyring: not stored, the verifier recomputes it) by BLAKE2b in
its own domain instead of SHA-256: what a store without a keyring writes for
a journaled step (``written_link`` given no digest). The step's hot path
then runs one hash function, not two: CPython's SHA-256 compression is
6.6 KB of unrolled code that the step loop evicts between steps, about 110
instruction-cache misses and 3,300 instructions a step (callgrind
``--cache-sim``), where the digest's BLAKE2b runs in the code the link's
then uses warm. A digest stored later for such an entry (retention,
adoption) is its version 3 digest (``plain_digest``, ``recomputed_digest``
given the link's version). Version 2 (issue 26,
2026-12-07) is what the client-side writers compute for a journaled step
(``written_link``: both backends' hot paths): BLAKE2b's 2
compressions of 128 bytes where SHA-256 took 4 of 64 in CPython's code,
about 5,900 instructions a link against 13,800 (callgrind). Version 1 is
what every link written before was, and what PostgreSQL's statements that
hash in the server still write (``insert_event_fenced``, ``finish_fenced``:
PostgreSQL has SHA-256 but no BLAKE2b) and the paths off the step's hot
path (``link``: bulk linking at commit, a new run's first entries, the
operator log). Both versions hash the same bytes with a full 256-bit hash,
so a row cannot be moved to a weaker check by relabelling it; relabelling
changes the stored link, which the next entry's link covers. Both are columns of the
history row, written by the store in the statement (or the transaction)
that writes the entry: no trigger, no second table.

Why the *plaintext* digest and not the stored bytes: key rotation
(``cairn keys rotate`` / ``reencrypt``, ``store.rekey``) re-seals history
rows with a new data key, which changes every stored byte of a sealed
value and nothing it means; a chain over stored bytes called that
tampering. The digest is of what the entry says, so a re-seal keeps every
link, an edit of the ciphertext fails to open (AES-GCM), and an edit of
the plaintext or of the metadata fails the chain. An erased entry (its key
destroyed) can no longer have its digest recomputed, but its stored digest
still links, so the chain around it verifies and the entry is reported as
erased, not tampered.

Why keyed when encrypted: a plain hash of the plaintext would let anyone
who reads the database confirm a guessed value (a name, a yes/no answer)
against the stored digest, which the encryption is there to prevent. The
audit key is the tenant's (``store.auditkeys``), derived from its first data
key, so a rotation keeps it and destroying the tenant's keys takes it too.

Link values: ``None`` marks an entry written before the chain existed
(migration 0022 leaves them so), ``PENDING`` (empty) an entry written by a
statement that does not compute links itself (claims in bulk, lifecycle
transitions): the store links those in the same transaction, before its
commit (``link_rows``), so no committed entry stays pending.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

#: The link before a run's first entry.
GENESIS = bytes(32)

#: A row written without its link, linked before the transaction commits.
PENDING = b""

#: Deterministic: maps by sorted key (a sealed detail opens with its keys in another order).
_ENCODE = msgspec.msgpack.Encoder(order="sorted").encode

#: A hash in one call: ``hashlib.sha256(data).digest()``. Measured against a
#: copy of a blank hash object fed the same bytes (what the chain did
#: before): 5,900 against 6,400 instructions a hash under callgrind, 370
#: against 450 ns natively on CPython 3.11 and OpenSSL 3 (one object made
#: and freed, not two; the constructor's look-up of the algorithm does not
#: show in either count).
_SHA256 = hashlib.sha256

#: CPython's own SHA-256 (no OpenSSL): for input of one block (at most 55
#: bytes: an entry's digest of a small step result) it skips OpenSSL's
#: context set-up and cleansing, 4,200 instructions and 340 ns a hash against
#: 5,900 and 370; for longer input OpenSSL's SHA extensions win in a loop
#: (measured: 950 against 460 ns at 247 bytes). Same bytes either way: SHA-256.


def _builtin_sha256() -> Callable[[bytes], hashlib._Hash]:
    """CPython's own SHA-256 class (``_sha256`` on 3.11, ``_sha2`` since), else OpenSSL's."""
    for module in ("_sha256", "_sha2"):
        with contextlib.suppress(ImportError):
            found: Callable[[bytes], hashlib._Hash] = importlib.import_module(module).sha256
            return found
    return hashlib.sha256


_ONE_BLOCK = _builtin_sha256()

#: The longest input that is one SHA-256 block (64 bytes less 9 of padding).
_ONE_BLOCK_MAX = 55

#: The writers hashed entry digests of up to 8 blocks with CPython's SHA-256
#: too, not OpenSSL's, until version 3 of the link made their digest BLAKE2b
#: (chain26): in the PostgreSQL step loop OpenSSL's path to a hash (an EVP
#: context made, its digest fetched, copied, cleansed, freed: some twenty
#: functions across libcrypto) ran cold, a quarter of its hashes over 4-6 us
#: against CPython's 1.1-1.7 (``bench.audit --in-loop``, 2026-12-06). The
#: verifier, which hashes in a loop, keeps OpenSSL beyond one block.

#: Gives an entry's digest (a sealed store opens the entry and keys the
#: digest), given the entry and its run's tenant if the caller knows it.
Digester = Callable[[Any, "str | None"], bytes]


def digest(data: bytes | None, detail: dict[str, Any] | None) -> bytes:
    """The digest of an entry's plaintext payload bytes and detail."""
    if data is None and detail is None:
        return _EMPTY
    encoded = _ENCODE((data, detail))
    return (_ONE_BLOCK(encoded) if len(encoded) <= _ONE_BLOCK_MAX else _SHA256(encoded)).digest()


_EMPTY = _SHA256(_ENCODE((None, None))).digest()

#: The blank BLAKE2b-256 state of the plain digest of version 3 (links of
#: version 3), its own personalization: copied per digest, never fed itself.
_DIGEST3 = hashlib.blake2b(digest_size=32, person=b"cairn digest 3")

#: The plain digest of version 3 of an entry without payload and detail.
_EMPTY3 = hashlib.blake2b(_ENCODE((None, None)), digest_size=32, person=b"cairn digest 3").digest()


def digest_v3(data: bytes | None, detail: dict[str, Any] | None) -> bytes:
    """The plain digest of version 3 (BLAKE2b-256, ``cairn digest 3``) of an
    entry's plaintext payload bytes and detail: what a link of version 3
    covers when the store has no keyring."""
    if data is None and detail is None:
        return _EMPTY3
    hashed = _DIGEST3.copy()
    hashed.update(_ENCODE((data, detail)))
    return hashed.digest()


def plain_digest(data: bytes | None, detail: dict[str, Any] | None, version: int) -> bytes:
    """The plain digest an entry whose link is of ``version`` covers: version 3's
    BLAKE2b, SHA-256 (``digest``) for every other."""
    return digest_v3(data, detail) if version == 3 else digest(data, detail)


#: the personalization of a keyed digest of version 2 (``AuditKey.digest``): its own domain, so
#: no BLAKE2b the audit key computes for another purpose can be taken for one
DIGEST_PERSON = b"cairn audit 2"


class AuditKey:
    """The keyed digest of a sealed entry under one tenant's audit key, in
    its two versions. Version 2, written since 2026-12-06 (issue 25,
    sealcost): keyed BLAKE2b-256, one keyed pass in C (a copy of the keyed
    state, one update, one digest: about 8,000 instructions a step less
    than HMAC's two SHA-256 passes through OpenSSL, callgrind). Version 1,
    written before: HMAC-SHA-256 (RFC 2104), its two padded key blocks
    hashed once. The verifier tries version 2 and, if it differs,
    version 1 (``digest_v1``); both are keyed with the audit key, so
    neither can be forged without it, and every chain written before keeps
    verifying."""

    __slots__ = ("_inner", "_keyed", "_outer")

    def __init__(self, key: bytes) -> None:
        self._keyed = hashlib.blake2b(key=key, digest_size=32, person=DIGEST_PERSON)
        block = (key if len(key) <= 64 else _SHA256(key).digest()).ljust(64, b"\0")
        self._inner = _SHA256(bytes(b ^ 0x36 for b in block))
        self._outer = _SHA256(bytes(b ^ 0x5C for b in block))

    @property
    def keyed(self) -> hashlib.blake2b:
        """The keyed BLAKE2b state, nothing fed: copied per digest (``cairn.store.sealedsteps``
        keys a step's digest from it inline), never updated itself."""
        return self._keyed

    def digest(self, data: bytes | None, detail: dict[str, Any] | None) -> bytes:
        """The keyed digest (version 2) of an entry's plaintext payload bytes and detail."""
        keyed = self._keyed.copy()
        keyed.update(_ENCODE((data, detail)))
        return keyed.digest()

    def digest_v1(self, data: bytes | None, detail: dict[str, Any] | None) -> bytes:
        """The keyed digest of version 1 (HMAC-SHA-256), of entries written
        before version 2: verified, never written any more."""
        inner = self._inner.copy()
        inner.update(_ENCODE((data, detail)))
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()


#: The first byte of a link of version 2 (see the module's docstring).
LINK_V2 = b"\x02"

#: The length of a stored link of version 2: its version byte and a BLAKE2b-256.
_V2_LENGTH = 33

#: The blank BLAKE2b-256 state of version 2's links, its own personalization
#: (no other BLAKE2b of Cairn's is in the same domain): copied per link, never
#: fed itself. A copy, one update and a digest cost less than the constructor
#: with its keyword arguments parsed per call.
_LINK2 = hashlib.blake2b(digest_size=32, person=b"cairn link 2")

#: The first byte of a link of version 3 (see the module's docstring).
LINK_V3 = b"\x03"

#: The blank BLAKE2b-256 state of version 3's links (``_LINK2``'s, in its own domain).
_LINK3 = hashlib.blake2b(digest_size=32, person=b"cairn link 3")


def link_version(stored: bytes) -> int:
    """The version a stored link declares: 3 for 33 bytes starting ``LINK_V3``,
    2 for 33 bytes starting ``LINK_V2``, 1 for 32 bytes, 0 for anything else
    (no formula gives it: never matches)."""
    if len(stored) == _V2_LENGTH:
        first = stored[0]
        return 3 if first == 3 else 2 if first == 2 else 0
    return 1 if len(stored) == 32 else 0


def row_link(previous: bytes, values: Sequence[Any], entry_digest: bytes, version: int) -> bytes:
    """``link`` of version ``version`` (``link_version`` of the stored one) of
    an entry written as ``values`` (``rows.EVENT_COLUMNS`` order), the
    verifier's: one hash of the previous link and the body joined (cheaper
    than a hash object fed twice), the body's items one tuple display (no
    slices joined) when its times are floats. ``values`` may be any sequence
    (a row as read). An unknown version gives ``PENDING``, which no stored
    link the verifier checks equals."""
    if version == 2:
        return written_link(previous, values, entry_digest)
    if version == 3:
        return _linked(_LINK3.copy(), LINK_V3, previous, values, entry_digest)
    if version == 1:
        return _SHA256(previous + body(meta_of_values(values), entry_digest)).digest()
    return PENDING


def written_link(previous: bytes, values: Sequence[Any], entry_digest: bytes | None,
                 data: bytes | None = None, detail: dict[str, Any] | None = None) -> bytes:
    """The link an entry written as ``values`` after ``previous`` gets from
    the writers, computed once an entry (and by the verifier, ``row_link``,
    for version 2). ``entry_digest`` given (keyed, or stored beside the
    entry): version 2. ``None``: version 3, the entry's plain digest
    computed here from its plaintext ``data`` and ``detail`` by BLAKE2b
    (``digest_v3``; a store without a keyring, which does not store it: the
    verifier recomputes it), so the step runs one hash function's code, not
    SHA-256's and BLAKE2b's (issue 26, chain26: 3,300 instructions and about
    110 instruction-cache misses a step less, callgrind).

    One Python call for the whole of a journaled step's chain work, both
    hashes and the body: each call the hot path made (``chained``, then this,
    then the bytes joined in a third) cost a frame, and the previous link was
    copied into a joined bytes object only to be hashed (its tail, ``_linked``,
    is shared with the verifier's version 3: one Python call more, +53 ns a link in a loop)."""
    if entry_digest is None:
        if data is None and detail is None:
            entry_digest = _EMPTY3
        else:
            hashed = _DIGEST3.copy()
            hashed.update(_ENCODE((data, detail)))
            entry_digest = hashed.digest()
        linked, version = _LINK3.copy(), LINK_V3
    else:
        linked, version = _LINK2.copy(), LINK_V2
    return _linked(linked, version, previous, values, entry_digest)


def _linked(linked: hashlib.blake2b, version: bytes, previous: bytes, values: Sequence[Any],
            entry_digest: bytes) -> bytes:
    """``written_link``'s tail: ``version`` and the BLAKE2b ``linked`` (a blank
    state) of ``previous`` and the body of ``values`` with ``entry_digest``
    (also the verifier's, for version 3)."""
    linked.update(previous)  # two updates: BLAKE2b buffers them as one input, no joined copy
    v = values
    if type(v[3]) is float and (v[11] is None or type(v[11]) is float):  # the body in one tuple display
        linked.update(_ENCODE((v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11],
                               v[13], entry_digest)))
    else:
        linked.update(body(meta_of_values(v), entry_digest))
    return version + linked.digest()


def digest_and_link(previous: bytes, values: tuple[Any, ...], data: bytes | None,
                    detail: dict[str, Any] | None) -> tuple[bytes, bytes]:
    """``(digest, link)`` of an entry written as ``values`` after
    ``previous``, its plaintext ``data`` and ``detail`` unkeyed (a keyed
    store's entry that holds nothing sealed: its digest is stored)."""
    entry_digest = digest(data, detail)
    return entry_digest, written_link(previous, values, entry_digest)


def link(previous: bytes, meta: Sequence[Any], entry_digest: bytes) -> bytes:
    """The link of version 1 after ``previous`` of an entry with ``meta`` (``run_id, seq,
    event, at, epoch, worker, position, step_kind, name, input_hash,
    attempt, started_at, payload_ref``, as stored) and ``entry_digest``: the
    writers off a step's hot path (linking at commit, a new run's first
    entries, the operator log), the formula PostgreSQL's statements compute."""
    return _SHA256(previous + body(meta, entry_digest)).digest()


def body(meta: Sequence[Any], entry_digest: bytes) -> bytes:
    """What a link hashes after the previous link. The two times are
    encoded as the REAL / float8 columns return them, floats (a caller's
    clock may give an int)."""
    at, started = meta[3], meta[11]
    if type(at) is not float or (started is not None and type(started) is not float):
        meta = (*meta[:3], float(at), *meta[4:11], None if started is None else float(started), *meta[12:])
    return _ENCODE((*meta, entry_digest))


def body_around_at(meta: Sequence[Any], entry_digest: bytes) -> tuple[bytes, bytes]:
    """``body`` without its time: the bytes before it and after it. The time
    (index 3) is a float64, ``0xcb`` and 8 bytes big-endian, so PostgreSQL
    puts in the one it stores as ``'\\xcb' || float8send(at)``. The array
    header is one byte: 14 items, a fixarray (``0x90 | 14``)."""
    started = meta[11]
    if started is not None and type(started) is not float:
        meta = (*meta[:11], float(started), *meta[12:])
    # two encodes, not one per item: an array's items are its bytes after its
    # header, one byte for these fixarrays (3 and 10 items)
    head = _ENCODE(meta[:3])
    tail = _ENCODE((*meta[4:], entry_digest))
    return _BODY_HEADER + head[1:], tail[1:]


#: the header of a link body's array (``body``): 14 items, a fixarray
_BODY_HEADER = bytes([0x90 | 14])


def meta_of_values(values: Sequence[Any]) -> tuple[Any, ...]:
    """The metadata a link covers from a row of ``EVENT_COLUMNS`` (payload and detail left out)."""
    return (*values[:12], values[13])


def previous_of(stored: bytes | None) -> bytes | None:
    """The link a next entry chains from, given the stored link before it:
    ``None`` if that one is still pending (so is the next)."""
    if stored is None:
        return GENESIS  # written before the chain: the chain starts after it
    stored = bytes(stored)
    return None if stored == PENDING else stored
