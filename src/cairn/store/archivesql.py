"""Archiving closed runs in the SQL stores (issue 26 item 5; the object's
format and reads are ``store.archive``).

``archive_run`` is two moves, so that a crash anywhere leaves the run
either hot or archived, never both or neither:

1. read the run's rows (one snapshot), encode them, put the object in the
   artifact store (durable before the next move; a crash here leaves an
   object nothing references, which pruning collects like any other);
2. one write transaction holding the run: it must still be closed and not
   archived, its rows must still be exactly the ones encoded (any change
   since refuses the move: nothing is lost), then the ``run_archives`` row
   is written and the rows are deleted from the hot tables.

From then on the database refuses any change to the run (migration 0027 /
0038: triggers on the run row and every table the archive holds) until
``restore_run`` puts the very rows back and removes the record in one
transaction. The store's reads of a run's history fall back to its archive
when the hot tables have nothing for it (one primary-key probe of
``run_archives``, only then), so readers never need to know.
"""

from __future__ import annotations

import dataclasses
import heapq
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import msgspec

from cairn.errors import InvalidRunState, RunNotFound
from cairn.faults import fault_point
from cairn.security.envelope import Place, SealError
from cairn.store.archive import TABLES, ArchiveError, Open, RunArchive, Seal, decode, encode
from cairn.store.archiveseal import holds_opened, opened, resealed
from cairn.store.auditsql import ENTRY_COLUMNS
from cairn.store.oplog import SYSTEM_ACTOR
from cairn.store.oplogsql import move_change, record_move
from cairn.store.records import ArchiveRecord, RunRecord, UsageTotals
from cairn.store.rows import run_from_row
from cairn.store.sqlprimitives import SQLPrimitives

Tx = TypeVar("Tx")
T = TypeVar("T")

#: the columns of each archived table's rows (its ``archive_<table>`` query), history's being the audit rows'
COLUMNS: dict[str, tuple[str, ...]] = {
    "history": ENTRY_COLUMNS,
    "mailbox": ("run_id", "seq", "tenant", "key", "payload", "payload_ref", "sender", "dedupe", "sent_at",
                "taken_at", "taken_position"),
    "approvals": ("run_id", "request_id", "tenant", "position", "request_seq", "action", "type_name",
                  "schema", "approvers", "requested_at", "expires_at", "status", "decided_by", "decided_at",
                  "comment", "decision_seq"),
    "memory_run": ("run_id", "key", "tenant", "value", "value_ref", "version", "created_at", "updated_at",
                   "position", "operation_id", "actor"),
}
#: archive records read per page of ``audit_log_archives``
ARCHIVE_PAGE = 64
_INF = float("inf")
#: decoded archives kept, by ref (an archived run's pages are read one after another)
CACHED = 16
#: archived runs whose approval rows are kept (``archived_approvals``; most runs have none)
MEMO_APPROVALS = 100_000
#: entries per archive read of a run's history when it is read from the table
_ALL = 1 << 62


class SQLArchive(SQLPrimitives[Tx]):
    """``archive_run``, ``restore_run`` and the archived reads over a dialect's primitives."""

    #: ``oplogsql.SQLOperatorLog``'s, later in the store's bases (declared, not defined, so not hidden)
    record_operator_action: Callable[..., int]
    #: a ``sealing.Sealer`` when a ``SealedStore`` wraps this store: archives are sealed with it
    archive_sealer: Any = None

    def _in_write(self, work: Callable[[Tx], T]) -> T:
        raise NotImplementedError

    def _held_run(self, tx: Tx, run_id: str) -> RunRecord | None:
        raise NotImplementedError

    def _read_run(self, tx: Tx, run_id: str) -> RunRecord | None:
        raise NotImplementedError

    def put_artifact(self, data: bytes) -> str:
        raise NotImplementedError

    def get_artifact(self, ref: str) -> bytes:
        raise NotImplementedError

    # -- dialect hook ------------------------------------------------------------------------

    def _check_archiver(self) -> None:
        """Refuse a store that may not move a run's rows (PostgreSQL: a tenant's role)."""

    def _restore_entry(self, tx: Tx, params: dict[str, Any]) -> None:
        """Insert one archived history row as it was (SQLite spills a large payload)."""
        self._query(tx, "restore_history", params)

    # -- contract ----------------------------------------------------------------------------

    def archive_run(self, run_id: str, *, actor: str | None = None) -> ArchiveRecord:
        """Move closed run ``run_id``'s rows into an archive object (see the
        module doc). ``RunNotFound``; ``InvalidRunState`` if the run is not
        closed, is archived already, or changed while it was being archived."""
        self._check_archiver()
        run, tables = self._in_read(lambda tx: self._archivable(tx, run_id))
        archive = RunArchive(run.tenant, run_id, tables)
        seal, _ = self._archive_codec()
        sealer = self.archive_sealer
        # sealed whole, so its values are stored opened, to compress (store.archiveseal)
        stored = encode(archive if sealer is None else
                        RunArchive(run.tenant, run_id, opened(run.tenant, run_id, tables, sealer)), seal)
        ref = self.put_artifact(stored)
        fault_point("archive.stored")
        history = tables["history"]
        record = ArchiveRecord(
            run_id, run.tenant, ref, len(history), int(history[-1][1]) if history else 0,
            None if not history or history[-1][16] is None else bytes(history[-1][16]),
            len(msgspec.msgpack.encode(tables)), len(stored),
            self.clock(), actor)

        def move(tx: Tx) -> ArchiveRecord:
            _, now_tables = self._archivable(tx, run_id, held=True)
            if now_tables != tables:
                raise InvalidRunState(f"run {run_id!r} changed while it was being archived: archive it again")
            params = {"run_id": run_id}
            for table in TABLES:
                self._query(tx, f"delete_archived_{table}", params)
            fault_point("archive.deleted")
            times = [float(row[3]) for row in history]  # each entry's at: the log's pages seek the range
            self._query(tx, "insert_run_archive", {**_record_params(record), "archived_at": self.clock(),
                                                   "first_at": min(times, default=None),
                                                   "last_at": max(times, default=None)})
            for extra in sorted(archive.refs()):
                self._query(tx, "insert_run_archive_ref",
                            {"run_id": run_id, "tenant": run.tenant, "ref": extra})
            record_move(self, tx, "archive.move", run.tenant, run_id, actor, move_change(record))
            return record

        return self._in_write(move)

    def restore_run(self, run_id: str, *, actor: str | None = None) -> ArchiveRecord:
        """Put archived run ``run_id``'s rows back in the hot tables, bit for
        bit, and drop its archive record (the object is collected by
        pruning). ``RunNotFound``; ``InvalidRunState`` if it is not archived;
        ``ArchiveError`` if its object is not its archive."""
        self._check_archiver()
        record = self.run_archive(run_id)
        if record is None:
            if self._select("select_run", {"run_id": run_id}):
                raise InvalidRunState(f"run {run_id!r} is not archived")
            raise RunNotFound(run_id)
        archive = self._load_archive(record)

        def put_back(tx: Tx) -> ArchiveRecord:
            rows = self._query(tx, "run_archive", {"run_id": run_id})
            if not rows or _record(rows[0]).ref != record.ref:
                raise InvalidRunState(f"run {run_id!r} was restored or archived again meanwhile")
            self._query(tx, "delete_run_archive", {"run_id": run_id})
            self._query(tx, "delete_run_archive_refs", {"run_id": run_id})
            for table in TABLES:
                columns = COLUMNS[table]
                for row in archive.tables[table]:
                    params = dict(zip(columns, row, strict=True))
                    if table == "history":
                        self._restore_entry(tx, params)
                    else:
                        self._query(tx, f"restore_{table}", params)
            when = self.clock()
            record_move(self, tx, "archive.restore", record.tenant, run_id, actor, move_change(record))
            fault_point("archive.restored")
            return dataclasses.replace(record, restored_by=_actor(actor), restored_at=when)

        return self._in_write(put_back)

    def run_archive(self, run_id: str) -> ArchiveRecord | None:
        """Run ``run_id``'s archive record, ``None`` while it is hot (or unknown)."""
        rows = self._select("run_archive", {"run_id": run_id})
        return _record(rows[0]) if rows else None

    def archivable_runs(self, older_than: float, *, tenant: str | None = None, limit: int = 1000
                        ) -> list[str]:
        """Closed runs last changed before ``older_than`` and still hot, oldest first."""
        rows = self._select("archivable_runs", {"cutoff": older_than, "tenant": tenant, "limit": limit})
        return [str(r[0]) for r in rows]

    def archived_runs(self, tenant: str | None = None) -> list[str]:
        """The archived runs (of ``tenant``, or all this store may see)."""
        return [str(r[0]) for r in self._select("archived_runs", {"tenant": tenant})]

    def run_archived(self, run_id: str) -> RunArchive | None:
        """Run ``run_id``'s archived rows, checked (``ArchiveError`` naming
        the run if its object is damaged or another's); ``None`` while hot."""
        record = self.run_archive(run_id)
        return None if record is None else self._load_archive(record)

    def archived_approvals(self, tenant: str | None = None) -> list[tuple[Any, ...]]:
        """The approval rows (``select_approvals``') of every archived run
        (of ``tenant``), by run. An archived run never changes, so each
        run's rows are kept by its archive object (``ref``): a listing reads
        the archive records, and opens only archives it has not met
        (``ArchiveError`` naming the run if one cannot be read)."""
        memo = self._approvals_memo()
        found: list[tuple[Any, ...]] = []
        for row in self._select("archived_records", {"tenant": tenant}):
            record = _record(row)
            key = (record.ref, record.run_id)
            with _CACHE_LOCK:
                rows = memo.get(key)
            if rows is None:
                run = self._select("select_run", {"run_id": record.run_id})
                status = run_from_row(run[0]).status.value if run else ""
                rows = self._load_archive(record).approvals(None, status)
                with _CACHE_LOCK:
                    if len(memo) >= MEMO_APPROVALS:
                        memo.clear()
                    memo[key] = rows
            found.extend(rows)
        return found

    def archived_usage(self, run_id: str) -> UsageTotals | None:
        """``run_usage`` of an archived run, summed from its archive as the SQL sums it."""
        archive = self.run_archived(run_id)
        return None if archive is None else archive.usage()

    def archived_audit_entries(self, *, tenant: str | None = None, run_id: str | None = None,
                               damaged: list[tuple[str, str]] | None = None) -> Iterator[tuple[Any, ...]]:
        """The audit rows of the archived runs in scope, read from their
        archives (one that cannot be read: named in ``damaged``, else raised)."""
        if run_id is not None:
            records = [self.run_archive(run_id)]
        else:  # one read of the records, not a probe per run
            records = [_record(row) for row in self._select("archived_records", {"tenant": tenant})]
        for record in records:
            if record is None or (tenant is not None and record.tenant != tenant):
                continue
            try:
                history = self._load_archive(record).history
            except ArchiveError as exc:
                if damaged is None:
                    raise
                damaged.append((record.run_id, str(exc)))
                continue
            yield from history

    def audit_log_archives(self, *, tenant: str | None = None, run_id: str | None = None,
                           after: tuple[float, str, int] | None = None, since: float | None = None,
                           newest: bool = False, page: int = ARCHIVE_PAGE
                           ) -> Iterator[tuple[float, ArchiveRecord]]:
        """The archive records of the archived runs in scope whose entries
        may come past the log position ``after`` (and since ``since``), each
        with where its entries start in the log's direction (its first
        entry's time oldest first, its last's newest first), in that order,
        read a page at a time: the audit log opens an archive only once its
        merge reaches that time (``api.auditlog``). An archive without a
        recorded range (made before migration 0031 / 0047) starts before
        everything. Every tenant's (no tenant, no run) merge one stream per
        tenant."""
        if run_id is not None:
            record = self.run_archive(run_id)
            if record is not None and (tenant is None or record.tenant == tenant):
                found = self._select("audit_log_archive_range", {"run_id": run_id})
                first_at, last_at = found[0] if found else (None, None)
                yield _start(first_at, last_at, newest), record
            return
        if tenant is None:
            tenants = [str(t) for (t,) in self._select("audit_log_archive_tenants", {})]
            yield from heapq.merge(*(self._log_archives(t, after, since, newest, page) for t in tenants),
                                   key=_first, reverse=newest)
            return
        yield from self._log_archives(tenant, after, since, newest, page)

    def _log_archives(self, tenant: str, after: tuple[float, str, int] | None, since: float | None,
                      newest: bool, page: int) -> Iterator[tuple[float, ArchiveRecord]]:
        for row in self._select("audit_log_archives_unranged", {"tenant": tenant}):
            yield _start(None, None, newest), _record(row)
        floor = -_INF if since is None else float(since)
        # past the position: oldest first, ending at or after it and the floor; newest, starting before it
        at = (_INF if newest else -_INF) if after is None else after[0]
        at = at if newest else max(at, floor)
        key: tuple[float, float, str] = (_INF, _INF, "") if newest else (-_INF, -_INF, "")
        name = "audit_log_archives_newest" if newest else "audit_log_archives_oldest"
        while True:
            rows = self._select(name, {"tenant": tenant, "at": at, "since": floor, "after_first": key[0],
                                       "after_last": key[1], "after_run": key[2], "page": page})
            for row in rows:
                yield _start(row[10], row[11], newest), _record(row)
            if len(rows) < page:
                return
            last = rows[-1]
            key = (float(last[10]), float(last[11]), str(last[0]))

    def archived_history(self, record: ArchiveRecord) -> list[tuple[Any, ...]]:
        """The history rows (``ENTRY_COLUMNS``) of an archived run, read from its archive."""
        return list(self._load_archive(record).history)

    # -- internals ---------------------------------------------------------------------------

    def _archivable(self, tx: Tx, run_id: str, held: bool = False) -> tuple[RunRecord, dict[str, list[Any]]]:
        run = self._held_run(tx, run_id) if held else self._read_run(tx, run_id)
        if run is None:
            raise RunNotFound(run_id)
        if not run.status.terminal:
            raise InvalidRunState(f"run {run_id!r} is {run.status.value}: only a closed run is archived")
        if self._query(tx, "run_archive", {"run_id": run_id}):
            raise InvalidRunState(f"run {run_id!r} is archived already")
        tables: dict[str, list[Any]] = {}
        for table in TABLES:
            if table == "history":
                rows = self._query(tx, "audit_entries", {"tenant": None, "run_id": run_id, "after_run": "",
                                                         "after_seq": 0, "page": _ALL})
            else:
                rows = self._query(tx, f"archive_{table}", {"run_id": run_id})
            tables[table] = [tuple(_plain(v) for v in row) for row in rows]
        return run, tables

    def _archive_codec(self) -> tuple[Seal | None, Open | None]:
        sealer = self.archive_sealer
        if sealer is None:
            return None, None

        def seal(tenant: str, run_id: str, data: bytes) -> bytes:
            return bytes(sealer.seal(_place(tenant, run_id), data))

        def open_(tenant: str, run_id: str, data: bytes) -> bytes:
            return bytes(sealer.open(_place(tenant, run_id), data))

        return seal, open_

    def _load_archive(self, record: ArchiveRecord) -> RunArchive:
        cache = self._archive_cache()
        with _CACHE_LOCK:
            found = cache.get((record.ref, record.run_id))
        if found is not None:
            return found
        try:
            stored = self.get_artifact(record.ref)
        except ArchiveError:
            raise
        except Exception as exc:  # PayloadError (missing, or bytes no longer hashing to the ref), StoreError
            raise ArchiveError(record.run_id, f"its object {record.ref} cannot be read: {exc}") from None
        archive = decode(stored, record.tenant, record.run_id, self._archive_codec()[1])
        if self.archive_sealer is not None:  # each value sealed again, to the byte (store.archiveseal)
            try:
                tables = resealed(archive.tenant, archive.run_id, archive.tables, self.archive_sealer)
            except (SealError, KeyError, TypeError, ValueError) as exc:
                raise ArchiveError(record.run_id, f"a value in it cannot be sealed again: {exc}") from None
            archive = RunArchive(archive.tenant, archive.run_id, tables)
        elif holds_opened(archive.tables):
            raise ArchiveError(record.run_id, "it holds opened values but is not sealed (damaged)")
        history = archive.history
        last = (int(history[-1][1]), None if history[-1][16] is None else bytes(history[-1][16])) if history \
            else (0, None)
        if len(history) != record.entries or last != (record.last_seq, record.last_link):
            raise ArchiveError(record.run_id, "its entries are not the ones recorded when it was archived")
        with _CACHE_LOCK:
            cache[(record.ref, record.run_id)] = archive
            while len(cache) > CACHED:
                cache.popitem(last=False)
        return archive

    def _approvals_memo(self) -> dict[tuple[str, str], list[tuple[Any, ...]]]:
        memo: dict[tuple[str, str], list[tuple[Any, ...]]] | None = self.__dict__.get("_archived_approvals")
        if memo is None:
            memo = self.__dict__.setdefault("_archived_approvals", {})
        return memo

    def _archive_cache(self) -> OrderedDict[tuple[str, str], RunArchive]:
        cache: OrderedDict[tuple[str, str], RunArchive] | None = self.__dict__.get("_archives")
        if cache is None:
            cache = self.__dict__.setdefault("_archives", OrderedDict())
        return cache


_CACHE_LOCK = threading.Lock()




def _start(first_at: Any, last_at: Any, newest: bool) -> float:
    """Where an archive's entries start in the log's direction; an archive
    without a recorded range starts before everything."""
    if newest:
        return _INF if last_at is None else float(last_at)
    return -_INF if first_at is None else float(first_at)


def _first(item: tuple[float, ArchiveRecord]) -> float:
    return item[0]


def _place(tenant: str, run_id: str) -> Place:
    """Where an archive is sealed: bound to its tenant and run."""
    return Place(tenant, run_id, "archives", "-", "run")


def _actor(actor: str | None) -> str:
    """Who archived or restored: the caller's actor, else the store itself (a direct contract call)."""
    return actor if actor else SYSTEM_ACTOR


def _plain(value: Any) -> Any:
    """A column value as msgpack keeps it (PostgreSQL may hand bytea as a memoryview)."""
    return bytes(value) if isinstance(value, memoryview) else value


def _record(row: tuple[Any, ...]) -> ArchiveRecord:
    """A ``run_archives`` row's record (its first ten columns: the range after them is the log's)."""
    return ArchiveRecord(str(row[0]), str(row[1]), str(row[2]), int(row[3]), int(row[4]),
                         None if row[5] is None else bytes(row[5]), int(row[6]), int(row[7]), float(row[8]),
                         row[9])


def _record_params(record: ArchiveRecord) -> dict[str, Any]:
    return {"run_id": record.run_id, "tenant": record.tenant, "ref": record.ref, "entries": record.entries,
            "last_seq": record.last_seq, "last_link": record.last_link, "hot_bytes": record.hot_bytes,
            "stored_bytes": record.stored_bytes, "archived_at": record.archived_at, "actor": record.actor}
