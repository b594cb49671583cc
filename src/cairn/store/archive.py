"""The archive object of a closed run (issue 26 item 5: hot / warm / cold).

A closed run's rows leave the hot tables (``history``, ``mailbox``,
``approvals``, ``memory_run``) for one object in the artifact store; the run
row stays, so listings and ``cairn show`` still find the run, and
``run_archives`` names the object. The rows are kept *as stored*: history
entries in the audit verifier's columns (``auditsql.ENTRY_COLUMNS``, digest
and link included, the payload as packed, sealed when encryption is on), so
a restore puts back the very bytes, the audit chain verifies from the
archive exactly as from the table, and a sealed value still opens at its
place (its envelope is bound to the run and its seq, which do not change).

Stored form: ``MAGIC``, a codec byte, then the msgpack body compressed with
zstd (zlib without the ``zstandard`` package). The body names its tenant and
run, and every reader checks both against the run it reads for, so an
archive recorded for another run (a swapped ``ref``) is refused; the
artifact store refuses bytes that no longer hash to their ref (a flipped
byte). With encryption on, the compressed body is sealed as well, bound to
tenant and run (``Place(tenant, run, "archives", "-", "run")``): another
tenant's key cannot open it, nor can a copy under another run.

The reads (``entries``, ``headers``...) answer what the store's history
reads answer, from the decoded rows, so a reader never needs to know where
a run lives.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import msgspec

from cairn.errors import PayloadError
from cairn.store.auditlinks import GENESIS, link_version, row_link
from cairn.store.auditverify import recomputed_digest
from cairn.store.records import UsageTotals
from cairn.store.rows import pack_payload

_zstd: Any
try:  # the workspace extra: zstd compresses a journal ~2x better than zlib at the same speed
    import zstandard as _zstd
except ImportError:  # pragma: no cover - the extra is installed in CI
    _zstd = None

MAGIC = b"CRA1"
#: codec bytes: zstd, zlib; a sealed archive's codec byte has SEALED added
ZSTD, ZLIB, SEALED = 1, 2, 0x10
#: the tables an archive holds, in the order a restore writes them
TABLES = ("history", "mailbox", "approvals", "memory_run")
#: the largest body a reader inflates (a journal of a few million entries)
MAX_BODY = 1 << 31
#: the zstd level: archiving is off the hot path, the bytes stay for years
LEVEL = 12

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder()
_JSON = msgspec.json.Decoder()
#: ``rows.pack_payload``'s tag of a zlib-compressed payload
_ZLIB_TAG = b"\x00\x01"

Row = tuple[Any, ...]
#: seal / open the compressed body for (tenant, run): ``cairn.store.sealing.Sealer`` supplies them
Seal = Callable[[str, str, bytes], bytes]
Open = Callable[[str, str, bytes], bytes]


class ArchiveError(PayloadError):
    """An archive that cannot be read for its run: damaged, another run's, or sealed with a key not here."""

    def __init__(self, run_id: str, what: str) -> None:
        super().__init__(f"the archive of run {run_id!r} is refused: {what}")
        self.run_id = run_id


@dataclass(frozen=True, slots=True)
class RunArchive:
    """A run's archived rows, table -> rows (each table's columns in its query's order)."""

    tenant: str
    run_id: str
    tables: dict[str, list[Row]]

    @property
    def history(self) -> list[Row]:
        """The entries (``ENTRY_COLUMNS``), by seq."""
        return self.tables["history"]

    def refs(self) -> set[str]:
        """The artifacts the archived rows reference (kept from collection while archived)."""
        found = {r[13] for r in self.tables["history"] if r[13] is not None}
        found.update(r[5] for r in self.tables["mailbox"] if r[5] is not None)
        found.update(r[4] for r in self.tables["memory_run"] if r[4] is not None)
        return found

    # -- the history reads, as the store's queries answer them (EVENT_COLUMNS rows) ---------

    def entries(self, after_seq: int = 0, limit: int | None = None) -> list[Row]:
        rows = [r[:15] for r in self.history if r[1] > after_seq]
        return rows if limit is None else rows[:limit]

    def headers(self, after_seq: int = 0) -> list[Row]:
        return [(*r[:12], None, None, r[14]) for r in self.history if r[1] > after_seq]

    def index(self, after_seq: int = 0) -> list[Row]:
        return [(r[1], r[2], r[6], r[7], r[8], r[3]) for r in self.history if r[1] > after_seq]

    def at(self, seqs: Collection[int]) -> list[Row]:
        wanted = set(seqs)
        return [r[:15] for r in self.history if r[1] in wanted]

    def model_calls(self, after_seq: int = 0, limit: int | None = None) -> list[Row]:
        rows = [r[:15] for r in self.history if r[1] > after_seq and r[7] == "model"
                and r[2] == "step.completed" and (r[12] is not None or r[13] is not None)]
        return rows if limit is None else rows[:limit]

    def usage(self) -> UsageTotals:
        """What the store's ``run_usage`` query sums, summed over the archived entries."""
        tokens, cost, tools = 0, 0.0, 0
        for r in self.history:
            if r[6] is None:
                continue
            if r[7] == "model" and r[2] == "step.completed":
                try:
                    detail = _JSON.decode(r[14]) if r[14] is not None else None
                except msgspec.DecodeError:
                    continue  # a damaged detail counts nothing, as in SQL
                if isinstance(detail, dict):
                    tokens += int((detail.get("usage") or {}).get("total_tokens") or 0)
                    cost += float(detail.get("cost") or 0)
            elif r[7] == "tool" and r[2] in ("step.completed", "step.failed", "step.retried"):
                tools += 1
        return UsageTotals(tokens, cost, tools, int(self.history[-1][1]) if self.history else 0)

    def latest_event(self, key: str) -> Row | None:
        found = [r[:15] for r in self.history if r[7] == "event" and r[8] == key and r[2] == "step.completed"]
        return found[-1] if found else None

    def workspace_details(self) -> tuple[set[str], list[int]]:
        """The workspace snapshot roots its plain details name (``ws_roots``),
        and the seqs of its sealed details (``ws_sealed_entries``)."""
        roots: set[str] = set()
        sealed: list[int] = []
        for r in self.history:
            try:
                detail = _JSON.decode(r[14]) if isinstance(r[14], str | bytes) else None
            except msgspec.DecodeError:
                continue
            if not isinstance(detail, dict):
                continue
            if "sealed" in detail:
                sealed.append(int(r[1]))
            elif isinstance(detail.get("workspace"), str):
                roots.add(detail["workspace"])
        return roots, sealed

    # -- the mailbox, approval and run memory reads, as their queries answer them -------------

    def messages(self, key: str | None = None, after_seq: int = 0) -> list[Row]:
        """``select_messages``: the mailbox rows after ``after_seq`` (of ``key``), by seq."""
        return [(r[0], r[1], *r[3:]) for r in self.tables["mailbox"]
                if r[1] > after_seq and (key is None or r[3] == key)]

    def message(self, key: str, seq: int | None) -> Row | None:
        """``message_at`` (``seq`` of ``key``), or ``next_message`` (its first not taken)."""
        found = [r for r in self.messages(key) if (r[1] == seq if seq is not None else r[8] is None)]
        return found[0] if found else None

    def approvals(self, request_id: str | None, run_status: str) -> list[Row]:
        """``select_approvals`` of this run (the run closed: none pending),
        each with its request's payload and its decision's, by request time."""
        requests = {r[1]: (r[12], r[13]) for r in self.history}
        decisions = {r[1]: (r[4], r[5]) for r in self.tables["mailbox"]}
        rows = [(*r, *requests.get(r[4], (None, None)), *decisions.get(r[15], (None, None)), run_status)
                for r in self.tables["approvals"] if request_id is None or r[1] == request_id]
        return sorted(rows, key=lambda r: (r[9], r[0], r[1]))

    def run_memory(self, key: str | None, tenant: str | None) -> list[Row]:
        """``select_memory_run``: the run's memory (only ``key``; only if of ``tenant``), by key."""
        return [(r[0], r[2], r[1], *r[3:]) for r in self.tables["memory_run"]
                if (key is None or r[1] == key) and (tenant is None or r[2] == tenant)]


def encode(archive: RunArchive, seal: Seal | None = None) -> bytes:
    """The stored bytes of ``archive`` (compressed; sealed when ``seal`` is given)."""
    body = _ENCODER.encode({"v": 1, "tenant": archive.tenant, "run_id": archive.run_id,
                            "tables": {name: _columns(name, archive.tables[name]) for name in TABLES}})
    if _zstd is not None:
        codec, packed = ZSTD, _zstd.ZstdCompressor(level=LEVEL).compress(body)
    else:  # pragma: no cover - the extra is installed in CI
        codec, packed = ZLIB, zlib.compress(body, 9)
    if seal is not None:
        codec, packed = codec | SEALED, seal(archive.tenant, archive.run_id, packed)
    return MAGIC + bytes([codec]) + bytes(packed)


def decode(stored: bytes, tenant: str, run_id: str, open_: Open | None = None) -> RunArchive:
    """The archive of run ``run_id`` of ``tenant`` from its stored bytes;
    ``ArchiveError`` naming the run if they are not that run's archive."""
    if stored[:4] != MAGIC or len(stored) < 5:
        raise ArchiveError(run_id, "not an archive (damaged)")
    codec, packed = stored[4], stored[5:]
    if codec & SEALED:
        if open_ is None:
            raise ArchiveError(run_id, "it is sealed and encryption is off here")
        try:
            packed = open_(tenant, run_id, packed)
        except PayloadError as exc:
            raise ArchiveError(run_id, f"its seal does not open for this tenant and run: {exc}") from None
        codec &= ~SEALED
    elif open_ is not None:
        raise ArchiveError(run_id, "it is not sealed and encryption is on")
    body = _inflate(run_id, codec, packed)
    try:
        doc = _DECODER.decode(body)
        tables = {name: _rows(name, doc["tables"][name]) for name in TABLES}
        owner, archived = doc["tenant"], doc["run_id"]
    except (msgspec.DecodeError, KeyError, TypeError) as exc:
        raise ArchiveError(run_id, f"its body is damaged: {exc}") from None
    if archived != run_id or owner != tenant:
        raise ArchiveError(run_id, f"it is the archive of run {archived!r} of tenant {owner!r}")
    for name, rows in tables.items():
        if any(row[0] != run_id for row in rows):
            raise ArchiveError(run_id, f"its {name} rows name another run")
    return RunArchive(tenant, run_id, tables)


def _columns(table: str, rows: list[Row]) -> list[Any]:
    """A table's rows by column (like values side by side compress better:
    times, seqs, names, digests), each zlib-packed payload stored inflated
    when packing it again gives its bytes back, so zstd sees the text (a
    payload already compressed row by row would not compress again)."""
    columns: list[Any] = [list(column) for column in zip(*rows, strict=True)] if rows else []
    packed = _PAYLOAD.get(table)
    if packed is not None and columns:
        columns[packed] = [_inflated(value) for value in columns[packed]]
    if table == "history" and columns:
        versions = [None if link is None else link_version(bytes(link)) for link in columns[_LINK]]
        if _relinked(rows, versions) == columns[_LINK]:
            # the mark says the link's version: ``True`` version 1 (as archives written before
            # version 2 hold it), else the version's number
            columns[_LINK] = [None if v is None else True if v == 1 else v for v in versions]
    return [len(rows), columns]


def _rows(table: str, stored: Any) -> list[Row]:
    count, columns = stored
    if not isinstance(count, int) or not isinstance(columns, list) or any(len(c) != count for c in columns):
        raise TypeError(f"the {table} columns are not {count} rows long")
    packed = _PAYLOAD.get(table)
    if packed is not None and columns:
        columns[packed] = [_deflated(value) for value in columns[packed]]
    rows = list(zip(*columns, strict=True)) if columns else []
    if table == "history" and columns and any(type(link) in (bool, int) for link in columns[_LINK]):
        relinked = _relinked(rows, [None if link is None else _MARKS.get(link, 0) if type(link) in (bool, int)
                                    else link_version(bytes(link)) for link in columns[_LINK]])
        rows = [(*row[:_LINK], link, *row[_LINK + 1:]) for row, link in zip(rows, relinked, strict=True)]
    return rows


#: the history column of the audit link (``auditsql.ENTRY_COLUMNS``)
_LINK = 16


#: an archive's mark of a link that recomputes (``_columns``) -> the link's version
_MARKS: dict[bool | int, int] = {True: 1, 2: 2, 3: 3}


def _relinked(rows: list[Row], versions: list[int | None]) -> list[bytes | None]:
    """Each entry's audit link recomputed from the entries before it, as the
    verifier chains them (an entry without a link was written before the
    chain, which starts after it), of the version ``versions`` names for it
    (``auditlinks.link_version``). An archive keeps only a mark for a link
    that recomputes to the stored one: 32 incompressible bytes per entry
    less. Nothing is trusted by it: an edited entry recomputes other links,
    whose last no longer is the head its ``run_archives`` row records (and
    anchored checkpoints hold), and reading the archive refuses it there."""
    links: list[bytes | None] = []
    previous = GENESIS
    for row, version in zip(rows, versions, strict=True):
        entry_digest = (row[15] if row[15] is not None or row[_LINK] is None or version is None
                        else recomputed_digest(row, version))
        if row[_LINK] is None or entry_digest is None or version is None:
            links.append(None if row[_LINK] is None else bytes(row[_LINK]))
            continue
        previous = row_link(previous, row, bytes(entry_digest), version)
        links.append(previous)
    return links


#: the column of a table whose values ``rows.pack_payload`` packed (history and mailbox payloads)
_PAYLOAD = {"history": 12, "mailbox": 4}


def _inflated(value: Any) -> Any:
    """``[plain]`` for a zlib-packed payload that packs back to the same bytes, else ``value``."""
    if type(value) is bytes and value[:2] == _ZLIB_TAG:
        try:
            plain = zlib.decompress(value[2:])
        except zlib.error:
            return value  # damaged: kept as it is
        if pack_payload(plain) == value:
            return [plain]
    return value


def _deflated(value: Any) -> Any:
    return pack_payload(value[0]) if isinstance(value, list) and len(value) == 1 else value


def _inflate(run_id: str, codec: int, packed: bytes) -> bytes:
    if codec == ZSTD:
        if _zstd is None:  # pragma: no cover - the extra is installed in CI
            raise ArchiveError(run_id, "it is zstd-compressed: install cairn-runtime[workspace] (zstandard)")
        try:
            with _zstd.ZstdDecompressor().stream_reader(packed) as reader:
                body = reader.read(MAX_BODY + 1)
        except Exception as exc:  # zstandard.ZstdError: damaged
            raise ArchiveError(run_id, f"it cannot be decompressed: {exc}") from None
    elif codec == ZLIB:
        inflater = zlib.decompressobj()
        try:
            body = inflater.decompress(packed, MAX_BODY + 1)
        except zlib.error as exc:
            raise ArchiveError(run_id, f"it cannot be decompressed: {exc}") from None
    else:
        raise ArchiveError(run_id, f"unknown codec {codec} (damaged)")
    if len(body) > MAX_BODY:
        raise ArchiveError(run_id, "it inflates beyond the largest archive")
    return bytes(body)
