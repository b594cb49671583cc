"""The embedded backend: one SQLite file in WAL mode, shared by any number of
threads and worker processes on one machine.

Why these choices (see docs/design.md for the long form):

* **WAL** lets readers (``cairn events --follow``, ``cairn runs``) proceed while
  a worker writes, and makes a commit an append to one file.
* **synchronous=NORMAL** (durability ``process``): a commit is in the OS page
  cache before it returns, so it survives any process crash, SIGKILL
  included; power loss may drop the last commits. **synchronous=FULL**
  (durability ``power``): the WAL is fsynced on every commit.
* **BEGIN IMMEDIATE** for every write transaction: it takes the write lock up
  front, so concurrent writers queue on ``busy_timeout`` instead of failing
  with a lock upgrade error halfway through.
* One connection per thread: sqlite3 connections are not shared across
  threads, and opening one is cheap compared with locking around one.
* **Tenancy.** Every history row carries its run's tenant, read from the run
  row by the INSERT itself, so the per-step append stays one statement.
  Artifacts are files named by their SHA-256, shared by every tenant.
* **Pruning** (``prune_runs``) deletes whole finished run trees in one write
  transaction, queueing the artifacts they referenced in ``artifact_gc``. A
  queued file is deleted once no row references it and its modification
  time (set to the store clock by every ``put_artifact``, new or repeated)
  is older than the cutoff. File deletions and ``put_artifact`` exclude each
  other with an advisory lock on ``<db>.artifacts/.lock`` (shared for puts,
  exclusive for deletions), so a put either refreshes the time before the
  check or finds the file gone and writes it again.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from cairn.errors import InvalidRunState, LeaseLost, PayloadError, RunNotFound, StoreError
from cairn.store import admission
from cairn.store.contract import ARTIFACT_GRACE_SECONDS, check_prune_limit, choose_trees, prune_statuses
from cairn.store.records import (
    Claim,
    Durability,
    EventType,
    HistoryEvent,
    NewRun,
    Payload,
    RunFilter,
    RunRecord,
    RunStatus,
)
from cairn.store.rows import created_detail as _created_detail
from cairn.store.rows import dumps as _dumps
from cairn.store.rows import finish_params as _finish_params
from cairn.store.rows import lifecycle_event as _event
from cairn.store.rows import loads as _loads
from cairn.store.rows import new_record as _new_record
from cairn.store.rows import queue_from_row as _queue_from_row
from cairn.store.rows import queue_params as _queue_params
from cairn.store.sqlfiles import load_migrations, load_queries

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: puts and collection are not serialised
    fcntl = None  # type: ignore[assignment]

_Q = load_queries("sqlite")


def _terminal_json() -> str:
    return _dumps([status.value for status in RunStatus if status.terminal])


_BUSY_TIMEOUT_MS = 30_000


class SQLiteStore:
    """Store contract on one SQLite database file (see ``contract.Store``)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Durability = Durability.PROCESS,
        clock: Callable[[], float] = time.time,
        auto_migrate: bool = True,
    ) -> None:
        """``auto_migrate=False`` opens the database without touching its
        schema (for tools that only report its version); ``migrate()`` then
        brings it up to date."""
        self.path = Path(path)
        self.durability = durability
        self.clock = clock
        self.artifact_dir = self.path.with_name(self.path.name + ".artifacts")
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._closed = False
        self._lane_cursor = admission.LaneCursor()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = self._conn()
            if auto_migrate:
                self._migrate(conn)
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"cannot open SQLite database {str(self.path)!r}: {exc}") from None

    # -- connections and transactions ----------------------------------------

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            if self._closed:
                raise StoreError("store is closed")
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=_BUSY_TIMEOUT_MS / 1000)
            conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise StoreError(f"{self.path} cannot use WAL journaling (got {mode!r})")
            sync = "FULL" if self.durability is Durability.POWER else "NORMAL"
            conn.execute(f"PRAGMA synchronous = {sync}")
            conn.execute("PRAGMA foreign_keys = OFF")
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        return conn

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _migrate(self, conn: sqlite3.Connection) -> list[int]:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
        )
        applied: list[int] = []
        for migration in load_migrations("sqlite"):
            with self._write() as tx:
                done = tx.execute(
                    "SELECT 1 FROM schema_migrations WHERE version = ?", (migration.version,)
                ).fetchone()
                if done:
                    continue
                for statement in _split_statements(migration.sql):
                    tx.execute(statement)
                tx.execute(
                    "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                    (migration.version, migration.name, time.time()),
                )
                applied.append(migration.version)
        return applied

    def migrate(self) -> list[int]:
        """Apply the migrations this database lacks, each in its own
        transaction; return their versions (empty when it was up to date)."""
        try:
            return self._migrate(self._conn())
        except sqlite3.Error as exc:
            raise StoreError(f"cannot migrate SQLite database {str(self.path)!r}: {exc}") from None

    def schema_version(self) -> int:
        """The highest migration applied to this database (0: none)."""
        conn = self._conn()
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
                        ).fetchone() is None:
            return 0
        row = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()
        return int(row[0])

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for conn in self._connections:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
            self._connections.clear()
        self._local = threading.local()

    # -- creating and reading runs -------------------------------------------

    def create_run(self, run: NewRun) -> tuple[RunRecord, bool]:
        now = self.clock()
        with self._write() as tx:
            if not _insert_run(tx, run, now, status=RunStatus.PENDING, runnable_at=now):
                existing = _select_run(tx, run.run_id)
                assert existing is not None
                return existing, False
            event = _event(run.run_id, 1, EventType.RUN_CREATED, now, 0, None, _created_detail(run))
            tx.execute(_Q["insert_event"], _event_params(event))
        return _new_record(run, now, RunStatus.PENDING, epoch=0), True

    def create_claimed_run(self, run: NewRun, worker: str, lease_seconds: float) -> Claim | None:
        now = self.clock()
        until = now + lease_seconds
        events = [
            _event(run.run_id, 1, EventType.RUN_CREATED, now, 1, None, _created_detail(run)),
            _event(run.run_id, 2, EventType.LEASE_CLAIMED, now, 1, worker, {"lease_until": until}),
            _event(run.run_id, 3, EventType.RUN_STARTED, now, 1, worker, None),
        ]
        with self._write() as tx:
            if not _insert_run(tx, run, now, status=RunStatus.RUNNING, runnable_at=until,
                               epoch=1, owner=worker, lease_until=until):
                return None
            for event in events:
                tx.execute(_Q["insert_event"], _event_params(event))
        record = _new_record(run, now, RunStatus.RUNNING, epoch=1, owner=worker, lease_until=until)
        return Claim(run=record, history=events, next_seq=4)

    def get_run(self, run_id: str) -> RunRecord | None:
        return _select_run(self._conn(), run_id)

    def list_runs(self, filter: RunFilter) -> list[RunRecord]:
        statuses = _dumps([s.value for s in filter.statuses]) if filter.statuses is not None else None
        rows = self._conn().execute(
            _Q["list_runs"],
            {
                "tenant": filter.tenant,
                "workflow": filter.workflow,
                "thread_id": filter.thread_id,
                "parent_run_id": filter.parent_run_id,
                "statuses": statuses,
                "limit": filter.limit,
            },
        )
        return [_run_from_row(row) for row in rows]

    def history(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[HistoryEvent]:
        return _select_history(self._conn(), run_id, after_seq, limit)

    # -- claiming and leases -----------------------------------------------

    def claim_runs(
        self,
        worker: str,
        workflows: Collection[str],
        limit: int,
        lease_seconds: float,
        max_recoveries: int,
        queues: Collection[str] | None = None,
    ) -> list[Claim]:
        if limit <= 0 or not workflows:
            return []
        now = self.clock()
        wanted = _dumps(list(workflows))
        with self._write() as tx:
            limits = {row[0]: _queue_from_row(row) for row in tx.execute(_Q["select_queues"])}
            served = sorted(set(queues)) if queues is not None else _queues_with_lanes(tx)
            lanes: list[admission.Lane] = []
            for queue in served:
                lanes.extend(self._lanes(tx, queue, wanted, now, limit))
            queue_running = {q: tx.execute(_Q["queue_running"], {"queue": q}).fetchone()[0]
                             for q in {lane.queue for lane in lanes} if q in limits}
            buckets: dict[admission.BucketKey, admission.Bucket] = {}
            for queue in {key[0] for key in admission.bucket_keys(limits, lanes)}:
                for q, tenant, tokens, at in tx.execute(_Q["select_buckets"], {"queue": queue}):
                    buckets[(q, tenant)] = admission.Bucket(tokens, at)
            claims: list[Claim] = []
            claimed: list[admission.Candidate] = []
            for candidate in admission.plan(lanes, limits, queue_running, buckets, now, limit):
                claim = _claim(tx, candidate.run_id, worker, now, lease_seconds, max_recoveries)
                if claim is not None:  # None: a takeover that quarantined its run
                    claims.append(claim)
                    claimed.append(candidate)
            for (queue, tenant), state in admission.charge(limits, buckets, claimed, now).items():
                tx.execute(_Q["upsert_bucket"], {"queue": queue, "tenant": tenant, "tokens": state.tokens,
                                                 "at": state.at})
        return claims

    def _lanes(
        self, tx: sqlite3.Connection, queue: str, workflows: str, now: float, limit: int
    ) -> list[admission.Lane]:
        """Up to ``admission.MAX_LANES`` lanes of ``queue`` from its cursor,
        each with its best ``limit`` due runs and its running count."""
        def next_tenant(after: str) -> str | None:
            row = tx.execute(_Q["next_tenant"], {"queue": queue, "after": after}).fetchone()
            return None if row is None else str(row[0])

        tenants = admission.lane_window(next_tenant, self._lane_cursor.after(queue))
        self._lane_cursor.saw(queue, tenants)
        lanes = []
        running: dict[str, int] | None = None
        for tenant in tenants:
            rows = tx.execute(_Q["lane_candidates"], {"queue": queue, "tenant": tenant, "now": now,
                                                     "workflows": workflows, "limit": limit}).fetchall()
            if not rows:
                continue
            if running is None:  # one statement for every lane of the queue
                running = dict(tx.execute(_Q["lane_running"], {"queue": queue}).fetchall())
            candidates = [admission.Candidate(run_id, queue, tenant, priority, at, status == "running")
                          for run_id, priority, at, status in rows]
            lanes.append(admission.Lane(queue, tenant, running.get(tenant, 0), candidates))
        return lanes

    # -- queues ------------------------------------------------------------------

    def set_queue(self, limits: admission.QueueLimits) -> None:
        params = _queue_params(limits, self.clock())
        with self._write() as tx:
            tx.execute(_Q["delete_queue" if limits.unlimited else "upsert_queue"], params)
            tx.execute(_Q["delete_stale_buckets"], params)

    def queue_stats(self) -> list[admission.QueueStats]:
        conn = self._conn()
        conn.execute("BEGIN")  # a read transaction: one snapshot for both statements, no write lock
        try:
            limits = {row[0]: _queue_from_row(row) for row in conn.execute(_Q["select_queues"])}
            counts = {q: (running, runnable)
                      for q, running, runnable in conn.execute(_Q["queue_counts"], {"now": self.clock()})}
        finally:
            conn.execute("COMMIT")
        return admission.stats(limits, counts)

    def claim_run(self, run_id: str, worker: str, lease_seconds: float, max_recoveries: int) -> Claim | None:
        now = self.clock()
        with self._write() as tx:
            state = tx.execute(_Q["select_claim_state"], {"run_id": run_id}).fetchone()
            if state is None or state[4] is None or state[4] > now:
                return None
            return _claim(tx, run_id, worker, now, lease_seconds, max_recoveries)

    def reclaim_owned(self, worker: str) -> int:
        with self._write() as tx:
            return tx.execute(_Q["reclaim_owned"], {"worker": worker, "now": self.clock()}).rowcount

    def renew_leases(self, worker: str, leases: Mapping[str, int], lease_seconds: float) -> set[str]:
        if not leases:
            return set()
        now = self.clock()
        until = now + lease_seconds
        lost: set[str] = set()
        with self._write() as tx:
            for run_id, epoch in leases.items():
                params = {"run_id": run_id, "worker": worker, "epoch": epoch, "lease_until": until,
                          "now": now}
                if tx.execute(_Q["renew_lease"], params).rowcount == 0:
                    lost.add(run_id)
        return lost

    # -- fenced writes by the lease holder -----------------------------------

    def append(
        self, run_id: str, epoch: int, events: Sequence[HistoryEvent], *, barrier: bool = False
    ) -> None:
        if barrier and self.durability is not Durability.POWER:
            self._append_synced(run_id, epoch, events)
        elif len(events) == 1:  # the per-step hot path: one self-contained statement
            _append_fenced(self._conn(), run_id, epoch, events[0])
        else:
            with self._write() as tx:
                for event in events:
                    _append_fenced(tx, run_id, epoch, event)

    def _append_synced(self, run_id: str, epoch: int, events: Sequence[HistoryEvent]) -> None:
        """Commit with ``synchronous=FULL`` for this one transaction: in WAL
        mode that fsyncs the WAL, which makes this commit and every earlier
        one durable: the effect barrier costs exactly one fsync."""
        conn = self._conn()
        conn.execute("PRAGMA synchronous = FULL")
        try:
            with self._write() as tx:
                for event in events:
                    _append_fenced(tx, run_id, epoch, event)
        finally:
            conn.execute("PRAGMA synchronous = NORMAL")

    def suspend_run(
        self,
        run_id: str,
        epoch: int,
        event: HistoryEvent,
        wake_at: float | None,
        waiting_on: str | None,
        status: RunStatus = RunStatus.SUSPENDED,
    ) -> None:
        if status not in (RunStatus.SUSPENDED, RunStatus.NEEDS_ATTENTION):
            raise ValueError(f"suspend_run parks a run as suspended or needs_attention, not {status}")
        params = {"run_id": run_id, "epoch": epoch, "now": self.clock(), "wake_at": wake_at,
                  "waiting_on": waiting_on, "status": status.value, "terminal": _terminal_json()}
        self._fenced_transition("suspend", params, event)

    def release_run(self, run_id: str, epoch: int, event: HistoryEvent) -> None:
        self._fenced_transition("release", {"run_id": run_id, "epoch": epoch, "now": self.clock()}, event)

    def finish_run(
        self,
        run_id: str,
        epoch: int,
        event: HistoryEvent,
        status: RunStatus,
        result: Payload | None,
        error: dict[str, Any] | None,
    ) -> None:
        now = self.clock()
        params = _finish_params(run_id, epoch, now, status, result, error)
        with self._write() as tx:
            _append_fenced(tx, run_id, epoch, event)
            (parent,) = tx.execute(_Q["finish"], params).fetchone()
            if parent is not None:
                tx.execute(_Q["wake_waiting_parent"], {"child_id": run_id, "now": now})

    def _fenced_transition(self, query: str, params: dict[str, Any], event: HistoryEvent) -> None:
        with self._write() as tx:
            _append_fenced(tx, params["run_id"], params["epoch"], event)
            tx.execute(_Q[query], params)

    def start_child(self, parent_run_id: str, epoch: int, event: HistoryEvent, child: NewRun) -> RunRecord:
        now = self.clock()
        if child.parent_run_id != parent_run_id:
            child = replace(child, parent_run_id=parent_run_id)
        with self._write() as tx:
            _append_fenced(tx, parent_run_id, epoch, event)
            if _insert_run(tx, child, now, status=RunStatus.PENDING, runnable_at=now):
                _append_auto(tx, child.run_id, EventType.RUN_CREATED, now, 0, None, _created_detail(child))
            record = _select_run(tx, child.run_id)
        assert record is not None
        return record

    # -- operator actions ------------------------------------------------------

    def cancel_run(self, run_id: str, reason: str) -> RunRecord:
        now = self.clock()
        error = _dumps({"type": "Cancelled", "message": reason})
        with self._write() as tx:
            if _select_run(tx, run_id) is None:
                raise RunNotFound(run_id)
            params = {"run_id": run_id, "terminal": _terminal_json()}
            live = [row[0] for row in tx.execute(_Q["select_live_descendants"], params)]
            for rid in live:
                tx.execute(_Q["cancel"], {"run_id": rid, "now": now, "error": error})
                epoch = _select_epoch(tx, rid)
                _append_auto(tx, rid, EventType.RUN_CANCELLED, now, epoch, None, {"reason": reason})
                tx.execute(_Q["wake_waiting_parent"], {"child_id": rid, "now": now})
            record = _select_run(tx, run_id)
        assert record is not None
        return record

    def retry_run(self, run_id: str) -> RunRecord:
        now = self.clock()
        with self._write() as tx:
            run = _select_run(tx, run_id)
            if run is None:
                raise RunNotFound(run_id)
            if run.status not in (RunStatus.FAILED, RunStatus.QUARANTINED):
                raise InvalidRunState(f"run {run_id!r} is {run.status.value}; only failed or "
                                      "quarantined runs can be retried")
            row = tx.execute(_Q["last_failed_position"], {"run_id": run_id}).fetchone()
            tx.execute(_Q["retry"], {"run_id": run_id, "now": now})
            detail = {"from_position": row[0] if row else None, "previous_status": run.status.value}
            _append_auto(tx, run_id, EventType.RUN_RETRIED, now, run.epoch + 1, None, detail)
            record = _select_run(tx, run_id)
        assert record is not None
        return record

    def resolve_operation(
        self, run_id: str, position: int, done: bool, result: Payload | None, detail: dict[str, Any]
    ) -> RunRecord:
        now = self.clock()
        with self._write() as tx:
            run = _select_run(tx, run_id)
            if run is None:
                raise RunNotFound(run_id)
            if run.status is not RunStatus.NEEDS_ATTENTION:
                raise InvalidRunState(f"run {run_id!r} is {run.status.value}; only runs that need "
                                      "attention have operations to resolve")
            tx.execute(_Q["reopen"], {"run_id": run_id, "now": now})
            epoch = run.epoch + 1
            seq = int(tx.execute(_Q["max_seq"], {"run_id": run_id}).fetchone()[0]) + 1
            if done:
                entry = HistoryEvent(
                    run_id=run_id, seq=seq, event=EventType.STEP_COMPLETED, at=now, epoch=epoch,
                    position=position, step_kind=detail.get("step_kind", "tool"), name=detail.get("name"),
                    payload=result, detail={"resolved_by": "operator", **detail},
                )
            else:
                entry = HistoryEvent(
                    run_id=run_id, seq=seq, event=EventType.OP_RESOLVED, at=now, epoch=epoch,
                    position=position, step_kind=detail.get("step_kind", "tool"), name=detail.get("name"),
                    detail={"position": position, "done": False, **detail},
                )
            tx.execute(_Q["insert_event"], _event_params(entry))
            record = _select_run(tx, run_id)
        assert record is not None
        return record

    def kill_runs(
        self, reason: str, *, run_id: str | None = None, tenant: str | None = None
    ) -> list[RunRecord]:
        if (run_id is None) == (tenant is None):
            raise ValueError("kill_runs takes exactly one of run_id and tenant")
        now = self.clock()
        error = _dumps({"type": "Killed", "message": reason})
        with self._write() as tx:
            params: dict[str, Any] = {"terminal": _terminal_json(), "run_id": run_id, "tenant": tenant}
            if run_id is not None:
                if _select_run(tx, run_id) is None:
                    raise RunNotFound(run_id)
                query = "select_live_descendants"
            else:
                query = "select_live_of_tenant"
            live = [row[0] for row in tx.execute(_Q[query], params)]
            killed: list[RunRecord] = []
            for rid in live:
                tx.execute(_Q["kill"], {"run_id": rid, "now": now, "error": error})
                record = _select_run(tx, rid)
                assert record is not None
                _append_auto(tx, rid, EventType.RUN_KILLED, now, record.epoch, None, {"reason": reason})
                tx.execute(_Q["wake_waiting_parent"], {"child_id": rid, "now": now})
                killed.append(record)
        return killed

    def revive_run(self, run_id: str) -> RunRecord:
        now = self.clock()
        with self._write() as tx:
            run = _select_run(tx, run_id)
            if run is None:
                raise RunNotFound(run_id)
            if run.status not in (RunStatus.KILLED, RunStatus.HALTED):
                raise InvalidRunState(f"run {run_id!r} is {run.status.value}; only killed or halted runs "
                                      "can be revived")
            tx.execute(_Q["reopen"], {"run_id": run_id, "now": now})
            _append_auto(tx, run_id, EventType.RUN_REVIVED, now, run.epoch + 1, None,
                         {"previous_status": run.status.value})
            record = _select_run(tx, run_id)
        assert record is not None
        return record

    def set_budget(self, run_id: str, budget: dict[str, Any]) -> RunRecord:
        now = self.clock()
        with self._write() as tx:
            run = _select_run(tx, run_id)
            if run is None:
                raise RunNotFound(run_id)
            if run.status is RunStatus.RUNNING:
                raise InvalidRunState(f"run {run_id!r} is running; change its budget once it is suspended")
            tx.execute(_Q["set_budget"], {"run_id": run_id, "budget": _dumps(budget), "now": now})
            _append_auto(tx, run_id, EventType.RUN_BUDGET_CHANGED, now, run.epoch, None, {"budget": budget})
            record = _select_run(tx, run_id)
        assert record is not None
        return record

    def halt_run(self, run_id: str, epoch: int, event: HistoryEvent, error: dict[str, Any]) -> None:
        now = self.clock()
        with self._write() as tx:
            _append_fenced(tx, run_id, epoch, event)
            tx.execute(_Q["halt"], {"run_id": run_id, "epoch": epoch, "error": _dumps(error), "now": now})
            tx.execute(_Q["wake_waiting_parent"], {"child_id": run_id, "now": now})

    # -- retention -------------------------------------------------------------

    def prune_runs(
        self,
        older_than: float,
        statuses: Collection[RunStatus] | None = None,
        limit: int = 1000,
        *,
        dry_run: bool = False,
    ) -> int:
        wanted = prune_statuses(statuses)
        check_prune_limit(limit)
        if dry_run:
            return len(_select_prunable(self._conn(), older_than, wanted, limit))
        now = self.clock()
        with self._write() as tx:
            doomed = _select_prunable(tx, older_than, wanted, limit)
            if doomed:
                ids = {"run_ids": _dumps(doomed)}
                tx.execute(_Q["queue_artifacts_of_runs"], {**ids, "now": now})
                tx.execute(_Q["delete_history_of_runs"], ids)
                tx.execute(_Q["delete_runs"], ids)
        # Only after the runs are gone for good: a crash from here on leaves
        # queued refs, never a run whose artifacts were deleted.
        self._collect_artifacts(min(older_than, now - ARTIFACT_GRACE_SECONDS), page=_page_size(limit))
        return len(doomed)

    def _collect_artifacts(self, stored_before: float, page: int) -> None:
        """Walk the collection queue a page per write transaction: delete the
        files nothing references and nobody stored since ``stored_before``;
        drop the refs that are referenced again or already gone."""
        after: tuple[float | None, str] = (None, "")
        while True:
            with self._write() as tx:
                params = {"after_at": after[0], "after_ref": after[1], "page": page}
                rows = tx.execute(_Q["select_gc_page"], params).fetchall()
                if not rows:
                    return
                after = (rows[-1][1], rows[-1][0])
                done = [ref for ref, _, referenced in rows if referenced]
                unreferenced = [ref for ref, _, referenced in rows if not referenced]
                if unreferenced:
                    # Holding the write lock: no row can start referencing these
                    # meanwhile; holding the artifact lock: no put can refresh one
                    # between the time check and the unlink.
                    with self._artifact_lock(exclusive=True):
                        done += [ref for ref in unreferenced if self._unlink_if_stale(ref, stored_before)]
                if done:
                    tx.execute(_Q["dequeue_artifacts"], {"refs": _dumps(done)})
            if len(rows) < page:
                return

    def _unlink_if_stale(self, ref: str, stored_before: float) -> bool:
        """Delete artifact ``ref`` unless it was stored at or after
        ``stored_before``; return whether it is gone."""
        path = self.artifact_dir / ref[:2] / ref
        try:
            if os.stat(path).st_mtime >= stored_before:
                return False
            os.unlink(path)
        except FileNotFoundError:
            pass
        return True

    @contextlib.contextmanager
    def _artifact_lock(self, *, exclusive: bool) -> Iterator[None]:
        """Advisory lock between ``put_artifact`` (shared) and the deletion of
        artifact files (exclusive), across threads and processes: each holder
        opens the lock file anew, and ``flock`` locks of separate opens
        exclude each other even within one process."""
        if fcntl is None:  # pragma: no cover
            yield
            return
        self.artifact_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.artifact_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # releases the lock

    # -- artifacts ---------------------------------------------------------------

    def put_artifact(self, data: bytes) -> str:
        ref = hashlib.sha256(data).hexdigest()
        target = self.artifact_dir / ref[:2] / ref
        # The file's modification time is when it was last stored, in the
        # store's clock: pruning spares what was stored since its cutoff.
        now = self.clock()
        with self._artifact_lock(exclusive=False):
            if _touch(target, now):
                return ref
            with self._write() as tx:  # queued first: a crash after it leaves no untracked file
                tx.execute(_Q["queue_artifact"], {"ref": ref, "now": now})
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                    if self.durability is Durability.POWER:
                        fh.flush()
                        os.fsync(fh.fileno())
                os.utime(tmp, (now, now))
                os.replace(tmp, target)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        if self.durability is Durability.POWER:
            dir_fd = os.open(target.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        return ref

    def get_artifact(self, ref: str) -> bytes:
        if len(ref) != 64 or any(c not in "0123456789abcdef" for c in ref):
            raise PayloadError(f"malformed artifact reference {ref!r}")
        try:
            return (self.artifact_dir / ref[:2] / ref).read_bytes()
        except FileNotFoundError:
            raise PayloadError(f"artifact {ref} is missing from {self.artifact_dir}") from None


# -- helpers: each runs inside the caller's transaction ---------------------------


def _page_size(limit: int) -> int:
    """Rows read per query while pruning: enough for a batch of ``limit``
    single-run trees, bounded so a huge limit (a dry run counting
    everything) does not read the whole table at once."""
    return min(max(limit, 64), 1000)


def _touch(path: Path, now: float) -> bool:
    """Set ``path``'s modification time to ``now``; ``False`` if it does not exist."""
    try:
        os.utime(path, (now, now))
    except FileNotFoundError:
        return False
    except PermissionError:  # someone else's file: only "the current time" may be set
        with contextlib.suppress(OSError):
            os.utime(path)
    return True


def _select_prunable(
    conn: sqlite3.Connection, older_than: float, statuses: Collection[RunStatus], limit: int
) -> list[str]:
    """The runs ``prune_runs`` deletes now: whole qualifying trees, oldest
    root first, about ``limit`` runs (see ``contract.choose_trees``)."""
    chosen: list[str] = []
    after: tuple[float | None, str] = (None, "")
    page = _page_size(limit)
    params: dict[str, Any] = {"statuses": _dumps(sorted(s.value for s in statuses)), "cutoff": older_than,
                              "page": page}
    while True:
        rows = conn.execute(_Q["select_prune_roots"], {**params, "after_at": after[0], "after_id": after[1]}
                            ).fetchall()
        if not rows:
            return chosen
        after = (rows[-1][1], rows[-1][0])
        roots = [row[0] for row in rows]
        trees: dict[str, list[tuple[str, str, float]]] = {}
        for root, run_id, status, updated_at in conn.execute(_Q["select_trees"], {"roots": _dumps(roots)}):
            trees.setdefault(root, []).append((run_id, status, updated_at))
        if choose_trees(roots, trees, statuses, older_than, limit, chosen) or len(rows) < page:
            return chosen


def _split_statements(script: str) -> list[str]:
    statements: list[str] = []
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip() and not all(ln.strip().startswith("--") or not ln.strip()
                                  for ln in buffer.splitlines()):
        raise StoreError(f"unterminated SQL statement in migration: {buffer.strip()[:60]!r}")
    return statements


def _insert_run(
    tx: sqlite3.Connection,
    run: NewRun,
    now: float,
    *,
    status: RunStatus,
    runnable_at: float | None,
    epoch: int = 0,
    owner: str | None = None,
    lease_until: float | None = None,
) -> bool:
    params = {
        "run_id": run.run_id,
        "tenant": run.tenant,
        "workflow": run.workflow,
        "workflow_version": run.workflow_version,
        "thread_id": run.thread_id,
        "queue": run.queue,
        "priority": run.priority,
        "parent_run_id": run.parent_run_id,
        "status": status.value,
        "input": run.input.data,
        "input_ref": run.input.ref,
        "epoch": epoch,
        "owner": owner,
        "lease_expires_at": lease_until,
        "runnable_at": runnable_at,
        "budget": _dumps(run.budget) if run.budget is not None else None,
        "now": now,
    }
    return tx.execute(_Q["insert_run"], params).rowcount == 1


def _select_run(conn: sqlite3.Connection, run_id: str) -> RunRecord | None:
    row = conn.execute(_Q["select_run"], {"run_id": run_id}).fetchone()
    return _run_from_row(row) if row else None


def _select_epoch(tx: sqlite3.Connection, run_id: str) -> int:
    return int(tx.execute("SELECT epoch FROM runs WHERE run_id = ?", (run_id,)).fetchone()[0])


def _run_from_row(row: Sequence[Any]) -> RunRecord:
    return RunRecord(
        run_id=row[0],
        workflow=row[1],
        workflow_version=row[2],
        tenant=row[3],
        thread_id=row[4],
        status=RunStatus(row[5]),
        input=Payload(row[6], row[7]),
        result=Payload(row[8], row[9]) if (row[8] is not None or row[9] is not None) else None,
        error=_loads(row[10]) if row[10] is not None else None,
        epoch=row[11],
        owner=row[12],
        lease_expires_at=row[13],
        wake_at=row[14],
        waiting_on=row[15],
        recoveries=row[16],
        queue=row[17],
        priority=row[18],
        parent_run_id=row[19],
        created_at=row[20],
        updated_at=row[21],
        budget=_loads(row[22]) if row[22] is not None else None,
    )


def _select_history(
    conn: sqlite3.Connection, run_id: str, after_seq: int, limit: int | None
) -> list[HistoryEvent]:
    params = {"run_id": run_id, "after_seq": after_seq, "limit": -1 if limit is None else limit}
    return [_event_from_row(row) for row in conn.execute(_Q["select_history"], params)]


def _event_from_row(row: Sequence[Any]) -> HistoryEvent:
    payload = Payload(row[12], row[13]) if (row[12] is not None or row[13] is not None) else None
    return HistoryEvent(
        run_id=row[0],
        seq=row[1],
        event=EventType(row[2]),
        at=row[3],
        epoch=row[4],
        worker=row[5],
        position=row[6],
        step_kind=row[7],
        name=row[8],
        input_hash=row[9],
        attempt=row[10],
        started_at=row[11],
        payload=payload,
        detail=_loads(row[14]) if row[14] is not None else None,
    )


def _event_params(event: HistoryEvent) -> tuple[Any, ...]:
    payload = event.payload
    return (
        event.run_id,
        event.seq,
        event.event.value,
        event.at,
        event.epoch,
        event.worker,
        event.position,
        event.step_kind,
        event.name,
        event.input_hash,
        event.attempt,
        event.started_at,
        payload.data if payload else None,
        payload.ref if payload else None,
        _dumps(event.detail) if event.detail is not None else None,
    )


def _append_auto(
    tx: sqlite3.Connection,
    run_id: str,
    event: EventType,
    at: float,
    epoch: int,
    worker: str | None,
    detail: dict[str, Any] | None,
) -> HistoryEvent:
    """Append after the current maximum: for writers that bump the epoch."""
    seq = int(tx.execute(_Q["max_seq"], {"run_id": run_id}).fetchone()[0]) + 1
    entry = _event(run_id, seq, event, at, epoch, worker, detail)
    if tx.execute(_Q["insert_event"], _event_params(entry)).rowcount != 1:
        raise StoreError(f"run {run_id!r} vanished while its history was being written")
    return entry


def _append_fenced(tx: sqlite3.Connection, run_id: str, epoch: int, event: HistoryEvent) -> None:
    if event.run_id != run_id:
        raise ValueError(f"event for run {event.run_id!r} appended to run {run_id!r}")
    if event.epoch != epoch:  # the statement fences on the entry's epoch: it must be the caller's
        raise LeaseLost(run_id, epoch)
    try:
        inserted = tx.execute(_Q["insert_event_fenced"], _event_params(event)).rowcount
    except sqlite3.IntegrityError:
        raise LeaseLost(run_id, epoch) from None  # seq taken: someone else appended
    if inserted != 1:
        raise LeaseLost(run_id, epoch)


def _claim(
    tx: sqlite3.Connection,
    run_id: str,
    worker: str,
    now: float,
    lease_seconds: float,
    max_recoveries: int,
) -> Claim | None:
    status_s, old_owner, old_epoch, recoveries, _ = tx.execute(
        _Q["select_claim_state"], {"run_id": run_id}
    ).fetchone()
    status = RunStatus(status_s)
    takeover = status is RunStatus.RUNNING
    if takeover:
        recoveries += 1
        lost = {"worker": old_owner, "epoch": old_epoch, "reason": "expired"}
        _append_auto(tx, run_id, EventType.LEASE_LOST, now, old_epoch, old_owner, lost)
        if recoveries > max_recoveries:
            error = {
                "type": "Quarantined",
                "message": f"run lost its worker {recoveries} times (limit {max_recoveries})",
            }
            tx.execute(_Q["quarantine"], {"run_id": run_id, "now": now, "recoveries": recoveries,
                                          "error": _dumps(error)})
            _append_auto(tx, run_id, EventType.RUN_QUARANTINED, now, old_epoch + 1, None, error)
            return None
    until = now + lease_seconds
    params = {"run_id": run_id, "worker": worker, "lease_until": until, "now": now, "recoveries": recoveries}
    tx.execute(_Q["claim"], params)
    epoch = old_epoch + 1
    if takeover:
        _append_auto(tx, run_id, EventType.LEASE_TAKEN_OVER, now, epoch, worker,
                     {"from_worker": old_owner, "lease_until": until})
    else:
        _append_auto(tx, run_id, EventType.LEASE_CLAIMED, now, epoch, worker, {"lease_until": until})
        first = status is RunStatus.PENDING and old_epoch == 0
        follow = EventType.RUN_STARTED if first else (
            EventType.RUN_WOKEN if status is RunStatus.SUSPENDED else None)
        if follow is not None:
            _append_auto(tx, run_id, follow, now, epoch, worker, None)
    record = _select_run(tx, run_id)
    assert record is not None
    history = _select_history(tx, run_id, 0, None)
    return Claim(run=record, history=history, next_seq=history[-1].seq + 1 if history else 1)


def _queues_with_lanes(tx: sqlite3.Connection) -> list[str]:
    """Every queue with a run that has a runnable_at, one index seek each."""
    queues: list[str] = []
    after = ""
    while (row := tx.execute(_Q["next_queue"], {"after": after}).fetchone()) is not None:
        queues.append(after := row[0])
    return queues
