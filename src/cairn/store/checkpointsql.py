"""LangGraph checkpoint rows of the SQL stores (migration ``langgraph_checkpoints``).

The tables hold what ``cairn.langgraph.CairnSaver`` writes, as bytes it
serialized: this module never decodes a value (only the saver holds the
serializer and its allowlist). What it knows is the layout that keeps a
thread's storage linear:

* ``lg_values``: each distinct value of a thread once, under a 64-bit
  digest of its serializer type and bytes (the saver computes it);
* ``lg_blobs``: a channel's value at one version, as packed digests
  (``refs``): one for a plain value, the items for a list. A list that grew
  from a version still stored names that version as its ``base`` and holds
  only the new items; ``depth`` counts the bases below it, so the saver can
  bound the chain a read walks. A channel the saver holds inline in the
  checkpoint (its value is not a list: ``Named.inline``) has no row here,
  nor has a list version held as a tail (``lg_tail_every``): the row names
  its base version and the tail's digests are among its inline ones;
* ``lg_writes``: pending writes, each a packed digest list too, so the value
  a node wrote and the item the next checkpoint appends are one row (SQLite
  since 2026-12-07 writes none: a put_writes' record goes to its checkpoint's
  row, a *pending* one, ``checkpoint_kind`` '', while the checkpoint is not
  stored: ``lg_put_record``);
* ``lg_checkpoints``: the checkpoint (channel values removed) and metadata,
  and (``writes``) its pending writes folded in: a put moves its parent's
  rows of ``lg_writes`` into the parent's row, one compressed record
  (``fold_writes``), in its own transaction, so ``lg_writes`` holds only the
  writes of checkpoints no child was put after yet (plus writes put to a
  checkpoint after it was folded, read with the folded ones). A super-step
  left 3 rows of ~130 bytes of keys each in ``lg_writes`` (464 of its 2,130
  bytes on SQLite at 300 steps); folded, they take about 60.

Every statement names the tenant, so another tenant's thread is absent, and
each write takes the thread's lock (PostgreSQL: an advisory lock for the
transaction; SQLite has one writer anyway), so a prune's garbage collection
never races a put on the same thread.

Writes are fenced (``lg_threads``): a put names its ``Holder``, the saver's
owner id and the epoch it last held the thread at (``None``: it never held
it). Under the thread's lock, a thread nobody holds, or held by another
saver while this one never held it, is taken (epoch + 1); one held by this
saver at its epoch is written; one this saver held and another took since
raises ``ThreadTaken`` and nothing of the write is applied.

A holder with a ``lease`` (a run's lease epoch: ``cairn.lgdurable`` drives
thread ``lg:<run id>`` with one) is fenced by it instead: it holds the
thread at that epoch, and is refused once a holder of a later lease has
written, whether or not it wrote before (a worker frozen before its first
write never takes the thread back from the run's next lease).

A saver remembers what it wrote (values, a list's last version) and skips
writing it again; a prune or ``delete_for_runs`` may collect those rows
meanwhile, from another saver or process. Each collection counts itself in
the thread's holder row (``collected``, migrations 0032 / 0052), a writer
names the count its memory was made under (``Holder.collected``), and a
writer whose memory is stale (the thread collected or deleted since) is
refused with ``Stale`` before anything is written: the saver forgets the
thread and writes the whole checkpoint again, expecting the count now
(issue 24, 2026-12-07 fifth session: the checkpoint it put
named values no longer stored, unreadable for every reader).
"""

from __future__ import annotations

import json
import re
import struct
import uuid
import zlib
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from cairn import faults
from cairn.errors import ThreadTaken, UnreadableCheckpoint
from cairn.faults import fault_point
from cairn.security.envelope import deflate_raw
from cairn.store.sqlprimitives import SQLPrimitives

Tx = TypeVar("Tx")
T = TypeVar("T")

#: bytes of one digest in ``refs``
REF_SIZE = 8
#: A canonical checkpoint id: a lowercase UUID as ``str(uuid.UUID(...))`` spells it (``pack_id_key``).
_CANONICAL = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_DASHES = (8, 13, 18, 23)
_GREATEST = "ffffffff-ffff-ffff-ffff-ffffffffffff"


def _below(position: int, c: int) -> int | None:
    """The greatest byte a canonical UUID may hold at ``position`` that is less than ``c``."""
    if position in _DASHES:
        return 45 if c > 45 else None
    if c > 102:
        return 102
    if c > 97:
        return c - 1
    if c > 57:
        return 57
    return c - 1 if c > 48 else None


def pack_id_key(checkpoint_id: str) -> bytes:
    """A checkpoint id as PostgreSQL keys it (migration 0050; ``lg_id_key``
    in SQL, which packs alike): a canonical UUID as 0x01 and its 16 bytes;
    an id below every UUID as 0x00 and its UTF-8 bytes; any other id as 0x01,
    the 16 bytes of the greatest UUID below it, then its bytes. Keys so
    packed order as the ids' bytes do, whatever their forms."""
    canonical = _packed_uuid(checkpoint_id)
    if canonical is not None:
        return canonical
    b = checkpoint_id.encode()
    p = 0  # how many of its first bytes spell the start of a canonical UUID
    while p < 36 and p < len(b):
        c = b[p]
        if not (c == 45 if p in _DASHES else 48 <= c <= 57 or 97 <= c <= 102):
            break
        p += 1
    if p == 36:  # a UUID and more: the greatest UUID below it is that UUID
        return b"\x01" + uuid.UUID(b[:36].decode()).bytes + b
    for k in range(min(p, len(b) - 1), -1, -1):  # the greatest UUID below differs first at some k <= p
        below = _below(k, b[k])
        if below is not None:
            return b"\x01" + uuid.UUID(b[:k].decode() + chr(below) + _GREATEST[k + 1:]).bytes + b
    return b"\x00" + b  # below every UUID


def pack_id(checkpoint_id: str) -> bytes:
    """A parent id as PostgreSQL stores it (migration 0049, ``lg_id_pack``): a
    canonical UUID as 0x01 and its 16 bytes, any other id as 0x00 and its bytes."""
    canonical = _packed_uuid(checkpoint_id)
    return canonical if canonical is not None else b"\x00" + checkpoint_id.encode()


def _packed_uuid(checkpoint_id: str) -> bytes | None:
    """0x01 and the 16 bytes of a canonical UUID id (both packings' first case), else None."""
    if len(checkpoint_id) == 36 and _CANONICAL.fullmatch(checkpoint_id):
        return b"\x01" + uuid.UUID(checkpoint_id).bytes
    return None


#: the first bytes of a checkpoint's folded pending writes (``fold_writes``): the format's version
FOLD_TAG = b"W1"
#: the most bytes folded writes may inflate to (a damaged or hostile record claiming more is refused)
FOLD_LIMIT = 64 * 1024 * 1024
#: the preset dictionary a folded record is deflated with (what a record of LangGraph's
#: writes spells: its JSON, task ids, task paths, channels; fixed forever, named by
#: ``FOLD_TAG``): a super-step's three writes took 157 bytes with zlib alone, 116 with it
FOLD_DICTIONARY = (b'[["00000000-0000-0000-0000-000000000000",-1,"__error__","","value",""],["__interrupt__",'
                   b'"__resume__","__scheduled__","~__pregel_push, ","branch:to:","messages","list","value",'
                   b'"~__pregel_pull, __start__"],["",0,"","~__pregel_pull, ","list","')


#: the first bytes of a binary record of folded writes (``fold_writes(compact=True)``,
#: PostgreSQL since 2026-12-06, issue 24; both formats are read, records of both may follow each other)
FOLD_TAG_2 = b"W2"
#: how a ``FOLD_TAG_2`` write gives its task id: the previous write's, a UUID's 16 bytes, or text
TASK_SAME, TASK_UUID, TASK_TEXT = 0, 1, 2
#: the preset dictionary of ``FOLD_TAG_2`` records: the body of a record of LangGraph's special
#: writes and of a super-step's three writes, ids and digests zero (fixed forever, named by the tag)
FOLD_DICTIONARY_2 = bytes.fromhex(
    "010000000000000000000000000000000001095f5f6572726f725f5f000576616c756508000000000000000000030d5f"
    "5f7363686564756c65645f5f000576616c756508000000000000000000050d5f5f696e746572727570745f5f107e5f5f"
    "70726567656c5f707573682c200576616c756508000000000000000000070a5f5f726573756d655f5f000576616c7565"
    "080000000000000000010000000000000000000000000000000000086d65737361676573197e5f5f70726567656c5f70"
    "756c6c2c205f5f73746172745f5f046c6973740800000000000000000002016e197e5f5f70726567656c5f70756c6c2c"
    "205f5f73746172745f5f0576616c756508000000000001c3a500040a6272616e63683a746f3a197e5f5f70726567656c"
    "5f70756c6c2c205f5f73746172745f5f0576616c756508000000000000c3a5"
)

@dataclass(frozen=True, slots=True)
class ThreadKey:
    """Where a checkpoint lives: a tenant's thread and its namespace."""

    tenant: str
    thread_id: str
    ns: str


@dataclass(frozen=True, slots=True)
class Holder:
    """Who writes: a saver's ``owner`` id and the epoch it last held the thread at."""

    owner: str
    epoch: int | None
    #: a run's lease epoch fencing the writes (see the module); ``None``: owner fencing
    lease: int | None = None
    #: the thread's collection count the writer's memory of it was made under (``Stale``);
    #: ``None``: it remembers nothing of the thread, and expects nothing of it
    collected: int | None = None


class Stale(Exception):
    """A writer's memory of a thread is stale (see the module): nothing was
    written; ``collected`` is the thread's collection count now, ``None``
    when the thread was deleted since the writer held it."""

    def __init__(self, thread_id: str, collected: int | None) -> None:
        what = "was deleted" if collected is None else f"was collected ({collected} times)"
        super().__init__(f"LangGraph thread {thread_id!r} {what} since this writer last wrote it")
        self.collected = collected


@dataclass(frozen=True, slots=True)
class ValueRow:
    """One serialized value: ``digest`` of (``kind``, ``data``)."""

    digest: int
    kind: str
    data: bytes


@dataclass(frozen=True, slots=True)
class BlobRow:
    """A channel at ``version``: ``kind`` ``value``, ``list`` or ``empty``.

    ``refs`` is the whole value (packed digests). ``base``/``added``: a
    list that only grew since version ``base``, and its new items; stored
    as that delta only when ``base`` is still stored and its chain is below
    ``max_depth``, otherwise whole."""

    channel: str
    version: str
    kind: str
    refs: bytes
    base: str | None = None
    added: bytes = b""


@dataclass(frozen=True, slots=True)
class WriteRow:
    """A pending write of task ``task_id`` (``idx`` < 0: a special channel)."""

    task_id: str
    idx: int
    channel: str
    task_path: str
    kind: str
    refs: bytes


@dataclass(frozen=True, slots=True)
class CheckpointRow:
    """A stored checkpoint, still serialized."""

    thread_id: str
    ns: str
    checkpoint_id: str
    parent_id: str | None
    checkpoint_kind: str
    checkpoint: bytes
    metadata_kind: str
    metadata: bytes
    #: what the server may read of it (PostgreSQL, ``lg_read_one``): its channel
    #: versions stored as rows (``join_names``), and the packed digests of the
    #: values it names inline; ``None``: not written (a row of an older format)
    names: str | None = None
    refs: bytes | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A checkpoint read in one snapshot: its row, each channel's chain of
    ``(kind, refs)`` (oldest first), its writes, and the values they name."""

    row: CheckpointRow
    chains: dict[str, list[tuple[str, bytes]]]
    writes: list[WriteRow]
    values: dict[int, tuple[str, bytes]]


@dataclass(frozen=True, slots=True)
class Named:
    """What a checkpoint row names, as its reader decodes it: the channel
    versions stored as rows of ``lg_blobs`` (``versions``: channel ->
    version), and the digests of the values its row holds inline
    (``inline``: a channel version folded into the checkpoint's own row,
    ``cairn.langgraph``), which garbage collection keeps and a read fetches."""

    versions: Mapping[str, str]
    inline: Collection[int] = ()


#: how the reader decodes what a checkpoint row names
VersionsOf = Callable[[CheckpointRow], Named]
#: a checkpoint's channel chains, oldest first: (kind, refs, whether it names a base)
Chains = dict[str, list[tuple[str, bytes, bool]]]
#: a value's stored bytes as its reader reads them: (thread, digest, stored) -> bytes
Opener = Callable[[str, int, bytes], bytes]
#: a listed row to read, with how to read its channel versions and which lists the reader holds
Asked = tuple[CheckpointRow, VersionsOf, Callable[[str, bytes], bool]]


def unpack_refs(refs: bytes) -> list[int]:
    """The digests packed in ``refs`` (``pack_refs``)."""
    if len(refs) % REF_SIZE:  # not whole digests: the last is read from the bytes there are
        return [int.from_bytes(refs[i:i + REF_SIZE], "little", signed=True)
                for i in range(0, len(refs), REF_SIZE)]
    return [d for (d,) in _REF.iter_unpack(refs)]


def pack_refs(digests: Iterable[int]) -> bytes:
    """``digests``, ``REF_SIZE`` bytes each, little-endian and signed, in one
    C call (issue 24, 2026-12-07: a super-step packs eight sets of them)."""
    ds = digests if isinstance(digests, list) else list(digests)
    if len(ds) == 1:  # a value's, a write's: the struct made once, no format to build and look up
        return _REF.pack(ds[0])
    return struct.pack(f"<{len(ds)}q", *ds)


#: one packed digest (``REF_SIZE`` bytes)
_REF = struct.Struct("<q")


#: A *literal* ref (branch lgdisk): a value of at most ``LITERAL_BYTES`` bytes
#: of msgpack held in the 8 bytes a digest takes instead of a row of
#: ``lg_values`` it would name (a counter channel and the write that sets it
#: cost a value row a super-step: ~60 bytes on SQLite, ~100 on PostgreSQL
#: with its index entry). Its top 16 bits are ``LITERAL_TAG``, then the length,
#: then the bytes, zero-padded. A saver never gives a real digest those top
#: bits (``cairn.langgraph.digest`` moves it), so a literal is never a value's
#: digest; one written before (a 2**-16 chance per value) still has its row,
#: which a read finds and uses first. Never under encryption: a literal is
#: the value in plain.
LITERAL_TAG = 0xA5C3
LITERAL_BYTES = 5
_U64 = (1 << 64) - 1


def is_literal(d: int) -> bool:
    """Whether the ref ``d`` has a literal's tag (``literal``)."""
    return (d & _U64) >> 48 == LITERAL_TAG


def literal(data: bytes) -> int | None:
    """``data`` as a literal ref, or ``None`` when it is too long to be one."""
    if len(data) > LITERAL_BYTES:
        return None
    u = (LITERAL_TAG << 48) | (len(data) << 40) | int.from_bytes(data.ljust(LITERAL_BYTES, b"\0"), "big")
    return u - (1 << 64) if u >> 63 else u


def row_refs(refs: Iterable[bytes]) -> bytes:
    """The packed digests of ``refs`` that name rows (literals left out): what
    a checkpoint's ``refs`` column lists for ``lg_read_one`` to fetch."""
    return pack_refs([d for r in refs for d in unpack_refs(r) if not is_literal(d)])


def literal_bytes(d: int) -> bytes | None:
    """The bytes of the literal ref ``d``; ``None`` if it is not a well-formed one."""
    u = d & _U64
    if u >> 48 != LITERAL_TAG:
        return None
    size, payload = (u >> 40) & 0xFF, (u & ((1 << 40) - 1)).to_bytes(LITERAL_BYTES, "big")
    if size > LITERAL_BYTES or payload[size:].strip(b"\0"):
        return None
    return payload[:size]


#: what separates the channels and versions of ``CheckpointRow.names`` (the unit separator)
NAME_SEPARATOR = "\x1f"


def join_names(versions: Mapping[str, str]) -> str | None:
    """A checkpoint's channel versions stored as rows, as the server reads
    them (``lg_read_one``): ``channel, version, ...`` joined by
    ``NAME_SEPARATOR``; ``None`` when a name holds it (that row is read in
    three statements, as a row of an older format)."""
    parts = [p for pair in versions.items() for p in pair]
    if any(NAME_SEPARATOR in p for p in parts):
        return None
    return NAME_SEPARATOR.join(parts)


def split_names(names: str) -> dict[str, str]:
    """The channel versions ``join_names`` joined."""
    parts = names.split(NAME_SEPARATOR) if names else []
    return dict(zip(parts[0::2], parts[1::2], strict=False))


def held_lists(lists: Mapping[str, bytes]) -> tuple[str, bytes]:
    """The lists a reader holds as ``lg_read_one`` takes them: two scalars,
    not two arrays (psycopg dumps a list parameter in Python: ~40 us a read;
    issue 24, 2026-12-07). Every list's digests one after the other, and
    ``channel, offset, length, ...`` joined by ``NAME_SEPARATOR``. A channel
    whose name holds the separator is left out: the server then sends its
    chain and values, as for a list the reader does not hold."""
    parts: list[str] = []
    chunks: list[bytes] = []
    at = 0
    for channel, refs in lists.items():
        if NAME_SEPARATOR in channel:
            continue
        parts += (channel, str(at), str(len(refs)))
        chunks.append(refs)
        at += len(refs)
    return NAME_SEPARATOR.join(parts), b"".join(chunks)


def write_order(w: WriteRow) -> tuple[str, str, int]:
    """The order a checkpoint's pending writes are read in (the queries' own:
    task path, task id, index, as "C" strings)."""
    return w.task_path, w.task_id, w.idx


def fold_writes(writes: Sequence[WriteRow], *, compact: bool = False) -> bytes:
    """A checkpoint's pending writes as one record of its row: JSON (never
    anything a decoder could execute) of each write's fields, refs in hex,
    deflated with ``FOLD_DICTIONARY`` (a super-step's writes repeat their task id and path);
    ``compact``: the binary record instead (``FOLD_TAG_2``, PostgreSQL since 2026-12-06, issue 24)."""
    if compact:
        return FOLD_TAG_2 + deflate_raw(_binary_writes(writes), 9, FOLD_DICTIONARY_2)
    doc = [[w.task_id, w.idx, w.channel, w.task_path, w.kind, w.refs.hex()] for w in writes]
    return FOLD_TAG + deflate_raw(json.dumps(doc, separators=(",", ":")).encode(), 6, FOLD_DICTIONARY)


def _varint(n: int) -> bytes:
    if n < 0x80:  # one byte: most of them (an index, a channel's or a path's length)
        return _BYTES[n]
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


#: the one-byte varints (``_varint``), made once
_BYTES = tuple(bytes((i,)) for i in range(0x80))


def _text(value: str) -> bytes:
    data = value.encode()
    return _varint(len(data)) + data


#: a write's channel, task path and kind as ``_binary_writes`` spells them, by the three: a graph's
#: writes repeat a few (issue 24, 2026-12-07 afternoon: three ``_text`` calls a write were ~1/3 of
#: the record's Python); cleared when it holds ``_NAMES_MAX``
_NAMES: dict[tuple[str, str, str], bytes] = {}
_NAMES_MAX = 4096


def _binary_writes(writes: Sequence[WriteRow]) -> bytes:
    """The body of a ``FOLD_TAG_2`` record: per write its task id (``TASK_SAME``
    as the write before it, ``TASK_UUID`` and the 16 bytes of a UUID written in
    its canonical form, or ``TASK_TEXT`` and the text), its index (zigzag
    varint), channel, task path and kind (varint length, UTF-8), and its refs
    (varint length, raw). JSON spelled a task id in 36 characters and a digest
    in 16 hex digits: random, DEFLATE kept them near that (107 bytes a bench
    super-step); raw, the record takes about 55. Built as a list of parts
    joined once (issue 24, 2026-12-07: SQLite folds with it too, a super-step's
    three writes each put)."""
    parts: list[bytes] = []
    add = parts.append
    previous: str | None = None
    for w in writes:
        task_id = w.task_id
        if task_id == previous:
            add(_TASK_SAME)
        elif _is_uuid(task_id):
            add(_TASK_UUID)
            add(bytes.fromhex(task_id.replace("-", "")))
        else:
            add(_TASK_TEXT)
            add(_text(task_id))
        previous = task_id
        idx = w.idx
        add(_varint(idx << 1 if idx >= 0 else ((-idx) << 1) - 1))
        names = (w.channel, w.task_path, w.kind)
        spelled = _NAMES.get(names)
        if spelled is None:
            spelled = _text(w.channel) + _text(w.task_path) + _text(w.kind)
            if len(_NAMES) >= _NAMES_MAX:
                _NAMES.clear()
            _NAMES[names] = spelled
        add(spelled)
        add(_varint(len(w.refs)))
        add(w.refs)
    return b"".join(parts)


_TASK_SAME, _TASK_UUID, _TASK_TEXT = bytes((TASK_SAME,)), bytes((TASK_UUID,)), bytes((TASK_TEXT,))


def _is_uuid(text: str) -> bool:
    """Whether ``text`` is a UUID in the canonical form ``str(uuid.UUID(...))``
    gives back (``_CANONICAL``: lowercase hex digits and hyphens, 8-4-4-4-12)."""
    return len(text) == 36 and _CANONICAL.fullmatch(text) is not None


def _varint_at(data: bytes, at: int) -> tuple[int, int]:
    """The varint at ``at`` of ``data`` and the offset after it."""
    if at < len(data) and data[at] < 0x80:  # one byte: most of them
        return data[at], at + 1
    n = shift = 0
    while shift < 64:
        if at >= len(data):
            raise ValueError("a write is truncated")
        byte = data[at]
        at += 1
        n |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return n, at
        shift += 7
    raise ValueError("a write's number is too long")


def _text_at(data: bytes, at: int) -> tuple[str, int]:
    """The length-prefixed UTF-8 text at ``at`` of ``data`` and the offset after it."""
    size, at = _varint_at(data, at)
    if size > len(data) - at:
        raise ValueError("a write is truncated")
    return data[at:at + size].decode(), at + size


def _unbinary_writes(body: bytes) -> list[WriteRow]:
    """The writes of a ``FOLD_TAG_2`` body (``_binary_writes``); anything
    short or malformed is a ``ValueError``. Offsets into ``body`` kept in
    locals, not a reader object whose method took each byte (issue 24,
    2026-12-07: ~25 us of a get_state's ~0.5 ms of client CPU went to three writes)."""
    out: list[WriteRow] = []
    previous: str | None = None
    at, end = 0, len(body)
    while at < end:
        marker = body[at]
        at += 1
        if marker == TASK_SAME and previous is not None:
            task_id = previous
        elif marker == TASK_UUID:
            if end - at < 16:
                raise ValueError("a write is truncated")
            h = body[at:at + 16].hex()  # str(uuid.UUID(bytes=...)): its canonical form
            task_id = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
            at += 16
        elif marker == TASK_TEXT:
            task_id, at = _text_at(body, at)
        else:
            raise ValueError(f"a write starts with {marker:#x}")
        zigzag, at = _varint_at(body, at)
        idx = zigzag >> 1 if not zigzag & 1 else -((zigzag + 1) >> 1)
        channel, at = _text_at(body, at)
        task_path, at = _text_at(body, at)
        kind, at = _text_at(body, at)
        size, at = _varint_at(body, at)
        if size > end - at:
            raise ValueError("a write is truncated")
        refs = body[at:at + size]
        at += size
        if size % REF_SIZE:
            raise ValueError("a write's digests are truncated")
        out.append(WriteRow(task_id, idx, channel, task_path, kind, refs))
        previous = task_id
    if not out:
        raise ValueError("it holds no write")
    return out


def unfold_writes(data: bytes, thread_id: str, checkpoint_id: str) -> list[WriteRow]:
    """The writes ``fold_writes`` folded, in the read order (``write_order``);
    a record that is not one (damaged, hostile, oversized) is an
    ``UnreadableCheckpoint`` naming the checkpoint.

    ``data`` may be records one after another (PostgreSQL appends each
    ``put_writes``' record to the checkpoint's row: ``lg_put_writes_many``;
    a DEFLATE stream ends itself, so the next record starts where it ends).
    Across records, as ``lg_writes`` keeps them, a regular write (index >= 0)
    of a task is kept as first written and a special one (index < 0) as last written."""
    try:
        out: list[WriteRow] = []
        rest, records, budget = data, 0, FOLD_LIMIT
        while rest or not records:  # the records' JSON together inflates to FOLD_LIMIT at most
            writes, rest, budget = _unfold_one(rest, budget)
            out += writes
            records += 1
        kept: dict[tuple[str, int], WriteRow] = {}
        for w in out:
            if w.idx < 0 or (w.task_id, w.idx) not in kept:
                kept[(w.task_id, w.idx)] = w
        return sorted(kept.values(), key=write_order)
    except (ValueError, zlib.error, RecursionError) as exc:
        raise UnreadableCheckpoint(f"checkpoint {checkpoint_id!r} of thread {thread_id!r}: cannot read its "
                                   f"folded pending writes: {exc}") from None


def _unfold_one(data: bytes, budget: int) -> tuple[list[WriteRow], bytes, int]:
    """The writes of the record ``data`` starts with, the bytes after it, and
    what is left of ``budget`` (the bytes it may inflate to)."""
    compact = data.startswith(FOLD_TAG_2)
    if not compact and not data.startswith(FOLD_TAG):
        raise ValueError("it is not a record of folded writes")
    if budget <= 0:  # (zlib reads a limit of 0 as none)
        raise ValueError(f"it inflates beyond {FOLD_LIMIT:,} bytes")
    inflate = zlib.decompressobj(-15, zdict=FOLD_DICTIONARY_2 if compact else FOLD_DICTIONARY)
    raw = inflate.decompress(data[len(FOLD_TAG):], budget)
    if inflate.unconsumed_tail or not inflate.eof:
        raise ValueError(f"it is truncated or inflates beyond {FOLD_LIMIT:,} bytes")
    if compact:
        return _unbinary_writes(raw), inflate.unused_data, budget - len(raw)
    doc = json.loads(raw)
    if not isinstance(doc, list):
        raise ValueError("it is not a list")
    out = []
    for w in doc:
        if (not isinstance(w, list) or len(w) != 6 or type(w[1]) is not int
                or not all(isinstance(w[i], str) for i in (0, 2, 3, 4, 5))):
            raise ValueError(f"a write is malformed: {str(w)[:60]}")
        refs = bytes.fromhex(w[5])
        if len(refs) % REF_SIZE:
            raise ValueError("a write's digests are truncated")
        out.append(WriteRow(w[0], w[1], w[2], w[3], w[4], refs))
    return out, inflate.unused_data, budget - len(raw)


def read_writes(found: Iterable[tuple[Any, ...]], thread_id: str, checkpoint_id: str) -> list[WriteRow]:
    """A checkpoint's pending writes from the rows a query returned: rows of
    ``lg_writes`` (task id, index, channel, task path, kind, refs) and, as a
    row whose task id is NULL, the record folded in its checkpoint's row."""
    folded: list[WriteRow] = []
    side: list[WriteRow] = []
    for task_id, idx, channel, task_path, kind, refs in found:
        if task_id is None:
            folded += unfold_writes(bytes(refs), thread_id, checkpoint_id)
        else:
            side.append(WriteRow(str(task_id), int(idx), str(channel), str(task_path), str(kind),
                                 bytes(refs)))
    if folded and side:
        return _merged(folded, side)
    return folded or side


def _merged(folded: list[WriteRow], side: list[WriteRow]) -> list[WriteRow]:
    """A checkpoint's folded writes and its rows of ``lg_writes`` as one list,
    in the read order, one write per task and index, as ``lg_writes`` keeps
    them (a regular write as first written, a special one as last written).
    A write goes into the record once its checkpoint is stored, so a row is
    the earlier write: it wins a regular write and loses a special one. Returning
    both (as until 2026-12-07) gave LangGraph a retried task's write twice,
    which it would apply twice on resuming the checkpoint."""
    kept = {(w.task_id, w.idx): w for w in folded}
    for w in side:
        if w.idx >= 0 or (w.task_id, w.idx) not in kept:
            kept[(w.task_id, w.idx)] = w
    return sorted(kept.values(), key=write_order)


def thread_taken(thread_id: str, epoch: int, lease: int | None) -> ThreadTaken:
    """The refusal of a writer whose thread another holds at ``epoch`` (``hold_rule``;
    PostgreSQL's ``lg_hold`` raises SQLSTATE LGT01 with ``epoch``, mapped here)."""
    if lease is None:
        return ThreadTaken(f"LangGraph thread {thread_id!r} was taken by another saver (epoch {epoch}): "
                           f"this saver's writes to it are refused")
    return ThreadTaken(f"LangGraph thread {thread_id!r} is held by a later lease (epoch {epoch}, this "
                       f"writer's is {lease}): this writer's writes are refused")


#: the owner of a holder row made by a collection (``lg_count_collection``) of a thread that
#: nobody held (a ``copy_thread`` target never written): nobody holds the thread, and a first
#: write that read the count before that collection is refused (``Stale``). A saver's owner
#: is never empty.
NOBODY = ""
#: the count a saver's first write expects of a thread that had no holder row when it read
#: it (``lg_collected``): a row made since by a collection refuses it, and a thread whose row
#: was there then and is gone now (deleted since) refuses a write expecting its count
NO_ROW = -1


def hold_rule(found: Sequence[tuple[Any, ...]], holder: Holder, thread_id: str) -> tuple[int, bool, int]:
    """The fence (see the module): the epoch ``holder`` holds the thread at,
    whether it takes it (writes its row of ``lg_threads``) and the thread's
    collection count, given its holder row ``found`` (owner, epoch,
    collected; none: nobody holds it), read under the thread's lock;
    ``ThreadTaken`` when refused, ``Stale`` when the holder's memory is
    (its count is not the thread's, or it held a thread deleted since).
    SQLite runs it in the client; PostgreSQL's ``lg_hold`` (migrations 0051,
    0052, 0053) is the same rule in the server, held to the same answers by
    tests/langgraph/test_server_fence.py. A row owned by ``NOBODY`` is held by
    nobody, and its count counts; a first write expects the count it read,
    or ``NO_ROW``."""
    # a row whose owner is NOBODY was made by a collection of a thread nobody held: it counts,
    # nobody holds the thread
    held = (str(found[0][0]), int(found[0][1])) if found and found[0][0] != NOBODY else None
    collected = int(found[0][2]) if found else 0
    lease = holder.lease
    if lease is not None:  # fenced by a run's lease: refused once a later lease took the thread
        if held is not None and held[1] > lease:
            raise thread_taken(thread_id, held[1], lease)
    elif held is not None and held[0] != holder.owner and holder.epoch is not None:
        raise thread_taken(thread_id, held[1], None)  # it held the thread, and another took it since
    if holder.collected is not None:  # what it remembers of the thread was made at that count
        if held is None and holder.epoch is not None:
            raise Stale(thread_id, None)  # deleted since it wrote
        if not found and holder.collected != NO_ROW:
            raise Stale(thread_id, None)  # deleted since it read the count
        if found and collected != max(holder.collected, 0):
            raise Stale(thread_id, collected)  # collected since it wrote, or since it read the count
    if lease is not None:
        return lease, held != (holder.owner, lease), collected
    if held is None:
        return 1, True, collected
    owner, epoch = held
    if owner == holder.owner:
        return epoch, False, collected
    return epoch + 1, True, collected


#: statements that close a LangGraph write's transaction (``SQLCheckpoints._lg_operate``)
Closing = list[tuple[str, dict[str, Any]]]
#: what a fenced statement checks (``SQLCheckpoints._lg_operate``): the thread's holder row is
#: ``{"owner": ..., "epoch": ..., "collected": ...}``, else it changes nothing (``_Unfenced``)
Fence = dict[str, Any]


class SQLCheckpoints(SQLPrimitives[Tx]):
    """The LangGraph checkpoint methods of the SQL stores over a dialect's primitives."""

    #: whether the dialect writes a put's rows in one statement per table
    #: (``lg_put_*_many``, PostgreSQL: a round trip each); else row by row
    _lg_arrays = False
    #: whether the dialect reads checkpoints with few statements outside a
    #: transaction (``_lg_reading``: PostgreSQL, where each statement is a
    #: round trip); else row by row in one snapshot (SQLite: a statement is a call)
    _lg_batched = False
    #: whether the dialect's ``lg_put_checkpoint`` also writes the parent's
    #: folded writes (``folded_id``, ``folded``); else ``lg_set_folded`` does
    _lg_fold_in_put = False
    #: whether the dialect folds writes into the binary record (``FOLD_TAG_2``); else JSON (``FOLD_TAG``)
    _lg_compact_fold = False
    #: a saver stores a list's versions as rows of ``lg_blobs`` every this many versions, and
    #: those between as tails in the checkpoint's row (``cairn.langgraph.TAIL``); 1: every version a row
    lg_tail_every = 1
    #: a saver compresses a checkpoint's metadata whatever its length (``cairn.langgraph.CHECKPOINT_LEVEL``):
    #: PostgreSQL stores its kind as '' (queries.sql); SQLite keeps metadata whole (its kind text would
    #: take back most of the ~19 bytes)
    lg_pack_metadata = False
    #: whether ``lg_lock_thread`` is a statement to run: SQLite's is ``SELECT 1`` (its write
    #: transaction, ``BEGIN IMMEDIATE``, holds the whole database), a call a write for nothing
    _lg_lock_statement = True

    # -- dialect primitive of its own (the others: sqlprimitives.SQLPrimitives) --------

    def _in_statements(self, work: Callable[[Tx], T]) -> T:
        """Run ``work``'s statements each on its own (no transaction around
        them): only dialects with ``_lg_batched`` provide it."""
        raise NotImplementedError

    # -- writes -------------------------------------------------------------------------

    def lg_put(self, key: ThreadKey, holder: Holder, row: CheckpointRow, run_id: str | None,
               blobs: Sequence[BlobRow], values: Sequence[ValueRow], *, max_depth: int) -> tuple[int, int]:
        """Store a checkpoint, the channel versions it made and their values, in
        one transaction; the epoch ``holder`` holds the thread at and the
        thread's collection count (``Stale``: nothing written)."""
        where = _where(key)
        folding = row.parent_id is not None and row.parent_id != row.checkpoint_id
        # the statements that need nothing read first go in the opening (_lg_operate): on
        # PostgreSQL one message with the fence and, unless the fold moves rows, the COMMIT
        opening: list[tuple[str, dict[str, Any]]] = []
        fold: tuple[str, dict[str, Any]] | None = None
        if self._lg_arrays:
            opening += self._lg_values_many(where, values)
            if blobs:  # none when every list version is a tail (TAIL)
                opening.append(("lg_put_blobs_many", {
                    **where, "max_depth": max_depth, "channels": [b.channel for b in blobs],
                    "versions": [b.version for b in blobs], "kinds": [b.kind for b in blobs],
                    "bases": [b.base for b in blobs], "refs": [b.refs for b in blobs],
                    "added": [b.added for b in blobs]}))
        if folding:
            fold = ("lg_fold_writes", {**where, "checkpoint_id": row.parent_id})

        def close(tx: Tx, moved: list[tuple[Any, ...]] | None, fence: Fence | None = None) -> Closing:
            if not self._lg_arrays:
                self._lg_put_values(tx, where, values)
            for blob in () if self._lg_arrays else blobs:
                # the base's depth is read by the insert itself (a base not stored, or as deep as
                # max_depth: the version is stored whole)
                self._query(tx, "lg_put_blob", {
                    **where, "channel": blob.channel, "version": blob.version, "kind": blob.kind,
                    "base": blob.base, "max_depth": max_depth, "refs": blob.refs, "added": blob.added})
            folded = self._lg_fold(tx, where, row, moved)
            # the checkpoint closes the transaction (_lg_operate: on PostgreSQL sent with the COMMIT)
            params = {
                **where, "checkpoint_id": row.checkpoint_id, "parent_id": row.parent_id, "run_id": run_id,
                "checkpoint_kind": row.checkpoint_kind, "checkpoint": row.checkpoint,
                "metadata_kind": row.metadata_kind, "metadata": row.metadata, "names": row.names,
                "refs": row.refs, "folded_id": row.parent_id if folded is not None else None,
                "folded": None if folded is None else folded[0],
                "folded_refs": None if folded is None else folded[1]}
            if fence is None:
                return [("lg_put_checkpoint", params)]
            # the fence and the row in one statement: it writes nothing unless the holder is the fence's
            if not self._changed(tx, "lg_put_checkpoint", {**params, **fence}):
                raise _Unfenced
            return []

        return self._lg_operate(key, holder, opening, close, fold,
                                before_commit="langgraph.put.before_commit")

    def lg_put_writes(self, key: ThreadKey, holder: Holder, checkpoint_id: str, writes: Sequence[WriteRow],
                      values: Sequence[ValueRow]) -> tuple[int, int]:
        """Store pending writes in one transaction, committed before this
        returns; the epoch ``holder`` holds the thread at and the thread's
        collection count (``Stale``: nothing written)."""
        where = _where(key)
        opening: list[tuple[str, dict[str, Any]]] = []
        if self._lg_arrays:  # all in the opening (_lg_operate): on PostgreSQL one message with the COMMIT
            opening += self._lg_values_many(where, values)
            if writes:
                opening.append(("lg_put_writes_many", {
                    **where, "checkpoint_id": checkpoint_id, "task_ids": [w.task_id for w in writes],
                    "idxs": [w.idx for w in writes], "channels": [w.channel for w in writes],
                    "task_paths": [w.task_path for w in writes], "kinds": [w.kind for w in writes],
                    "refs": [w.refs for w in writes],
                    # PostgreSQL: appended to the checkpoint's row when it is stored (lg_put_writes_many)
                    "record": fold_writes(writes, compact=self._lg_compact_fold),
                    "record_refs": row_refs(w.refs for w in writes)}))

        def close(tx: Tx, moved: list[tuple[Any, ...]] | None, fence: Fence | None = None) -> Closing:
            if fence is None:
                return []
            self._lg_put_values(tx, where, values)
            if not writes:  # (``hold``) nothing to write: the fence alone, read
                if [tuple(r) for r in self._query(tx, "lg_thread_holder", where)] != [
                        (fence["owner"], fence["epoch"], fence["collected"])]:
                    raise _Unfenced
                return []
            # the record appended to the checkpoint's row, stored or pending (SQLite's lg_put_record), in
            # one statement with the fence: it changes nothing unless the holder is the fence's
            if not self._changed(tx, "lg_put_record", {
                    **where, **fence, "checkpoint_id": checkpoint_id,
                    "record": fold_writes(writes, compact=self._lg_compact_fold)}):
                raise _Unfenced
            return []

        return self._lg_operate(key, holder, opening, close)

    # -- reads --------------------------------------------------------------------------

    def lg_read(self, key: ThreadKey, checkpoint_id: str | None,
                versions_of: VersionsOf,
                known: Callable[[str, bytes], bool] = lambda channel, refs: False,
                opener: Opener | None = None, lists: Mapping[str, bytes] | None = None) -> Snapshot | None:
        """The checkpoint ``checkpoint_id`` (the latest of the namespace if
        ``None``) with its channels, writes and values, from one snapshot;
        ``versions_of`` decodes the row's channel versions; the values of a
        list channel whose items the caller holds already (``known(channel,
        refs)``) are not fetched; ``opener(thread, digest, data)``: a value's
        bytes as the caller reads them (opened, when sealed), applied once per
        value fetched. ``lists``: the digests of the lists the caller holds,
        by channel (``known`` answers from them), which a dialect reading in
        one statement (``lg_read_one``) sends so the server leaves their values out."""
        if self._lg_batched:
            one = self._lg_read_one(key, checkpoint_id, versions_of, known, opener, lists or {})
            if not isinstance(one, _Older):
                return one

        def work(tx: Tx, whole: bool) -> Snapshot | None:
            where = _where(key)
            if checkpoint_id is None:
                found = self._query(tx, "lg_latest_checkpoint", where)
            else:
                found = self._query(tx, "lg_checkpoint", {**where, "checkpoint_id": checkpoint_id})
            if not found:
                return None
            return self._lg_fill(tx, key.tenant, [(_row(found[0]), versions_of, known)], {}, whole,
                                 opener)[0]

        return self._lg_reading(work)

    def _lg_read_one(self, key: ThreadKey, checkpoint_id: str | None, versions_of: VersionsOf,
                     known: Callable[[str, bytes], bool], opener: Opener | None,
                     lists: Mapping[str, bytes]) -> Snapshot | _Older | None:
        """``lg_read`` in one statement, one snapshot (``lg_read_one``:
        PostgreSQL, whose rows since migration 0045 name their channel
        versions and values in columns the server reads). A list the caller
        holds (its digests in ``lists`` start with the chain's: the server
        compares) comes back as that prefix of ``lists``, its chain and
        values not sent. ``_OLDER`` when the row cannot be read so (written
        before, or its columns disagree with its checkpoint), or when the
        caller no longer holds a list the server left out (``known`` says
        no: its copy changed since): ``lg_read`` reads it as before."""
        held, held_refs = held_lists(lists)
        found = self._in_statements(lambda tx: self._query(tx, "lg_read_one", {
            **_where(key), "checkpoint_id": checkpoint_id, "known": held, "known_refs": held_refs}))
        head = [r for r in found if r[0] == 0]
        if not head:
            return None
        _, cid, parent, ckind, mkind, names, ckpt, meta, _ = head[0]
        if names is None:
            return _OLDER
        row = CheckpointRow(key.thread_id, key.ns, str(cid), None if parent is None else str(parent),
                            str(ckind), bytes(ckpt), str(mkind), bytes(meta))
        named = versions_of(row)
        if split_names(str(names)) != dict(named.versions):
            return _OLDER
        links: dict[str, list[tuple[int, str, bytes, bool]]] = {}
        written: list[tuple[Any, ...]] = []
        values: dict[int, tuple[str, bytes]] = {}
        for part, a, b, c, d, _, data, _, n in found:
            if part == 1:  # a chain's blob: channel, kind, base, depth
                links.setdefault(str(a), []).append((int(n), str(b), bytes(data), c is not None))
            elif part == 2:  # a row of lg_writes: task id, channel, task path, kind, index
                written.append((str(a), int(n), str(b), str(c), str(d), bytes(data)))
            elif part == 3:  # the folded writes
                written.append((None, None, None, None, None, bytes(data)))
            elif part == 4:  # a value: kind, digest
                raw = bytes(data)
                values[int(n)] = (str(b), raw if opener is None else opener(key.thread_id, int(n), raw))
            elif part == 5:  # a list the caller holds: the first n bytes of the digests it sent
                links[str(a)] = [(0, "list", lists[str(a)][:int(n)], False)]
        written.sort(key=lambda w: ("", "", 0) if w[0] is None else (w[3], w[0], w[1]))
        writes = read_writes(written, key.thread_id, row.checkpoint_id)
        chains = {ch: [(k, r) for _, k, r, _ in sorted(links[ch])] for ch in named.versions if ch in links}
        wanted = set(named.inline)
        for channel, chain in chains.items():
            refs = b"".join(r for _, r in chain)
            if not (chain[-1][0] == "list" and known(channel, refs)):
                wanted.update(unpack_refs(refs))
        for w in writes:
            wanted.update(unpack_refs(w.refs))
        # left out as the caller's, which its copy no longer starts with (a literal names no row)
        if any(not is_literal(d) for d in wanted - values.keys()):
            return _OLDER
        return Snapshot(row, chains, writes, values)

    def lg_read_page(self, key: ThreadKey, before: str | None, limit: int,
                     asking: Callable[[CheckpointRow], tuple[VersionsOf, Callable[[str, bytes], bool]]],
                     opener: Opener | None = None, lists: Mapping[str, bytes] | None = None
                     ) -> list[Snapshot] | None:
        """A page of the namespace's checkpoints, newest first (before
        ``before``, at most ``limit``), with their channels, writes and
        values, in one statement, one snapshot (``lg_read_page``: a history
        page on PostgreSQL, ``lg_read_one`` for several rows); ``asking(row)``
        gives a row's ``versions_of`` and ``known`` (as ``lg_snapshots``
        takes them), ``lists`` as ``lg_read``. ``None`` when the dialect does
        not, or when a row cannot be read so (written before migration 0045,
        its columns disagree with its checkpoint, a value is missing, a held
        list is no longer held): the caller lists and reads it as before,
        which reports a damaged row naming its checkpoint."""
        if not self._lg_batched:
            return None
        lists = lists or {}
        held_names = list(lists)
        found = self._in_statements(lambda tx: self._query(tx, "lg_read_page", {
            **_where(key), "before": before, "limit": limit, "known_channels": held_names,
            "known_refs": [lists[n] for n in held_names]}))
        blobs: dict[tuple[str, str], tuple[str, str | None, bytes]] = {}
        held: dict[tuple[str, str], int] = {}
        written: dict[str, list[tuple[Any, ...]]] = {}
        values: dict[int, tuple[str, bytes]] = {}
        heads = []
        for part, a, b, c, d, e, data, meta, n in found:
            if part == 0:  # a checkpoint: id, parent, kinds, names
                heads.append((a, b, c, d, e, data, meta))
            elif part == 1:  # a blob: channel, version, kind, base
                blobs[(str(a), str(b))] = (str(c), None if d is None else str(d), bytes(data))
            elif part == 5:  # a list the caller holds at that version: the first n bytes of its copy
                held[(str(a), str(b))] = int(n)
            elif part == 2:  # a row of lg_writes: task id, channel, task path, kind, checkpoint, index
                written.setdefault(str(e), []).append((str(a), int(n), str(b), str(c), str(d), bytes(data)))
            elif part == 3:  # a checkpoint's folded writes
                written.setdefault(str(a), []).append((None, None, None, None, None, bytes(data)))
            elif part == 4:  # a value: kind, digest
                raw = bytes(data)
                values[int(n)] = (str(b), raw if opener is None else opener(key.thread_id, int(n), raw))
        heads.sort(key=lambda h: str(h[0]).encode(), reverse=True)  # the key's "C" order, newest first
        out = []
        wanted: set[int] = set()
        for cid, parent, ckind, mkind, names, ckpt, meta in heads:
            if names is None:
                return None
            row = CheckpointRow(key.thread_id, key.ns, str(cid), None if parent is None else str(parent),
                                str(ckind), bytes(ckpt), str(mkind), bytes(meta))
            versions_of, known = asking(row)
            named = versions_of(row)
            if split_names(str(names)) != dict(named.versions):
                return None
            chains: Chains = {}
            for channel, version in named.versions.items():
                if (channel, version) in held:
                    chains[channel] = [("list", lists[channel][:held[(channel, version)]], False)]
                    continue
                links: list[tuple[str, bytes, bool]] = []
                at: str | None = version
                while at is not None and (channel, at) in blobs and len(links) <= len(blobs):
                    kind, at, refs = blobs[(channel, at)]
                    links.append((kind, refs, at is not None))
                if links:
                    chains[channel] = links[::-1]  # oldest first
            wanted.update(named.inline)
            for channel, chain in chains.items():
                refs = b"".join(r for _, r, _ in chain)
                if not (chain[-1][0] == "list" and known(channel, refs)):
                    wanted.update(unpack_refs(refs))
            ordered = sorted(written.get(row.checkpoint_id, []),
                             key=lambda w: ("", "", 0) if w[0] is None else (w[3], w[0], w[1]))
            writes = read_writes(ordered, key.thread_id, row.checkpoint_id)
            for w in writes:
                wanted.update(unpack_refs(w.refs))
            out.append(Snapshot(row, {ch: [(k, r) for k, r, _ in chain] for ch, chain in chains.items()},
                                writes, values))
        # a value missing, or left out as the caller's list which its copy no longer starts with
        if any(not is_literal(d) for d in wanted - values.keys()):
            return None
        return out

    def lg_collected(self, key: ThreadKey) -> int:
        """The thread's collection count now (``lg_threads.collected``;
        ``NO_ROW`` when it has no holder row): what a saver's first write
        expects (``Holder.collected``)."""
        where = {"tenant": key.tenant, "thread_id": key.thread_id}
        # one statement: on PostgreSQL without a transaction around it (one round trip, not three)
        run = self._in_statements if self._lg_batched else self._in_read
        found = run(lambda tx: self._query(tx, "lg_thread_count", where))
        return int(found[0][0]) if found else NO_ROW

    def lg_dictionary(self, tenant: str, thread_id: str, digest: int | None) -> tuple[int, bytes] | None:
        """A compression dictionary of the thread (``cairn.lgdictionary``):
        the one of ``digest``, or with ``None`` the thread's first (by
        digest, so every saver of the thread finds the same); its digest and bytes."""
        where = {"tenant": tenant, "thread_id": thread_id}
        if digest is None:
            found = self._in_read(lambda tx: self._query(tx, "lg_first_dictionary", where))
        else:
            found = self._in_read(lambda tx: self._query(tx, "lg_dictionary", {**where, "digest": digest}))
        return (int(found[0][0]), bytes(found[0][1])) if found else None

    def lg_present(self, key: ThreadKey, channel: str, versions: Collection[str],
                   digests: Collection[int]) -> bool:
        """Whether each of the channel's ``versions`` is a row of ``lg_blobs``
        and each value of ``digests`` is stored: a saver's first write keeps a
        list it read before the thread's count only if so (``CairnSaver._expecting``)."""
        wanted = sorted({d for d in digests if not is_literal(d)})

        def work(tx: Tx) -> bool:
            where = _where(key)
            if not all(self._query(tx, "lg_blob_depth", {**where, "channel": channel, "version": v})
                       for v in versions):
                return False
            found = self._lg_values_of(tx, key.tenant, [(key.thread_id, d) for d in wanted]) if wanted else []
            return {int(r[1]) for r in found}.issuperset(wanted)
        return self._in_read(work)

    def lg_row(self, key: ThreadKey, checkpoint_id: str) -> CheckpointRow | None:
        """The row of checkpoint ``checkpoint_id``, alone (a put reads its
        parent's inline channel versions when its reader does not hold them)."""
        found = self._in_read(lambda tx: self._query(tx, "lg_checkpoint", {**_where(key),
                                                                            "checkpoint_id": checkpoint_id}))
        return _row(found[0]) if found else None

    def lg_stored(self, key: ThreadKey, versions: Mapping[str, str]) -> set[str]:
        """The channels of ``versions`` whose version is a row of ``lg_blobs``
        (a put naming versions it does not write checks they exist)."""
        def work(tx: Tx) -> set[str]:
            where = _where(key)
            return {channel for channel, version in versions.items()
                    if self._query(tx, "lg_blob_depth", {**where, "channel": channel, "version": version})}
        return self._in_read(work)

    def lg_list(self, tenant: str, thread_id: str | None, ns: str | None, checkpoint_id: str | None,
                before: str | None, limit: int | None) -> list[CheckpointRow]:
        """Checkpoint rows, newest first within each thread and namespace."""
        params = {"tenant": tenant, "thread_id": thread_id, "ns": ns, "checkpoint_id": checkpoint_id,
                  "before": before, "limit": limit}
        name = "lg_list_checkpoints"
        if thread_id is not None and ns is not None and checkpoint_id is None:
            # one thread's namespace (a graph's history): read from its key's end, not sorted whole
            name = "lg_list_thread" if before is None else "lg_list_thread_before"
        read = self._in_statements if self._lg_batched else self._in_read
        # one statement: a snapshot of its own, no BEGIN and COMMIT around it
        # (PostgreSQL: a history page's first round trip, not three)
        return read(lambda tx: [_row(r) for r in self._query(tx, name, params)])

    def lg_snapshots(self, tenant: str, asked: Sequence[Asked], opener: Opener | None = None
                     ) -> list[Snapshot]:
        """Each row's channels, writes and values (a page of a listing), in
        one read: ``asked`` holds each row with its ``versions_of`` and
        ``known`` (as ``lg_read`` takes them)."""
        def work(tx: Tx, whole: bool) -> list[Snapshot]:
            return self._lg_fill(tx, tenant, asked, {}, whole, opener)  # a page's values: each fetched once

        return self._lg_reading(work) if asked else []

    def _lg_reading(self, work: Callable[[Tx, bool], T]) -> T:
        """``work`` done as the dialect reads best: in one snapshot
        (``work(tx, True)``), or, with ``_lg_batched``, first as statements
        of their own (``work(tx, False)``: no BEGIN and COMMIT, two round
        trips fewer), which holds as long as what they read is whole: a
        checkpoint's rows never change once written but for a delete, so
        the statements read what one snapshot would unless a delete (prune,
        delete_thread, delete_for_runs) ran between them, and then a chain
        or a value is missing (``_Incomplete``) and the read is done again
        in one snapshot."""
        if self._lg_batched:
            try:
                return self._in_statements(lambda tx: work(tx, False))
            except _Incomplete:
                pass
        return self._in_read(lambda tx: work(tx, True))

    # -- deletions and copies -------------------------------------------------------------

    def lg_delete_thread(self, tenant: str, thread_id: str) -> None:
        def body(tx: Tx) -> None:
            where = self._lg_lock(tx, ThreadKey(tenant, thread_id, ""))
            for table in ("checkpoints", "blobs", "writes", "values", "holder"):
                self._query(tx, f"lg_delete_thread_{table}", where)

        self._operate(body)

    def lg_delete_runs(self, tenant: str, run_ids: Sequence[str],
                       versions_of: VersionsOf) -> None:
        """Delete the checkpoints written by ``run_ids``, their writes, and what nothing names any more."""

        def body(tx: Tx) -> None:
            gone = self._query(tx, "lg_delete_runs", {"tenant": tenant,
                                                      "run_ids": self._lg_ids_param(list(run_ids))})
            for thread_id in sorted({r[0] for r in gone}):
                where = self._lg_lock(tx, ThreadKey(tenant, thread_id, ""))
                self._query(tx, "lg_delete_orphan_writes", where)
                self._lg_drop_pending(tx, where)
                self._lg_collect(tx, where, versions_of)

        self._operate(body)

    def lg_prune(self, tenant: str, thread_ids: Sequence[str], keep_latest: bool,
                 versions_of: VersionsOf) -> None:
        """Keep only each namespace's latest checkpoint (or nothing) of each thread."""

        def body(tx: Tx) -> None:
            for thread_id in thread_ids:
                where = self._lg_lock(tx, ThreadKey(tenant, thread_id, ""))
                if not keep_latest:
                    for table in ("checkpoints", "blobs", "writes", "values", "holder"):
                        self._query(tx, f"lg_delete_thread_{table}", where)
                    continue
                self._query(tx, "lg_delete_older", where)
                self._query(tx, "lg_delete_orphan_writes", where)
                self._lg_drop_pending(tx, where)
                self._lg_collect(tx, where, versions_of)

        self._operate(body)

    def lg_copy_thread(self, tenant: str, source: str, target: str) -> None:
        """Copy every row of thread ``source`` to ``target`` (rows ``target`` has are kept)."""

        def body(tx: Tx) -> None:
            self._lg_lock(tx, ThreadKey(tenant, target, ""))
            for table in ("values", "blobs", "writes", "checkpoints"):
                self._query(tx, f"lg_copy_{table}", {"tenant": tenant, "source": source, "target": target})

        self._operate(body)

    # -- inside a transaction -------------------------------------------------------------

    def _lg_lock(self, tx: Tx, key: ThreadKey) -> dict[str, Any]:
        where = _where(key)
        if self._lg_lock_statement:
            self._query(tx, "lg_lock_thread", where)
        return where

    def _lg_operate(self, key: ThreadKey, holder: Holder,
                    opening: Sequence[tuple[str, Mapping[str, Any]]],
                    close: Callable[..., Closing],
                    fold: tuple[str, Mapping[str, Any]] | None = None,
                    before_commit: str | None = None) -> tuple[int, int]:
        """Run a write in one durable transaction holding the thread
        (``lg_lock_thread``) for ``holder`` (``hold_rule``: a refused write
        raises ``ThreadTaken`` or ``Stale`` and writes nothing), returning
        the epoch it holds the thread at and the thread's collection count.
        Then the statements of ``opening``, then the
        statement ``fold`` (``lg_fold_writes``), then the statements
        ``close(tx, rows fold moved)`` returns (``None`` without ``fold``),
        then the fault point ``before_commit``. ``close`` also takes the
        ``Fence`` its fenced statements check (a dialect that checks the fence
        itself, PostgreSQL's ``lg_hold``, gives none). ``opening`` therefore never
        depends on what an earlier statement returned, nor the closing on
        anything but the rows ``fold`` moved: PostgreSQL sends the write as
        one message with its COMMIT when ``fold`` moves nothing, else in two
        (issue 24, 2026-12-07, ``PostgresStore._lg_operate``)."""
        def run(tx: Tx, guess: tuple[int, int] | None) -> tuple[int, int]:
            if guess is not None:  # the fence checked by the write's own statements
                (epoch, collected), took = guess, False
            else:
                where = self._lg_lock(tx, key)
                epoch, took, collected = self._lg_hold(tx, where, holder,
                                                       self._query(tx, "lg_thread_holder", where))
            for name, params in opening:
                self._query(tx, name, params)
            moved = None
            if fold is not None:  # not run (nothing to move): none moved
                moved = self._query(tx, *fold) if took or self._lg_fold_wanted(fold[1]) else []
            fence = {"owner": holder.owner, "epoch": epoch, "collected": collected}
            for name, params in close(tx, moved, fence):
                self._query(tx, name, params)
            if before_commit is not None and faults.ARMED:
                fault_point(before_commit)
            return epoch, collected

        # A writer that held the thread (or holds a lease) expects its holder row as it left it:
        # its statements check it themselves (issue 24, 2026-12-07 afternoon: on SQLite the
        # holder's SELECT was one of a super-step's 13 statements, twice). If one finds another
        # holder (``_Unfenced``: nothing written), the write is rolled back and run again as
        # ever, the holder read and ``hold_rule`` deciding: refused, taken, stale, or written.
        # A writer that expects no collection count (``Holder.collected``) reads the holder.
        epoch = holder.lease if holder.lease is not None else holder.epoch
        # A first write (this saver never held the thread: ``holder.epoch`` is None, even under a
        # lease) reads the holder: its row, if any, names another owner, so a guess would only fail.
        guess = (None if epoch is None or holder.epoch is None or holder.collected is None
                 else (epoch, holder.collected))
        if guess is not None:
            try:
                return self._operate(lambda tx: run(tx, guess))
            except _Unfenced:
                pass
        return self._operate(lambda tx: run(tx, None))

    def _lg_hold(self, tx: Tx, where: Mapping[str, Any], holder: Holder, found: list[tuple[Any, ...]]
                 ) -> tuple[int, bool, int]:
        """The epoch ``holder`` holds the thread at, taking it if it may
        (``hold_rule``), whether it took it now, and the thread's collection
        count; ``found``: the thread's holder row, read under the lock."""
        epoch, take, collected = hold_rule(found, holder, where["thread_id"])
        if take:
            self._query(tx, "lg_take_thread", {**where, "owner": holder.owner, "epoch": epoch})
        return epoch, take, collected

    def _lg_drop_pending(self, tx: Tx, where: Mapping[str, Any]) -> None:
        """Delete the thread's pending rows (writes of checkpoints not stored),
        as ``lg_delete_orphan_writes`` deletes such rows of ``lg_writes``: a
        dialect that keeps them in ``lg_checkpoints`` (SQLite's ``lg_put_record``).
        Both keep the writes after their namespace's latest checkpoint: a
        writer in flight, its checkpoint's put to come, whose saver takes their
        values as stored (deleting them collected those values)."""

    def _lg_fold_wanted(self, at: Mapping[str, Any]) -> bool:
        """Whether a put of a child of checkpoint ``at`` runs ``lg_fold_writes``
        when its writer held the thread already (one that takes it always
        does): a dialect that knows which checkpoints its writers gave rows of
        ``lg_writes`` answers for those only (SQLite); by default, always."""
        return True

    def _lg_fold(self, tx: Tx, where: Mapping[str, Any], row: CheckpointRow,
                 moved_rows: list[tuple[Any, ...]] | None = None) -> tuple[bytes, bytes] | None:
        """Move the pending writes of ``row``'s parent out of ``lg_writes``
        (``lg_fold_writes``: only if the parent is stored and not folded
        yet), returning them folded for its row. They were committed before
        this put began (the saver waits for them: ``CairnSaver._await_writes``)
        and move in this put's transaction, so a crash keeps them either as
        rows or folded, never neither. The dialect writes them into the
        parent's row: with the checkpoint's insert (``_lg_fold_in_put``,
        PostgreSQL: no round trip more, the writes' digests appended to the
        parent's ``refs`` for ``lg_read_one``) or in a statement of its own.
        Returns the folded record and the writes' packed digests.
        ``moved_rows``: what ``lg_fold_writes`` returned, run already (``_lg_operate``'s ``fold``)."""
        parent = row.parent_id
        if parent is None or parent == row.checkpoint_id:
            return None
        at = {**where, "checkpoint_id": parent}
        if moved_rows is None:
            moved_rows = self._query(tx, "lg_fold_writes", at)
        moved = read_writes(moved_rows, where["thread_id"], parent)
        if not moved:
            return None
        ordered = sorted(moved, key=write_order)
        folded = fold_writes(ordered, compact=self._lg_compact_fold)
        if not self._lg_fold_in_put:
            self._query(tx, "lg_set_folded", {**at, "folded": folded})
        return folded, row_refs(w.refs for w in ordered)

    def _lg_values_many(self, where: Mapping[str, Any], values: Sequence[ValueRow]
                        ) -> list[tuple[str, dict[str, Any]]]:
        """The statement storing ``values`` in one (``_lg_arrays``), if there are any."""
        unique = list({v.digest: v for v in values}.values())
        if not unique:
            return []
        return [("lg_put_values_many", {
            **where, "digests": [v.digest for v in unique], "kinds": [v.kind for v in unique],
            "datas": [v.data for v in unique]})]

    def _lg_put_values(self, tx: Tx, where: Mapping[str, Any], values: Sequence[ValueRow]) -> None:
        if self._lg_arrays:
            for name, params in self._lg_values_many(where, values):
                self._query(tx, name, params)
            return
        unique = list({v.digest: v for v in values}.values())
        for v in unique:
            self._query(tx, "lg_put_value", {**where, "digest": v.digest, "kind": v.kind, "data": v.data})

    def _lg_ids_param(self, items: list[str] | list[int]) -> Any:
        """A list parameter, as the dialect takes it (a JSON array for SQLite's
        ``json_each``, an array for PostgreSQL)."""
        return self._list_param(items)

    def _lg_fill(self, tx: Tx, tenant: str, asked: Sequence[Asked], fetched: dict[int, tuple[str, bytes]],
                 whole: bool, opener: Opener | None = None) -> list[Snapshot]:
        """Each asked row's chains, writes and values; ``fetched``: values
        already read (a page's), which are not read again. ``whole``: read
        in one snapshot, so a missing chain or value is the row's own
        (reported when decoded); else it raises ``_Incomplete``."""
        names = [versions_of(row) for row, versions_of, _ in asked]
        versions = [n.versions for n in names]
        if self._lg_batched:
            chains, writes = self._lg_page(tx, tenant, [row for row, _, _ in asked], versions)
        else:
            chains, writes = [], []
            for (row, _, _), named in zip(asked, versions, strict=True):
                where = _where(ThreadKey(tenant, row.thread_id, row.ns))
                chains.append(self._lg_chains(tx, where, named))
                found = self._query(tx, "lg_writes_of", {**where, "checkpoint_id": row.checkpoint_id})
                writes.append(read_writes(found, row.thread_id, row.checkpoint_id))
        wanted: dict[tuple[str, int], None] = {}  # (thread, digest), in order
        out = []
        for (row, _, known), named, inline, chain_of, written in zip(
                asked, versions, names, chains, writes, strict=True):
            wanted.update(dict.fromkeys((row.thread_id, d) for d in inline.inline))
            ordered = {n: chain_of[n] for n in named if n in chain_of}  # in the checkpoint's order
            if not whole and (len(ordered) < len(named) or any(c[0][2] for c in ordered.values())):
                raise _Incomplete  # a channel version, or a base below one, is gone
            for channel, chain in ordered.items():
                if chain[-1][0] == "list" and known(channel, b"".join(refs for _, refs, _ in chain)):
                    continue
                for _, refs, _ in chain:
                    wanted.update(dict.fromkeys((row.thread_id, d) for d in unpack_refs(refs)))
            for w in written:
                wanted.update(dict.fromkeys((row.thread_id, d) for d in unpack_refs(w.refs)))
            out.append(Snapshot(row, {n: [(k, r) for k, r, _ in c] for n, c in ordered.items()}, written,
                                fetched))
        asking = [(t, d) for t, d in wanted if d not in fetched]
        if asking:
            for thread_id, digest, kind, data in self._lg_values_of(tx, tenant, asking):
                d, raw = int(digest), bytes(data)
                fetched[d] = (str(kind), raw if opener is None else opener(str(thread_id), d, raw))
            if not whole and any(d not in fetched and not is_literal(d) for _, d in asking):
                raise _Incomplete
        return out

    def _lg_values_of(self, tx: Tx, tenant: str, asking: Sequence[tuple[str, int]]) -> list[tuple[Any, ...]]:
        """The stored values of ``asking``'s (thread, digest) pairs: (thread,
        digest, kind, data) each, in one statement (``_lg_batched``) or one a thread."""
        if self._lg_batched:
            return list(self._query(tx, "lg_page_values", {
                "tenant": tenant, "threads": [t for t, _ in asking], "digests": [d for _, d in asking]}))
        found: list[tuple[Any, ...]] = []
        for thread_id in dict.fromkeys(t for t, _ in asking):
            params = {"tenant": tenant, "thread_id": thread_id,
                      "digests": self._lg_ids_param(sorted({d for t, d in asking if t == thread_id}))}
            found += [(thread_id, *r) for r in self._query(tx, "lg_values", params)]
        return found

    def _lg_chains(self, tx: Tx, where: Mapping[str, Any], named: Mapping[str, str]) -> Chains:
        """Each named channel version's chain, oldest first: (kind, refs,
        whether it names a base)."""
        chains: Chains = {}
        if named:
            names = list(named)
            for channel, kind, base, _depth, refs in self._query(tx, "lg_blob_chains", {
                    **where, "channels": self._list_param(names),
                    "versions": self._list_param([named[n] for n in names])}):
                chains.setdefault(str(channel), []).append((str(kind), bytes(refs), base is not None))
        return chains

    def _lg_page(self, tx: Tx, tenant: str, rows: Sequence[CheckpointRow],
                 versions: Sequence[Mapping[str, str]]) -> tuple[list[Chains], list[list[WriteRow]]]:
        """The chains and writes of ``rows`` in one statement (``_lg_batched``)."""
        asked: list[tuple[int, str, str, str, str]] = [
            (i, row.thread_id, row.ns, channel, version)
            for i, (row, named) in enumerate(zip(rows, versions, strict=True))
            for channel, version in named.items()]
        found = self._query(tx, "lg_page_reads", {
            "tenant": tenant, "rows": [a[0] for a in asked], "threads": [a[1] for a in asked],
            "nss": [a[2] for a in asked], "channels": [a[3] for a in asked],
            "versions": [a[4] for a in asked],
            "wrows": list(range(len(rows))), "wthreads": [r.thread_id for r in rows],
            "wnss": [r.ns for r in rows], "wids": [r.checkpoint_id for r in rows]})
        chains: list[Chains] = [{} for _ in rows]
        written: list[list[tuple[Any, ...]]] = [[] for _ in rows]
        for i, is_write, channel, kind, base, refs, task_id, idx, task_path in found:
            if is_write:  # a row of lg_writes, or (task id NULL) the checkpoint's folded writes
                written[i].append((task_id, idx, channel, task_path, kind, refs))
            else:
                chains[i].setdefault(str(channel), []).append((str(kind), bytes(refs), base is not None))
        writes = [read_writes(w, row.thread_id, row.checkpoint_id)
                  for w, row in zip(written, rows, strict=True)]
        return chains, writes

    def _lg_collect(self, tx: Tx, where: Mapping[str, Any],
                 versions_of: VersionsOf) -> None:
        """Delete the thread's channel versions no checkpoint reaches (through
        list bases too), then the values nothing names; a collection that
        deleted any counts itself in the thread's holder row, so a writer
        remembering what it wrote or read before learns its memory is stale
        (``Stale``). One that deleted nothing leaves every memory true: no
        saver's next write is refused and made whole for it."""
        live: set[tuple[str, str, str]] = set()
        named: set[int] = set()  # values a checkpoint row names inline, then those of rows
        for ns, checkpoint_id, kind, data in self._query(tx, "lg_thread_checkpoints", where):
            row = CheckpointRow(where["thread_id"], str(ns), str(checkpoint_id), None, str(kind), bytes(data),
                                "", b"")
            names = versions_of(row)
            live.update((str(ns), channel, version) for channel, version in names.versions.items())
            named.update(names.inline)
        bases = {(str(ns), str(ch), str(v)): (None if b is None else str(b))
                 for ns, ch, v, b in self._query(tx, "lg_thread_blobs", where)}
        reached: set[tuple[str, str, str]] = set()
        for start in live:
            at: tuple[str, str, str] | None = start
            while at is not None and at in bases and at not in reached:
                reached.add(at)
                base = bases[at]
                at = None if base is None else (at[0], at[1], base)
        unreached = bases.keys() - reached
        for ns, channel, version in unreached:
            self._query(tx, "lg_delete_blob", {**where, "ns": ns, "channel": channel, "version": version})
        for refs, folded_in in self._query(tx, "lg_thread_refs", where):
            if folded_in is None:
                named.update(unpack_refs(bytes(refs)))
                continue
            for w in unfold_writes(bytes(refs), where["thread_id"], str(folded_in)):
                named.update(unpack_refs(w.refs))
        # a compression dictionary (cairn.lgdictionary) is named by the bytes of values, not by
        # refs: kept while a value is (any may be compressed with it)
        kept = bool(named)
        unnamed = [int(d) for d, dictionary in self._query(tx, "lg_thread_digests", where)
                   if int(d) not in named and not (dictionary and kept)]
        for digest in unnamed:
            self._query(tx, "lg_delete_value", {**where, "digest": digest})
        if unreached or unnamed:
            self._query(tx, "lg_count_collection", where)


class _Older:
    """``_lg_read_one`` could not read the row in one statement (``_OLDER``)."""


_OLDER = _Older()


class _Unfenced(Exception):
    """A fenced statement found the thread held otherwise than its ``Fence``
    and changed nothing (``SQLCheckpoints._lg_operate``: the write is rolled
    back and run again with the holder read)."""


class _Incomplete(Exception):
    """Statements read outside a transaction missed a row a delete took
    between them (``_lg_reading``: read again in one snapshot)."""


def _where(key: ThreadKey) -> dict[str, Any]:
    return {"tenant": key.tenant, "thread_id": key.thread_id, "ns": key.ns}


def _row(r: tuple[Any, ...]) -> CheckpointRow:
    thread_id, ns, checkpoint_id, parent_id, ckind, ckpt, mkind, meta = r
    parent = None if parent_id is None else str(parent_id)
    return CheckpointRow(str(thread_id), str(ns), str(checkpoint_id), parent, str(ckind), bytes(ckpt),
                         str(mkind), bytes(meta))
