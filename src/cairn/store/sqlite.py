"""The embedded backend: one SQLite file in WAL mode, shared by any number of
threads and worker processes on one machine.

Why these choices (see docs/design.md for the long form):

* **WAL** lets readers (``cairn events --follow``, ``cairn runs``) proceed while
  a worker writes, and makes a commit an append to one file.
* **synchronous=NORMAL** (durability ``process``): a commit is in the OS page
  cache before it returns, so it survives any process crash, SIGKILL
  included; power loss may drop the last commits. **synchronous=FULL**
  (durability ``power``): the WAL is fsynced on every commit. The effect
  barrier of the ``process`` mode is an ordinary commit followed by one
  ``fdatasync`` of the WAL file (``_sync_wal``).
* **BEGIN IMMEDIATE** for every write transaction: it takes the write lock up
  front, so concurrent writers queue on ``busy_timeout`` instead of failing
  with a lock upgrade error halfway through.
* **One write connection, a read connection per thread.** Every write of a
  store's threads holds its writer lock (``_writing``) and runs on the one
  connection that lock guards (``_writer_conn``): SQLite writes one
  transaction at a time anyway, and a connection that finds the database
  changed by another connection drops its whole page cache at its next
  transaction, so writers taking turns on a connection each (LangGraph's
  executor threads, a worker's pool) re-read every b-tree page they touched
  (issue 24, 2026-12-07 evening). Reads run on the calling thread's own
  connection, concurrently with the writer (WAL); a read inside a write
  runs on the write's connection and sees what it wrote.
* **Tenancy.** Every history row carries its run's tenant, read from the run
  row by the INSERT itself, so the per-step append stays one statement.
  Artifacts are files named by their SHA-256, shared by every tenant.
* **A dialect.** The rules of every transition are ``lifecycle``'s pure
  functions, the operator transitions, the holder writes (but the hot
  append and the finish), the reads of runs and histories and the queue
  settings are written once in ``sqlbase.SQLStore``, and
  the row mapping is ``rows``'s: this module reads their inputs inside a
  write transaction and applies their outputs. Every ``sqlite3.Error``
  leaves as ``StoreError`` (``_write``, ``_read`` and the one-statement
  append are the only places that run statements).
* **Set-based claims.** A claim reads the state of its candidates with the
  lane walk, then writes the batch in three statements (histories, run rows,
  lifecycle entries), however many runs it takes.
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
import logging
import os
import shutil
import sqlite3
import tempfile
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from cairn import faults
from cairn.errors import LeaseLost, PayloadError, StoreError, TransactionMisuse
from cairn.faults import fault_point
from cairn.store import admission, auditlinks, sqlitevec, transactions
from cairn.store import lifecycle as lc
from cairn.store.auditlinks import Digester
from cairn.store.contract import ARTIFACT_GRACE_SECONDS, Migratable, Notifier
from cairn.store.records import (
    Claim,
    Durability,
    HistoryEvent,
    NewRun,
    Payload,
    RunRecord,
    RunStatus,
    UsageTotals,
)
from cairn.store.rekey import REASON_PREFIX
from cairn.store.retention import Cutoffs
from cairn.store.retentionsql import Fence
from cairn.store.rows import (
    LINK_TAG,
    claim_history,
    claim_status,
    claimed_run,
    dumps,
    event_from_row,
    event_values,
    finish_params,
    new_record,
    queue_from_row,
    run_from_row,
    run_params,
    share_bucket_from_row,
    share_from_row,
    update_params,
)
from cairn.store.runids import unclaimable
from cairn.store.sqlbase import NO_FAULTS, Faults, Hold, SQLStore, commit_faults
from cairn.store.sqlfiles import load_migrations, load_queries
from cairn.store.vectorindex import Scored, quantize
from cairn.store.wakeups import TRIGGERS, Mark, Waker

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: puts and collection are not serialised
    fcntl = None  # type: ignore[assignment]

_Q = load_queries("sqlite")
_T = TypeVar("_T")


def _bind_without_lookups() -> None:
    """Let ``sqlite3`` bind ``None`` and ``bytes`` parameters without its
    adapter search.

    The module binds ``int``, ``float`` and ``str`` directly but sends every
    other parameter through ``microprotocols.adapt``: a registry miss, then
    ``__adapt__`` and ``__conform__`` looked up and not found, about 0.2 µs
    per ``None`` and 0.8 µs per ``bytes`` here. A history row binds a dozen
    ``None``s and a payload, so that search was about 170,000 of the
    1,400,000 instructions of a three-step run (callgrind). An identity
    adapter found in the registry ends the search at its first lookup and
    binds exactly what was passed (``dict.get`` of an empty dict returns
    ``None`` for ``None``; ``bytes(b)`` returns ``b`` itself). The registry
    is the process's: an adapter registered before for either type (by the
    application) is left in place, and ours changes no value anyone binds."""
    protocol = sqlite3.PrepareProtocol
    identities: dict[type[Any], Callable[[Any], Any]] = {type(None): {}.get, bytes: bytes}
    for kind, adapter in identities.items():
        if (kind, protocol) not in sqlite3.adapters:
            sqlite3.register_adapter(kind, adapter)


_bind_without_lookups()
#: candidates beyond 2k that a search without a filter scores before it
#: checks their items (``search_nearest_vectors``): room for stale or
#: expired items among the nearest before it falls back to the full join
NEAREST_SLACK = 32

#: fdatasync where the platform has it (it skips metadata that does not
#: affect reading the data back); fsync elsewhere.
_fdatasync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)
_TERMINAL_JSON = dumps(list(lc.TERMINAL))
_BUSY_TIMEOUT_MS = 30_000
log = logging.getLogger("cairn.store")
_INSERT_EVENT = _Q["insert_event"]
_INSERT_EVENT_FENCED = _Q["insert_event_fenced"]
_INSERT_EVENT_NEXT = _Q["insert_event_next"]
_TEMP_OBJECT = ("a transactional step's body created a temporary table, view, index or trigger: it "
                "would outlive the transaction on the store's connection and could shadow or act on "
                "Cairn's own tables")
_INSERT_CREATED_EVENTS = _Q["insert_created_events"]
_INSERT_HISTORY_PAYLOAD = _Q["insert_history_payload"]
#: Runs whose last entry this store keeps in ``_tails`` at most (executions
#: that end pop theirs; this only bounds those that never told it).
_MAX_TAILS = 4096

#: the stores open in this process: a child forked from it drops their connections (``_after_fork``)
_OPEN: weakref.WeakSet[SQLiteStore] = weakref.WeakSet()


def _after_fork() -> None:
    """In a forked child: forget every store's connections, which are the
    parent's (SQLite's rule: a connection never crosses a fork); each opens
    its own on first use. Since every thread's writes share one connection
    (``_writer_conn``), any thread of the child would otherwise write on it."""
    for store in list(_OPEN):
        store._shared = None
        store._local = threading.local()
        store._connections = []
        store._wal_fds = []
        store._lock = threading.Lock()
        store._writer = threading.RLock()


os.register_at_fork(after_in_child=_after_fork)



class SQLiteStore(SQLStore[sqlite3.Connection], Migratable, Notifier):
    """Store contract on one SQLite database file (see ``contract.Store``)."""

    #: a LangGraph write holds the database from its BEGIN IMMEDIATE: ``lg_lock_thread``
    #: (``SELECT 1``) is not run (issue 24, 2026-12-07)
    _lg_lock_statement = False
    #: folded writes in the binary record (checkpointsql.FOLD_TAG_2), as PostgreSQL (issue 24,
    #: 2026-12-07): the bench graph's three writes a super-step take 66 bytes, not 107 in JSON, in
    #: about the same CPU; JSON records folded before read as before
    _lg_compact_fold = True
    #: every other version of a list a tail in the checkpoint's row, not a row of lg_blobs (as
    #: PostgreSQL; issue 24, 2026-12-07 afternoon: callgrind on the bench's recorded calls, ~24,000
    #: instructions of ~1.25 million a super-step less, 0.5 statement; on disk 1.19x either way)
    lg_tail_every = 2

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Durability = Durability.PROCESS,
        clock: Callable[[], float] = time.time,
        auto_migrate: bool = True,
        busy_timeout: float = _BUSY_TIMEOUT_MS / 1000,
        read_only: bool = False,
    ) -> None:
        """``auto_migrate=False`` opens the database without touching its
        schema (for tools that only report its version); ``migrate()`` then
        brings it up to date. ``busy_timeout``: seconds a writer waits for
        the write lock before failing with ``StoreError``.

        ``read_only=True`` is how inspection opens a database: ``mode=ro``
        connections with ``query_only`` on, no journal-mode change, no
        migration and no write transaction, so a reader never waits for a
        writer's lock (WAL readers do not) and never changes the file; a
        write raises ``StoreError``. The database must exist."""
        self.path = Path(path)
        self.read_only = read_only
        self.durability = durability
        self.clock = clock
        self.artifact_dir = self.path.with_name(self.path.name + ".artifacts")
        self._busy_ms = int(busy_timeout * 1000)
        self._local = threading.local()
        #: the connection every write runs on, guarded by ``_writer`` (``_writer_conn``)
        self._shared: _Connection | None = None
        self._connections: list[sqlite3.Connection] = []
        self._wal_fds: list[int] = []
        self._lock = threading.Lock()
        #: held around every write of this store's threads (see ``_writing``)
        self._writer = threading.RLock()
        self._closed = False
        self._lane_cursor = admission.LaneCursor()
        #: wake-ups for other processes' workers (``listen``; see ``store.wakeups``)
        self._waker = Waker(self.path)
        _OPEN.add(self)
        #: run -> (epoch, seq, at) of the last entry this store appended to
        #: it under that epoch: the hot path's fence needs no read of history
        #: when the next entry follows it (see ``append``)
        self._tails: dict[str, tuple[int, int, float]] = {}
        #: run -> (seq, link) of its last entry this store appended and committed (the audit chain)
        self._links: dict[str, tuple[int, bytes]] = {}
        #: opens a sealed entry's payload and detail for its digest (a ``SealedStore`` sets it)
        self.audit_digest: Digester | None = None
        #: whether the connections score vectors with sqlite-vec (``store.sqlitevec``)
        self.sqlite_vec = False
        sqlitevec.prepare()
        try:
            if not read_only:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = self._conn()
            if auto_migrate and not read_only:
                self._migrate(conn)
                self._install_wakes(conn)
        except (StoreError, sqlite3.Error, OSError) as exc:
            raise StoreError(f"cannot open SQLite database {str(self.path)!r}: {_reason(exc)}") from None

    # -- connections and transactions: where sqlite3 errors become StoreError -----------------

    def _failure(self, exc: sqlite3.Error) -> StoreError:
        text = str(exc)
        if self.read_only and text.startswith(("no such table", "no such column")):
            # Read-only opens never migrate: a statement of this version that
            # finds no table or column means the file predates it.
            try:
                version, latest = self.schema_version(), len(load_migrations("sqlite"))
            except StoreError:
                version, latest = 0, 0
            if version < latest:
                return StoreError(f"the schema of {str(self.path)!r} is too old to read (version {version}, "
                                  f"this Cairn needs {latest}): run 'cairn db migrate' ({text})")
        return StoreError(f"SQLite error ({str(self.path)!r}): {text}")

    def _conn(self) -> _Connection:
        """The calling thread's connection: the write's while it holds one
        (``_write``), else its own read connection."""
        local = self._local
        conn: _Connection | None = getattr(local, "writing", None) or getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = self._open(shared=False)
        return conn

    def _writer_conn(self) -> _Connection:
        """The connection every write runs on; the caller holds ``_writer``."""
        conn = self._shared
        if conn is None:
            conn = self._shared = self._open(shared=True)
        return conn

    def _open(self, *, shared: bool) -> _Connection:
        if self._closed:
            raise StoreError("store is closed")
        try:
            conn = self._connect(shared=shared)
            self.sqlite_vec = sqlitevec.load(conn)
        except sqlite3.Error as exc:
            raise self._failure(exc) from None
        with self._lock:
            self._connections.append(conn)
        return conn

    def _connect(self, *, shared: bool = False) -> _Connection:
        # a shared connection is used by one thread at a time, under ``_writer``
        if self.read_only:
            uri = f"file:{urllib.parse.quote(str(self.path.absolute()))}?mode=ro"
            conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=self._busy_ms / 1000,
                                   factory=_Connection)
            conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            conn.execute("PRAGMA query_only = 1")
            return conn
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=self._busy_ms / 1000,
                               factory=_Connection, check_same_thread=not shared)
        conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise StoreError(f"{self.path} cannot use WAL journaling (got {mode!r})")
        sync = "FULL" if self.durability is Durability.POWER else "NORMAL"
        conn.execute(f"PRAGMA synchronous = {sync}")
        conn.execute("PRAGMA foreign_keys = OFF")
        conn.mark = mark = Mark(self.clock)
        conn.create_function("cairn_wake", 1, mark)
        conn.unlinked = unlinked = _Unlinked()
        conn.create_function("cairn_unlinked", 0, unlinked)
        self._install_wake(conn)
        return conn

    def _install_wakes(self, conn: _Connection) -> None:
        """After migrating: the triggers on this thread's connection and on the
        writer's, which the migration's writes may have opened before the
        schema existed."""
        self._install_wake(conn)
        with self._holding_writer() as writer:
            self._install_wake(writer)

    def _install_wake(self, conn: _Connection) -> None:
        """The temp triggers that mark this connection's commits that make a
        run runnable (``store.wakeups``), and the one that marks an entry
        written without its audit link (``_UNLINKED_TRIGGER``); none before
        the schema exists."""
        try:
            for statement in TRIGGERS:
                conn.execute(statement)
            if _has_audit_columns(conn):
                conn.execute(_UNLINKED_TRIGGER)
                conn.execute(_SPILLED_VIEW)
                conn.execute(_SPILLED_TRIGGER)
        except sqlite3.OperationalError as exc:
            if "no such table" not in str(exc):
                raise
        conn.temp_objects = frozenset(conn.execute(_Q["transact_session_check"]))

    @contextlib.contextmanager
    def _write(self, faults: Faults = NO_FAULTS) -> Iterator[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE``), with its fault points."""
        if self.read_only:
            raise StoreError(f"SQLite database {str(self.path)!r} is open read-only (for inspection)")
        woke = False
        with self._holding_writer() as conn:
            mark, unlinked = conn.mark, conn.unlinked
            assert mark is not None  # a writable connection's (_connect)
            assert unlinked is not None
            mark.marked = unlinked.marked = False
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                    if unlinked.marked:  # an entry went in without its link: link it now
                        _link_unlinked(conn, self.audit_digest)
                    fault_point(faults[0])
                    conn.execute("COMMIT")
                    woke, mark.marked = mark.marked, False  # the next writer's to set once this lock goes
                except BaseException:
                    if conn.in_transaction:
                        with contextlib.suppress(sqlite3.Error):
                            conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise self._failure(exc) from None
            except UnicodeEncodeError as exc:  # a parameter no database can hold (rolled back above)
                raise lc.unstorable_text(exc) from None
        if woke:  # only now can another process see the change
            self._waker.wake()
        fault_point(faults[1])

    @contextlib.contextmanager
    def _holding_writer(self) -> Iterator[_Connection]:
        """This store's writer lock (``_writing``) and the connection it
        guards, which the thread's statements run on meanwhile (``_conn``)."""
        self._writing()
        local = self._local
        try:
            conn = local.writing = self._writer_conn()
            yield conn
        finally:
            local.writing = None
            self._writer.release()

    def _writing(self) -> None:
        """Take this store's writer lock, which every write of its threads
        holds (with ``busy_timeout`` as its bound, like SQLite's own lock).

        SQLite lets one connection write at a time and makes the others wait
        in its busy handler, which sleeps 1, 2, 5, 10... ms between tries: a
        step append that met a worker's claim poll (or another thread's
        append) mid-transaction lost a millisecond or more, twenty times its
        own cost, and a worker's per-step time grew with its poll rate
        (strace: hundreds of ``clock_nanosleep`` per thousand steps). Threads
        of one store queue here instead and go on the moment the writer
        before them is done; other processes still meet SQLite's lock."""
        if not self._writer.acquire(False) and not self._writer.acquire(True, self._busy_ms / 1000):
            raise StoreError(f"SQLite database {str(self.path)!r} is locked: another thread of this process "
                             f"kept writing for {self._busy_ms / 1000:g}s")

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """Statements outside a write transaction."""
        conn = self._conn()
        try:
            yield conn
        except sqlite3.Error as exc:
            raise self._failure(exc) from None
        except UnicodeEncodeError as exc:  # a parameter no database can hold
            raise lc.unstorable_text(exc) from None

    def _migrate(self, conn: sqlite3.Connection) -> list[int]:
        with self._read():
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
            conn = self._conn()
            applied = self._migrate(conn)
            if not self.read_only:
                self._install_wakes(conn)
            return applied
        except StoreError as exc:
            raise StoreError(f"cannot migrate SQLite database {str(self.path)!r}: {_reason(exc)}") from None

    def schema_version(self) -> int:
        """The highest migration applied to this database (0: none)."""
        with self._read() as conn:
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
            self._shared = None
            for fd in self._wal_fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._wal_fds.clear()
        self._local = threading.local()
        self._waker.close()

    # -- wake-ups (contract.Notifier) ---------------------------------------------------------

    def listen(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` soon after any process's commit made a run of
        this database runnable (a datagram socket of this listener's own:
        ``store.wakeups``), and once at the start. Where no socket can be
        bound (a file system without unix sockets, a read-only directory) it
        says so once and the caller polls, as it always does anyway."""
        try:
            return self._waker.listen(callback)
        except OSError as exc:
            log.warning("cannot listen for wake-ups of %s (%s): new work is found by polling only",
                        self.path, exc)
            return lambda: None

    # -- contract, dialect code: creating runs, and a run's usage -----------------------------

    def create_run(self, run: NewRun) -> tuple[RunRecord, bool]:
        with self._write() as tx:
            now = self.clock()
            if not self._create_in(tx, run, now):
                existing = _select_run(tx, run.run_id)
                assert existing is not None
                return existing, False
        return new_record(run, now, RunStatus.PENDING, epoch=0), True

    def create_claimed_run(self, run: NewRun, worker: str, lease_seconds: float) -> Claim | None:
        with self._write() as tx:
            now = self.clock()
            events = lc.create_claimed(run, worker, now, lease_seconds)
            until = now + lease_seconds
            params = run_params(run, now, status=RunStatus.RUNNING, runnable_at=until, epoch=1, owner=worker,
                                lease_until=until)
            if not _insert_run(tx, params):
                return None
            # A run created here has no history to follow or to clamp the time
            # against, it is running at epoch 1 and its tenant is the one just
            # inserted: its three entries go in one statement without a read
            # (and the store knows its last entry).
            created, claimed, started = events  # the statement's three rows
            tx.execute(_INSERT_CREATED_EVENTS, (*_event_row(tx, created), *_event_row(tx, claimed),
                                                *_event_row(tx, started), run.tenant))
        self._tail(run.run_id, 1, events[-1].seq, events[-1].at)
        record = new_record(run, now, RunStatus.RUNNING, epoch=1, owner=worker, lease_until=until)
        return Claim(run=record, history=events, next_seq=4)

    def run_usage(self, run_id: str) -> UsageTotals:
        with self._read() as conn:
            tokens, cost, tool_calls, last_seq = conn.execute(_Q["run_usage"], {"run_id": run_id}).fetchone()
        if not last_seq and (archived := self.archived_usage(run_id)) is not None:
            return archived
        return UsageTotals(int(tokens), float(cost), int(tool_calls), int(last_seq))

    # -- contract, dialect code: claims and leases --------------------------------------------

    def claim_runs(
        self,
        worker: str,
        workflows: Collection[str],
        limit: int,
        lease_seconds: float,
        max_recoveries: int,
        queues: Collection[str] | None = None,
        bundles: Collection[str] | None = None,
    ) -> list[Claim]:
        if limit <= 0 or not workflows:
            return []
        wanted = dumps(list(workflows))
        tails: dict[str, tuple[int, int, float]] = {}
        served_bundles = None if bundles is None else dumps(sorted(set(bundles)))
        with self._write() as tx:
            now = self.clock()
            limits = {row[0]: queue_from_row(row) for row in tx.execute(_Q["select_queues"])}
            served = sorted(set(queues)) if queues is not None else _queues_with_lanes(tx)
            lanes: list[admission.Lane] = []
            states: dict[str, tuple[Any, ...]] = {}
            for queue in served:
                lanes.extend(self._lanes(tx, queue, wanted, now, limit, states, served_bundles))
            queue_running = {q: tx.execute(_Q["queue_running"], {"queue": q}).fetchone()[0]
                             for q in {lane.queue for lane in lanes} if q in limits}
            buckets: dict[admission.BucketKey, admission.Bucket] = {}
            for queue in {key[0] for key in admission.bucket_keys(limits, lanes)}:
                for q, tenant, tokens, at in tx.execute(_Q["select_buckets"], {"queue": queue}):
                    buckets[(q, tenant)] = admission.Bucket(tokens, at)
            chosen = admission.plan(lanes, limits, queue_running, buckets, now, limit)
            claims = _claim_many(tx, [_claim_state(states[c.run_id]) for c in chosen], worker, now,
                                 lease_seconds, max_recoveries, tails)
            claimed = [c for c, claim in zip(chosen, claims, strict=True) if claim is not None]
            for (queue, tenant), state in admission.charge(limits, buckets, claimed, now).items():
                tx.execute(_Q["upsert_bucket"], {"queue": queue, "tenant": tenant, "tokens": state.tokens,
                                                 "at": state.at})
            for (queue, tenant), state in admission.charge_shares(lanes, claimed, now).items():
                tx.execute(_Q["spend_share_tokens"], {"queue": queue, "tenant": tenant,
                                                      "tokens": state.tokens, "at": state.at})
            if chosen:  # the claim's commit boundary (an idle poll is not one)
                fault_point("store.claim.before_commit")
        for run_id, tail in tails.items():
            self._tail(run_id, *tail)
        if chosen:
            fault_point("store.claim.after_commit")
        return [claim for claim in claims if claim is not None]

    def _lanes(
        self, tx: sqlite3.Connection, queue: str, workflows: str, now: float, limit: int,
        states: dict[str, tuple[Any, ...]] | None = None, bundles: str | None = None,
    ) -> list[admission.Lane]:
        """Up to ``admission.MAX_LANES`` lanes of ``queue`` from its cursor,
        each with its best ``limit`` due runs and its running count; the row
        of every candidate goes to ``states`` (see ``_claim_state``)."""
        def next_tenant(after: str) -> str | None:
            row = tx.execute(_Q["next_tenant"], {"queue": queue, "after": after}).fetchone()
            return None if row is None else str(row[0])

        tenants = admission.lane_window(next_tenant, self._lane_cursor.after(queue))
        self._lane_cursor.saw(queue, tenants)
        lanes = []
        running: dict[str, int] | None = None
        shares: dict[str, tuple[admission.QueueShare, admission.Bucket | None]] | None = None
        for tenant in tenants:
            rows = tx.execute(_Q["lane_candidates"], {"queue": queue, "tenant": tenant, "now": now,
                                                     "workflows": workflows, "bundles": bundles,
                                                     "limit": limit}).fetchall()
            if not rows:
                continue
            if running is None:  # one statement for every lane of the queue
                running = dict(tx.execute(_Q["lane_running"], {"queue": queue}).fetchall())
                shares = {row[0]: (share_from_row((queue, *row[:5])), share_bucket_from_row(row[5], row[6]))
                          for row in tx.execute(_Q["lane_shares"], {"queue": queue})}
            candidates = [admission.Candidate(row[0], queue, tenant, row[1], row[2], row[3] == "running")
                          for row in rows]
            if states is not None:
                states.update((row[0], row) for row in rows)
            assert shares is not None
            share, bucket = shares.get(tenant, (None, None))
            lanes.append(admission.Lane(queue, tenant, running.get(tenant, 0), candidates, share, bucket))
        return lanes

    def claim_run(self, run_id: str, worker: str, lease_seconds: float, max_recoveries: int) -> Claim | None:
        tails: dict[str, tuple[int, int, float]] = {}
        with self._write() as tx:
            now = self.clock()
            row = tx.execute(_Q["select_claim_state"], {"run_id": run_id}).fetchone()
            if row is None or row[5] is None or row[5] > now:
                return None
            state = lc.ClaimState(row[0], claim_status(row[1]), row[2], row[3], row[4])
            claim = _claim_many(tx, [state], worker, now, lease_seconds, max_recoveries, tails)[0]
            fault_point("store.claim.before_commit")
        for claimed, tail in tails.items():
            self._tail(claimed, *tail)
        fault_point("store.claim.after_commit")
        return claim

    def renew_leases(self, worker: str, leases: Mapping[str, int], lease_seconds: float) -> set[str]:
        if not leases:
            return set()
        lost: set[str] = set()
        with self._write() as tx:
            now = self.clock()
            until = now + lease_seconds
            for run_id, epoch in leases.items():
                params = {"run_id": run_id, "worker": worker, "epoch": epoch, "lease_until": until,
                          "now": now}
                if tx.execute(_Q["renew_lease"], params).rowcount == 0:
                    lost.add(run_id)
        return lost

    # -- contract, dialect code: the hot append and the finish (the tail cache) ---------------

    def append(
        self, run_id: str, epoch: int, events: Sequence[HistoryEvent], *, barrier: bool = False
    ) -> None:
        if barrier and self.durability is not Durability.POWER:
            self._sync_artifacts(events)  # before the entries that reference them can be durable
            self.append(run_id, epoch, events)
            self._sync_wal()
        elif len(events) == 1 and (not (  # the per-step hot path: one statement; a payload that
                # may go to history_payloads (packed, at most 2 bytes longer) too once the run's last
                # entry is known (``_append_next``: the ``cairn_spilled`` view), else in a transaction
                spills := (p := events[0].payload) is not None and p.data is not None
                and len(p.data) + 2 > _SPILL_AT) or _follows(self._tails.get(run_id), epoch, events[0])):
            # ``_conn``, ``_writing``, ``_fenced`` and ``_tail`` written out: a
            # call costs more than each of them does
            event = events[0]
            if event.run_id != run_id or event.epoch != epoch:
                _check_fenced(run_id, epoch, event)
            if faults.ARMED:
                fault_point("store.append.before_commit")
            tails = self._tails
            tail = tails.pop(run_id, None)
            if not self._writer.acquire(False):  # the common case, without the timeout's cost
                self._writing()
            try:
                conn = self._shared or self._writer_conn()
                known = self._links.pop(run_id, None)
                previous = known[1] if known is not None and known[0] == event.seq - 1 else None
                written: tuple[float, bytes] | None
                if tail is not None and tail[0] == epoch and tail[1] == event.seq - 1:
                    written = _append_next(conn, event, tail[2], previous, self.audit_digest)
                elif spills:  # the tail went meanwhile: the payload and the entry in a transaction
                    written = None
                else:
                    written = _append_fenced(conn, run_id, epoch, event, self.audit_digest)
            except sqlite3.Error as exc:
                raise self._failure(exc) from None
            except UnicodeEncodeError as exc:
                raise lc.unstorable_text(exc) from None
            finally:
                self._writer.release()
            if written is None:
                self._in_write(lambda tx: self._append_held(tx, run_id, epoch, events),
                               faults=commit_faults("append"))
                return
            at, link = written
            if len(tails) >= _MAX_TAILS:
                tails.clear()
            tails[run_id] = (epoch, event.seq, at)
            if link:  # committed (autocommit): the next entry chains from it unread
                links = self._links
                if len(links) >= _MAX_TAILS:
                    links.clear()
                links[run_id] = (event.seq, link)
            if faults.ARMED:
                fault_point("store.append.after_commit")
        else:
            self._in_write(lambda tx: self._append_held(tx, run_id, epoch, events),
                           faults=commit_faults("append"))

    def finish_run(
        self,
        run_id: str,
        epoch: int,
        event: HistoryEvent,
        status: RunStatus,
        result: Payload | None,
        error: dict[str, Any] | None,
    ) -> None:
        lc.check_finish_status(status)
        with self._write(commit_faults("finish")) as tx:
            now = self.clock()
            params = finish_params(run_id, epoch, now, status, result, error)
            self._fenced(tx, run_id, epoch, event)
            (parent,) = tx.execute(_Q["finish"], params).fetchone()
            if parent is not None:
                tx.execute(_Q["wake_waiting_parent"], {"child_id": run_id, "now": now})

    def _fenced(
        self, conn: sqlite3.Connection, run_id: str, epoch: int, event: HistoryEvent,
        previous: bytes | None = None,
    ) -> tuple[float, bytes]:
        """Append ``event`` under the fence; return the ``at`` and link
        stored. Without a read of history when this store appended the run's
        last entry itself (``_tails``), nor of its link when known (``_links``,
        or ``previous``: the entry before, written in this transaction); both
        are forgotten meanwhile, and remembered again only once the entry is
        committed (``_in_write``)."""
        tail = self._tails.pop(run_id, None)
        known = self._links.pop(run_id, None)
        if (tail is not None and tail[0] == epoch == event.epoch and tail[1] == event.seq - 1
                and event.run_id == run_id):
            if previous is None and known is not None and known[0] == event.seq - 1:
                previous = known[1]
            return _append_next(conn, event, tail[2], previous, self.audit_digest)
        return _append_fenced(conn, run_id, epoch, event, self.audit_digest)

    def _tail(self, run_id: str, epoch: int, seq: int, at: float) -> None:
        """Remember the last entry this store appended to ``run_id`` (committed)."""
        tails = self._tails
        if len(tails) >= _MAX_TAILS and run_id not in tails:
            tails.clear()
        tails[run_id] = (epoch, seq, at)

    def _sync_wal(self) -> None:
        """The effect barrier of the ``process`` mode, after an ordinary
        commit: ``fdatasync`` the WAL file, which is exactly the sync a
        ``synchronous=FULL`` commit ends with, so that commit and every
        earlier one (of any connection: they all append to this one file)
        are on stable storage. Done from here rather than by switching the
        connection to FULL around the commit, which cost two more statements
        and an explicit transaction (about 50 µs measured) for the same
        single sync. Frames a checkpoint already moved out of the WAL are
        safe too: in NORMAL mode a checkpoint syncs the database file before
        the WAL is reused. The WAL file cannot be replaced while this store
        holds a connection (only the last connection to close deletes it),
        so a descriptor opened once per thread stays valid."""
        fd: int | None = getattr(self._local, "wal_fd", None)
        try:
            if fd is None:
                fd = os.open(f"{self.path}-wal", os.O_RDONLY)
                self._local.wal_fd = fd
                with self._lock:
                    self._wal_fds.append(fd)
            _fdatasync(fd)
        except OSError as exc:
            raise StoreError(f"cannot sync the write-ahead log of {str(self.path)!r}: {exc}") from None

    # -- primitives for sqlbase: write transactions, the hold of a holder write, creation -----

    def _in_write(
        self, work: Callable[[sqlite3.Connection], _T], *, faults: Faults = NO_FAULTS, durable: bool = False
    ) -> _T:
        # durable: nothing to do, every commit here is as durable as the store's
        # mode (the effect barrier is append's)
        local = self._local
        local.transacted = None
        with self._write(faults) as tx:  # holds the write lock: every row read is held
            result = work(tx)
        if local.transacted is not None:  # committed: the next append may follow it unread
            run_id, epoch, seq, at, link = local.transacted
            self._tail(run_id, epoch, seq, at)
            if link:  # and chain from its link unread (not pending: linked at commit)
                links = self._links
                if len(links) >= _MAX_TAILS and run_id not in links:
                    links.clear()
                links[run_id] = (seq, link)
        return result

    def _hold_lease(
        self, tx: sqlite3.Connection, run_id: str, epoch: int, hold: Hold, events: Sequence[HistoryEvent]
    ) -> None:
        # Whatever ``hold`` asks, the write lock (BEGIN IMMEDIATE) holds the run
        # until the commit: the fenced append is the fence, and without an entry
        # to append first one read of the run row is.
        if events:
            self._append_held(tx, run_id, epoch, events)
        elif tx.execute(_Q["transact_fence"], {"run_id": run_id, "epoch": epoch}).fetchone() is None:
            raise LeaseLost(run_id, epoch)

    def _append_held(
        self, tx: sqlite3.Connection, run_id: str, epoch: int, events: Sequence[HistoryEvent]
    ) -> None:
        if not events:
            return
        tails = self._tails
        link: bytes | None = None
        for event in events:
            # forgets the tail and link: remembered once committed
            at, link = self._fenced(tx, run_id, epoch, event, link or None)
            tails[run_id] = (epoch, event.seq, at)  # the next one follows it unread
        tails.pop(run_id, None)  # not committed yet: _in_write remembers it once it is
        self._local.transacted = (run_id, epoch, events[-1].seq, at, link)

    def _create_in(self, tx: sqlite3.Connection, run: NewRun, now: float) -> bool:
        if not _insert_run(tx, run_params(run, now, status=RunStatus.PENDING, runnable_at=now)):
            return False
        tx.execute(_INSERT_EVENT, _event_row(tx, lc.create(run, now)))
        return True

    def _user_tx(self, tx: sqlite3.Connection) -> transactions.Tx:
        def run(sql: str, params: transactions.Params | None) -> sqlite3.Cursor:
            return tx.execute(sql) if params is None else tx.execute(sql, params)

        return transactions.Tx(run, dialect="sqlite", paramstyle="qmark", driver_errors=(sqlite3.Error,),
                               many=lambda sql, params: int(tx.executemany(sql, params).rowcount))

    def _check_session(self, tx: sqlite3.Connection) -> None:
        # what the temporary schema holds must be what _install_wake left there
        if frozenset(tx.execute(_Q["transact_session_check"])) != getattr(tx, "temp_objects", None):
            raise TransactionMisuse(_TEMP_OBJECT)

    # -- primitives for sqlbase: rows held, statements, reads ---------------------------------

    def _held_run(self, tx: sqlite3.Connection, run_id: str) -> RunRecord | None:
        return _select_run(tx, run_id)

    def _read_run(self, tx: sqlite3.Connection, run_id: str) -> RunRecord | None:
        return _select_run(tx, run_id)

    def _held_tree(self, tx: sqlite3.Connection, run_id: str) -> list[tuple[str, int]]:
        return _live(tx, "select_live_descendants", {"run_id": run_id})

    def _held_of_tenant(self, tx: sqlite3.Connection, tenant: str) -> list[tuple[str, int]]:
        return _live(tx, "select_live_of_tenant", {"tenant": tenant})

    def _last_failed_position(self, tx: sqlite3.Connection, run_id: str) -> int | None:
        row = tx.execute(_Q["last_failed_position"], {"run_id": run_id}).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def _apply(self, tx: sqlite3.Connection, transition: lc.Transition) -> RunRecord:
        return _apply(tx, transition)

    def _query(self, tx: sqlite3.Connection, name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        return tx.execute(_Q[name], params).fetchall()

    def _changed(self, tx: sqlite3.Connection, name: str, params: Mapping[str, Any]) -> int:
        return int(tx.execute(_Q[name], params).rowcount)

    def _lg_fold_wanted(self, at: Mapping[str, Any]) -> bool:
        """Never for a writer that held the thread already: this store's writers put no
        rows of lg_writes (a put_writes goes into its checkpoint's row, stored or pending:
        lg_put_record), and rows from before stay rows, read with the record as ever; a
        writer that takes the thread folds whatever rows its parent has."""
        return False

    def _lg_drop_pending(self, tx: sqlite3.Connection, where: Mapping[str, Any]) -> None:
        tx.execute(_Q["lg_delete_pending"], where)

    def _select(self, name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        with self._read() as conn:
            return conn.execute(_Q[name], params).fetchall()

    def _in_read(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        with self._read() as conn:
            conn.execute("BEGIN")  # a read transaction: one snapshot, no write lock
            try:
                return work(conn)
            finally:
                conn.execute("COMMIT")

    def _scored_in_sql(self, params: dict[str, Any], query: bytes) -> list[Scored] | None:
        if not self.sqlite_vec:
            return None  # this Python cannot load sqlite-vec: the client scores (vectorindex)
        values = {**params, "query": query, "query_int8": quantize(query)[0]}
        k = int(params["k"])

        def scored(conn: sqlite3.Connection) -> list[Any]:  # one snapshot for both statements
            rows: list[Any] = []
            if params["filter"] is None:  # most candidates are hits: the nearest first
                rows = conn.execute(_Q["search_nearest_vectors"],
                                    {**values, "candidates": 2 * k + NEAREST_SLACK}).fetchall()
            if len(rows) < k:  # a filter, a small scope, or stale items among the nearest
                rows = conn.execute(_Q["search_vectors"], values).fetchall()
            return rows

        return [(row[0], row[1], int(row[2]), float(row[3])) for row in self._in_read(scored)]

    def _list_param(self, items: Collection[str] | Collection[int]) -> Any:
        return dumps(list(items))

    def _restore_entry(self, tx: sqlite3.Connection, params: dict[str, Any]) -> None:
        """An archived entry put back as it was: a payload beyond ``_SPILL_AT``
        goes to ``history_payloads`` again (a new link, the same bytes)."""
        payload = params["payload"]
        if payload is not None and len(payload) > _SPILL_AT:
            rowid = tx.execute(_INSERT_HISTORY_PAYLOAD, (payload,)).lastrowid
            params = {**params, "payload": LINK_TAG + str(rowid).encode()}
        tx.execute(_Q["restore_history"], params)

    def _ws_insert(self, tx: sqlite3.Connection, tenant: str, objects: Mapping[str, bytes], now: float
                   ) -> None:
        """One prepared statement for the whole batch (``executemany``)."""
        tx.executemany(_Q["ws_put_object"], [{"tenant": tenant, "oid": oid, "data": data, "now": now}
                                             for oid, data in objects.items()])

    # -- contract, dialect code: retention ----------------------------------------------------

    def prune_runs(
        self,
        older_than: float | Cutoffs,
        statuses: Collection[RunStatus] | None = None,
        limit: int = 1000,
        *,
        dry_run: bool = False,
        roots: Collection[str] | None = None,
        grace: bool = True,
        fence: Fence | None = None,
        actor: str | None = None,
        into: list[str] | None = None,
        record: bool = True,
    ) -> int:
        if dry_run:
            return len(self.prunable_runs(older_than, statuses, limit, roots=roots))
        wanted = lc.prune_statuses(statuses)
        only = None if roots is None else sorted(roots)
        lc.check_prune_limit(limit)
        with self._write() as tx:
            self.check_fence(tx, fence)
            now = self.clock()
            doomed = _select_prunable(tx, older_than, wanted, limit, only)
            if doomed:
                ids = {"run_ids": dumps(doomed)}
                if record:  # an erasure records its runs by keyed digest only (no run id kept)
                    tx.execute(_Q["record_deleted_runs"], {**ids, "now": now, "actor": actor or "prune"})
                tx.execute(_Q["queue_artifacts_of_runs"], {**ids, "now": now})
                tx.execute(_Q["delete_history_of_runs"], ids)
                tx.execute(_Q["delete_mailbox_of_runs"], ids)
                tx.execute(_Q["delete_approvals_of_runs"], ids)
                tx.execute(_Q["delete_runs"], ids)
        if into is not None:  # committed
            into.extend(doomed)
        # Only after the runs are gone for good: a crash from here on leaves
        # queued refs, never a run whose artifacts were deleted.
        # without ``grace`` (an erasure), what was stored until now goes too
        stored_before = now - ARTIFACT_GRACE_SECONDS * grace
        if not isinstance(older_than, Cutoffs):
            stored_before = min(older_than, stored_before)
        try:
            self._collect_artifacts(stored_before, lc.prune_page_size(limit))
        except OSError as exc:
            raise StoreError(f"cannot delete artifacts in {str(self.artifact_dir)!r}: {exc}") from None
        return len(doomed)

    def reclaim_space(self) -> dict[str, Any]:
        """``secure_delete`` on (the write connection's: what this store
        deletes from now on is zeroed), ``VACUUM`` (the file rewritten: no
        freed page or cell keeps a deleted row's bytes) and a ``TRUNCATE``
        checkpoint (the WAL, which holds old page images, emptied). A
        checkpoint that readers held back is retried; ``wal_truncated`` says
        if it was not."""
        with self._holding_writer(), self._read() as conn:
            conn.execute("PRAGMA secure_delete = ON")
            conn.execute("VACUUM")
            for _ in range(50):
                busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
                if not busy:
                    break
                time.sleep(0.1)
        return {"vacuumed": True, "wal_truncated": not busy}
    def prunable_runs(
        self, older_than: float | Cutoffs, statuses: Collection[RunStatus] | None = None, limit: int = 1000,
        *, roots: Collection[str] | None = None,
    ) -> list[str]:
        wanted = lc.prune_statuses(statuses)
        lc.check_prune_limit(limit)
        with self._read() as conn:
            return _select_prunable(conn, older_than, wanted, limit, None if roots is None else sorted(roots))

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
                    tx.execute(_Q["dequeue_artifacts"], {"refs": dumps(done)})
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

    # -- contract, dialect code: artifacts ----------------------------------------------------

    def put_artifact(self, data: bytes) -> str:
        if self.read_only:
            raise StoreError(f"SQLite database {str(self.path)!r} is open read-only (for inspection)")
        try:
            return self._put_artifact(data)
        except OSError as exc:  # the artifact files are the store's too: no OSError escapes
            raise StoreError(f"cannot store an artifact in {str(self.artifact_dir)!r}: {exc}") from None

    def _put_artifact(self, data: bytes) -> str:
        ref = hashlib.sha256(data).hexdigest()
        target = self.artifact_dir / ref[:2] / ref
        # The file's modification time is when it was last stored, in the
        # store's clock: pruning spares what was stored since its cutoff.
        now = self.clock()
        with self._artifact_lock(exclusive=False):
            if _intact(target, ref) and _touch(target, now):
                return ref  # an existing file is trusted only once its bytes are checked
            self._write_artifact(ref, target, data, now)
        return ref

    def _write_artifact(self, ref: str, target: Path, data: bytes, now: float) -> None:
        """Queue ``ref`` for collection, then write its file (atomically, by rename)."""
        with self._write() as tx:  # queued first: a crash after it leaves no untracked file
            tx.execute(_Q["queue_artifact"], {"ref": ref, "now": now})
        _replace_file(target, data, (now, now), self.durability is Durability.POWER)

    def put_artifact_at(self, ref: str, data: bytes) -> None:
        lc.check_artifact_name(ref)
        if self.read_only:
            raise StoreError(f"SQLite database {str(self.path)!r} is open read-only (for inspection)")
        target = self.artifact_dir / ref[:2] / ref
        now = self.clock()
        try:
            with self._artifact_lock(exclusive=False):
                if _touch(target, now):
                    return  # stored already: kept as it is (its bytes are the sealed store's to check)
                self._write_artifact(ref, target, data, now)
        except OSError as exc:
            raise StoreError(f"cannot store an artifact in {str(self.artifact_dir)!r}: {exc}") from None

    def replace_artifact(self, ref: str, old: bytes, new: bytes) -> bool:
        lc.check_artifact_name(ref)
        if self.read_only:
            raise StoreError(f"SQLite database {str(self.path)!r} is open read-only (for inspection)")
        target = self.artifact_dir / ref[:2] / ref
        try:
            # Exclusive: no put refreshes it and no collection deletes it between the compare and the set.
            with self._artifact_lock(exclusive=True):
                try:
                    if target.read_bytes() != old:
                        return False
                    stored = os.stat(target)
                except FileNotFoundError:
                    return False  # collected meanwhile: nothing to move
                # its time kept: re-encrypting is not storing (pruning's grace is not extended)
                _replace_file(target, new, (stored.st_atime, stored.st_mtime),
                              self.durability is Durability.POWER)
        except OSError as exc:
            raise StoreError(f"cannot rewrite artifact {ref} in {str(self.artifact_dir)!r}: {exc}") from None
        return True

    def get_artifact(self, ref: str) -> bytes:
        data = self.read_artifact(ref)
        # The name is the content's hash: bytes that do not match it were
        # edited or damaged, and must never be replayed as the value stored.
        lc.check_artifact(ref, data, str(self.artifact_dir))
        return data

    def read_artifact(self, ref: str) -> bytes:
        lc.check_artifact_name(ref)
        try:
            return (self.artifact_dir / ref[:2] / ref).read_bytes()
        except FileNotFoundError:
            raise PayloadError(f"artifact {ref} is missing from {self.artifact_dir}") from None
        except OSError as exc:
            raise StoreError(f"cannot read artifact {ref} from {str(self.artifact_dir)!r}: {exc}") from None

    def _sync_artifacts(self, events: Sequence[HistoryEvent]) -> None:
        """Put the artifact files ``events`` reference (and their directory
        entries) on stable storage: the effect barrier covers what the
        entries behind it point to, an intent's offloaded arguments first of
        all (in the ``power`` mode ``put_artifact`` did it already)."""
        for event in events:
            ref = event.payload.ref if event.payload is not None else None
            if ref is None:
                continue
            target = self.artifact_dir / ref[:2] / ref
            try:
                _fsync_path(target, os.O_RDONLY)
                _fsync_path(target.parent, os.O_RDONLY)
            except OSError as exc:
                raise StoreError(f"cannot sync artifact {ref} in {str(self.artifact_dir)!r}: {exc}") from None


# -- helpers: each runs inside the caller's transaction ---------------------------


def _reason(exc: BaseException) -> str:
    """What went wrong, without the wrapper's own prefix."""
    text = str(exc)
    return text.split("): ", 1)[1] if text.startswith("SQLite error (") and "): " in text else text


def _intact(path: Path, ref: str) -> bool:
    """Whether the file at ``path`` exists and holds the bytes named ``ref``."""
    try:
        with open(path, "rb") as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest() == ref
    except FileNotFoundError:
        return False


def _replace_file(target: Path, data: bytes, times: tuple[float, float], power: bool) -> None:
    """Write ``data`` as ``target`` through a temporary file renamed over it
    (a reader sees the old bytes or the new, never part of them), with
    ``times``; synced with its directory entry if ``power``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if power:
                fh.flush()
                os.fsync(fh.fileno())
        os.utime(tmp, times)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if power:
        _fsync_path(target.parent, os.O_RDONLY)


def _fsync_path(path: Path, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    conn: sqlite3.Connection, older_than: float | Cutoffs, statuses: Collection[RunStatus], limit: int,
    roots: list[str] | None = None,
) -> list[str]:
    """The runs ``prune_runs`` deletes now (see ``lifecycle.select_prunable``;
    ``roots``: only the trees of these roots)."""
    params: dict[str, Any] = {"statuses": dumps(sorted(s.value for s in statuses)),
                              "cutoff": lc.prune_cutoff(older_than),
                              "roots": None if roots is None else dumps(roots)}

    def roots_after(at: float | None, run_id: str, page: int) -> list[tuple[str, float]]:
        query = {**params, "after_at": at, "after_id": run_id, "page": page}
        return [(row[0], row[1]) for row in conn.execute(_Q["select_prune_roots"], query)]

    def trees_of(roots: Sequence[str]) -> dict[str, list[lc.TreeRow]]:
        trees: dict[str, list[lc.TreeRow]] = {}
        for root, *member in conn.execute(_Q["select_trees"], {"roots": dumps(roots)}):
            trees.setdefault(root, []).append(tuple(member))
        return trees

    return lc.select_prunable(roots_after, trees_of, statuses, older_than, limit)[1]

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


def _insert_run(tx: sqlite3.Connection, params: Mapping[str, Any]) -> bool:
    return bool(tx.execute(_Q["insert_run"], params).rowcount == 1)


def _select_run(conn: sqlite3.Connection, run_id: str) -> RunRecord | None:
    row = conn.execute(_Q["select_run"], {"run_id": run_id}).fetchone()
    return run_from_row(row) if row else None


def _live(tx: sqlite3.Connection, query: str, params: dict[str, Any]) -> list[tuple[str, int]]:
    """``(run_id, epoch)`` of the live runs ``query`` selects."""
    return [(row[0], row[1]) for row in tx.execute(_Q[query], {**params, "terminal": _TERMINAL_JSON})]


#: A packed history payload (``rows.pack_payload``) longer than this goes to
#: ``history_payloads`` (migration 0014), its row keeping a link: a history
#: row keeps about 1 KB in its page (a ``WITHOUT ROWID`` B-tree's limit on
#: 4 KB pages, less the entry's other columns); a larger one took an
#: overflow page of its own.
_SPILL_AT = 640


def _event_row(tx: sqlite3.Connection, event: HistoryEvent) -> tuple[Any, ...]:
    """``event_values(event)``, a payload too large for its row moved to
    ``history_payloads`` (its link in its place). ``tx`` must be in a
    transaction for such a payload (``append`` sees to it), so that the
    payload and the entry are written, or rolled back, together."""
    values = event_values(event)
    if values[12] is None or len(values[12]) <= _SPILL_AT:
        return values
    return _spilled(tx, values)


def _spilled(tx: sqlite3.Connection, values: tuple[Any, ...]) -> tuple[Any, ...]:
    """``values`` with their payload written to ``history_payloads``, a link in its place."""
    rowid = tx.execute(_INSERT_HISTORY_PAYLOAD, (values[12],)).lastrowid
    return (*values[:12], LINK_TAG + str(rowid).encode(), *values[13:])


def _append_auto(tx: sqlite3.Connection, entries: Sequence[HistoryEvent]) -> None:
    """Append ``entries`` (``seq`` 0) after the run's current last entry:
    for writers that hold the write lock and bump the epoch."""
    for entry in entries:
        seq = int(tx.execute(_Q["max_seq"], {"run_id": entry.run_id}).fetchone()[0]) + 1
        values = _event_row(tx, entry)
        if tx.execute(_INSERT_EVENT, (values[0], seq, *values[2:])).rowcount != 1:
            raise StoreError(f"run {entry.run_id!r} vanished while its history was being written")


def _apply(tx: sqlite3.Connection, transition: lc.Transition) -> RunRecord:
    """Apply a lifecycle transition; return the run as it is after it."""
    update = transition.update
    row = tx.execute(_Q[update.statement], update_params(update)).fetchone()
    assert row is not None, f"{update.statement} found no run {update.run_id!r}"
    _append_auto(tx, transition.entries)
    if transition.wakes_parent:
        tx.execute(_Q["wake_waiting_parent"], {"child_id": update.run_id, "now": update.at})
    return run_from_row(row)


def _check_fenced(run_id: str, epoch: int, event: HistoryEvent) -> None:
    if event.run_id != run_id:
        raise ValueError(f"event for run {event.run_id!r} appended to run {run_id!r}")
    if event.epoch != epoch:  # the statement fences on the entry's epoch: it must be the caller's
        raise LeaseLost(run_id, epoch)


def _append_fenced(
    tx: sqlite3.Connection, run_id: str, epoch: int, event: HistoryEvent, digester: Digester | None
) -> tuple[float, bytes]:
    """Append ``event`` under the fence; return the ``at`` stored (clamped
    to the run's last entry's) and its audit link. Reading every row returned
    ends the statement, which commits it outside a transaction. The entry
    before it is read first for its link (and time: the statement's clamp
    then changes nothing); entries never change once written, and the
    statement refuses this one unless that entry is still the last."""
    _check_fenced(run_id, epoch, event)
    try:
        values = event_values(event)
        before = tx.execute(_AUDIT_PREVIOUS, (run_id, event.seq - 1)).fetchone()
        previous: bytes | None = auditlinks.GENESIS
        if before is not None:
            previous = auditlinks.previous_of(before[1])
            if values[3] < before[0]:
                values = (*values[:3], before[0], *values[4:])
        link = _audited(values, event, previous, digester)
        if values[12] is not None and len(values[12]) > _SPILL_AT:
            values = _spilled(tx, values)
        rows = tx.execute(_INSERT_EVENT_FENCED, values + link).fetchall()
    except sqlite3.IntegrityError:
        raise LeaseLost(run_id, epoch) from None  # seq taken: someone else appended
    if len(rows) != 1:
        raise LeaseLost(run_id, epoch)
    return float(rows[0][0]), link[1]


def _follows(tail: tuple[int, int, float] | None, epoch: int, event: HistoryEvent) -> bool:
    """Whether ``event`` is the entry right after ``tail``, the run's last
    one this store appended itself under ``epoch`` (``_append_next``)."""
    return tail is not None and tail[0] == epoch and tail[1] == event.seq - 1


def _append_next(
    conn: sqlite3.Connection, event: HistoryEvent, last_at: float, previous: bytes | None,
    digester: Digester | None,
) -> tuple[float, bytes]:
    """Append ``event`` right after the run's last entry, which this store
    appended itself under the same epoch, at ``last_at``; return the
    ``at`` stored.

    The same guarantees as ``insert_event_fenced`` without its reads of
    ``history`` (a temporary copy of the rows in SQLite): the run row is
    fenced on its epoch by the statement; ``seq`` follows the last entry
    (checked by the caller) and nobody else took it (the primary key:
    every writer appends right after the last entry, so another entry
    would be at this very ``seq``); ``at`` is clamped to the last
    entry's here, as the statement would. ``previous``: the link of the
    entry before, if known (else read: ``_previous_link``)."""
    values = event_values(event)
    at = event.at
    if at < last_at:
        at = last_at
        values = (*values[:3], at, *values[4:])
    if previous is None:
        previous = _previous_link(conn, event)
    link = _audited(values, event, previous, digester)
    try:
        if values[12] is not None and len(values[12]) > _SPILL_AT:  # to history_payloads, in one statement
            conn.execute(_INSERT_EVENT_SPILLED, values + link)  # a fenced one: the trigger's error
            inserted = 1
        else:
            inserted = conn.execute(_INSERT_EVENT_NEXT, values + link).rowcount
    except sqlite3.IntegrityError:
        raise LeaseLost(event.run_id, event.epoch) from None  # seq taken or fenced: someone else appended
    if inserted != 1:
        raise LeaseLost(event.run_id, event.epoch)
    return at, link[1]


# -- the audit chain (store/auditlinks.py) ---------------------------------------------------

_AUDIT_PREVIOUS = _Q["audit_previous"]


def _has_audit_columns(conn: sqlite3.Connection) -> bool:
    return any(row[1] == "link" for row in conn.execute("PRAGMA table_info(history)"))


def _previous_link(conn: sqlite3.Connection, event: HistoryEvent) -> bytes | None:
    """The link ``event`` chains from, read from the entry before it
    (``None``: that one is pending, so is this one)."""
    before = conn.execute(_AUDIT_PREVIOUS, (event.run_id, event.seq - 1)).fetchone()
    return auditlinks.GENESIS if before is None else auditlinks.previous_of(before[1])


#: What the JSON text of an entry's detail holding a sealed value contains: its ``"sealed"``
#: key, or a value of sealed operator text (``auditkeys._sealed_detail``, which the digester
#: asks of every entry without a payload). A detail whose text holds neither holds nothing
#: sealed (JSON escapes none of these characters), so its digest is the plain one without a
#: call to the digester (a lifecycle entry's: a tenth of what sealing added to a 3-step run);
#: one that does is left to the digester, which looks at its values.
_SEALED_MARKS = ('"sealed"', '"' + REASON_PREFIX)


def _may_be_sealed(detail: str | None) -> bool:
    """Whether a detail's JSON text may hold a sealed value (see ``_SEALED_MARKS``)."""
    return detail is not None and (_SEALED_MARKS[0] in detail or _SEALED_MARKS[1] in detail)


def _audited(
    values: tuple[Any, ...], event: HistoryEvent, previous: bytes | None, digester: Digester | None
) -> tuple[bytes | None, bytes]:
    """``(digest, link)`` of the entry ``event`` written as ``values`` (its
    ``at`` final) after ``previous`` (``None``: pending, linked at commit).
    Without a keyring the digest is not stored (``None``): the verifier
    recomputes it from the plaintext stored beside it, and whatever removes
    that plaintext stores the digest first, by the formula of the row's link
    version (``auditlinks.plain_digest``)."""
    payload = event.payload
    if previous is not None and digester is None:  # the hot path's: one call, the link alone stored
        return None, auditlinks.written_link(previous, values, None,
                                             None if payload is None else payload.data, event.detail)
    if previous is not None and (payload is None or payload.data is None) and not _may_be_sealed(values[14]):
        # an entry holding no sealed value has its plain digest (a keyed store stores every digest)
        return auditlinks.digest_and_link(previous, values, None if payload is None else payload.data,
                                          event.detail)
    if digester is None:
        digest = auditlinks.digest(None if payload is None else payload.data, event.detail)
    else:
        digest = digester(event, None)
    if previous is None:
        return digest, auditlinks.PENDING
    return digest, auditlinks.written_link(previous, values, digest)


#: A step's entry whose payload goes to ``history_payloads``, in one statement
#: (``_append_next``): an insert into this view, whose trigger checks the
#: fence (the run row running at this epoch), writes the payload, then the
#: entry linking to it (the tenant read from the run row, as
#: ``insert_event_next`` does). One statement is atomic without a
#: transaction: a fence refused (the trigger's ``RAISE``) or a ``seq`` taken
#: (the primary key) rolls the payload back with the entry. A graph run's
#: checkpoint (1 KB appended a super-step) is such an entry at every
#: super-step; it took a transaction of four statements (``BEGIN``, the
#: payload, the entry, ``COMMIT``). Temporary, like ``_UNLINKED_TRIGGER``: a
#: connection's own, no migration. (``RAISE`` leaves ``rowcount`` at 0 for
#: a view, so the fence is the trigger's error, not a count.)
_SPILLED_VIEW = """CREATE TEMP VIEW IF NOT EXISTS cairn_spilled AS
   SELECT run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash, attempt,
          started_at, payload, payload_ref, detail, digest, link FROM main.history"""
_SPILLED_TRIGGER = """CREATE TEMP TRIGGER IF NOT EXISTS cairn_spilled_insert
   INSTEAD OF INSERT ON cairn_spilled BEGIN
     SELECT RAISE(ABORT, 'cairn: fenced') WHERE NOT EXISTS (SELECT 1 FROM runs
       WHERE run_id = NEW.run_id AND epoch = NEW.epoch AND status = 'running');
     INSERT INTO history_payloads (data) VALUES (NEW.payload);
     INSERT INTO history (run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash,
                          attempt, started_at, payload, payload_ref, detail, tenant, digest, link)
     SELECT NEW.run_id, NEW.seq, NEW.event, NEW.at, NEW.epoch, NEW.worker, NEW.position, NEW.step_kind,
            NEW.name, NEW.input_hash, NEW.attempt, NEW.started_at,
            CAST(X'0002' || last_insert_rowid() AS BLOB), NEW.payload_ref, NEW.detail, r.tenant,
            NEW.digest, NEW.link
     FROM runs AS r WHERE r.run_id = NEW.run_id;
   END"""
_INSERT_EVENT_SPILLED = """INSERT INTO cairn_spilled (run_id, seq, event, at, epoch, worker, position,
   step_kind, name, input_hash, attempt, started_at, payload, payload_ref, detail, digest, link)
   VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)"""


#: Marks a connection whose transaction wrote an entry without its link
#: (``PENDING``, the column's default: bulk claims, lifecycle transitions
#: written in SQL), so that ``_link_unlinked`` runs at the commits that need
#: it and no other (it is a query, and most commits append linked entries).
#: The database decides, not a list of writers to keep in step.
_UNLINKED_TRIGGER = """CREATE TEMP TRIGGER IF NOT EXISTS cairn_unlinked AFTER INSERT ON main.history
   FOR EACH ROW WHEN NEW.link = X'' BEGIN SELECT cairn_unlinked(); END"""


class _Connection(sqlite3.Connection):
    """A connection with its session's state: the marks its SQL functions set
    (``cairn_wake``, ``cairn_unlinked``) and what its temporary schema holds
    (``_install_wake``), which go with the connection, not the thread."""

    mark: Mark | None = None
    unlinked: _Unlinked | None = None
    temp_objects: frozenset[Any] | None = None


class _Unlinked:
    """The ``cairn_unlinked`` SQL function of one connection."""

    __slots__ = ("marked",)

    def __init__(self) -> None:
        self.marked = False

    def __call__(self) -> None:
        self.marked = True


def _link_unlinked(conn: sqlite3.Connection, digester: Digester | None) -> None:
    """Link the entries this transaction wrote without their link (bulk
    claims, lifecycle transitions), before it commits: each after the link
    before it, in ``seq`` order. Their digests are of the rows as read back
    (keyed by ``digester`` where sealed), unless the writer gave one."""
    rows = conn.execute(_Q["audit_unlinked"]).fetchall()
    if not rows:
        return
    done: dict[tuple[str, int], bytes] = {}
    for row in rows:
        run_id, seq = row[0], row[1]
        stored = done.get((run_id, seq - 1))
        previous = stored if stored is not None else auditlinks.previous_of(row[16])
        digest = row[15]
        if digest is None:
            event = event_from_row(row[:15])
            if digester is None or (  # nothing sealed in it: its plain digest, as the digester gives it
                    (event.payload is None or event.payload.data is None) and not _may_be_sealed(row[14])):
                data = None if event.payload is None else event.payload.data
                digest = auditlinks.digest(data, event.detail)
            else:
                digest = digester(event, row[17])
        assert previous is not None, f"entry {seq} of run {run_id!r} follows an entry left unlinked"
        link = auditlinks.link(previous, (*row[:12], row[13]), digest)
        done[(run_id, seq)] = link
        conn.execute(_Q["audit_set_link"], (run_id, seq, digest, link))


def _claim_many(
    tx: sqlite3.Connection,
    states: Sequence[lc.ClaimState],
    worker: str,
    now: float,
    lease_seconds: float,
    max_recoveries: int,
    tails: dict[str, tuple[int, int, float]],
) -> list[Claim | None]:
    """``_claim_batch`` of ``states``, but a run whose id cannot go through
    the batch's JSON (``runids.unclaimable``: a NUL, where SQLite's JSON
    ends the text) is set aside first, quarantined as damaged (``None`` in
    its place): it would fail the batch, every poll, for every tenant."""
    aside: dict[str, str] = {}
    for state in states:
        damage = unclaimable(state.run_id)
        if damage is not None:
            _apply(tx, lc.quarantine_damaged(state.run_id, state.epoch, state.recoveries, damage, now))
            aside[state.run_id] = damage
    if not aside:
        return _claim_batch(tx, states, worker, now, lease_seconds, max_recoveries, tails)
    batch = iter(_claim_batch(tx, [s for s in states if s.run_id not in aside], worker, now, lease_seconds,
                              max_recoveries, tails))
    return [None if state.run_id in aside else next(batch) for state in states]


def _claim_batch(
    tx: sqlite3.Connection,
    states: Sequence[lc.ClaimState],
    worker: str,
    now: float,
    lease_seconds: float,
    max_recoveries: int,
    tails: dict[str, tuple[int, int, float]],
) -> list[Claim | None]:
    """Claim the runs whose ``states`` were read under the write lock; a
    claim per state, in order, or ``None`` for a takeover that quarantined
    its run. Set-based: one statement reads every history, one claims every
    run, one appends every lifecycle entry (a quarantine adds one).
    ``tails`` receives the last entry of each claimed run (epoch, seq,
    stored time), for ``SQLiteStore._tails`` once committed."""
    if not states:
        return []
    rows: dict[str, list[Sequence[Any]]] = {state.run_id: [] for state in states}
    for row in tx.execute(_Q["select_histories"], {"run_ids": dumps(list(rows))}):
        rows[row[0]].append(row)
    histories: dict[str, list[HistoryEvent]] = {}
    outcomes = []
    for state in states:
        histories[state.run_id], last_seq, damage = claim_history(rows[state.run_id])
        outcome = lc.claim(state, last_seq, worker, now, lease_seconds, max_recoveries, damage)
        if outcome.quarantine is not None:
            tx.execute(_Q["quarantine"], update_params(outcome.quarantine)).fetchall()
        outcomes.append(outcome)
    claiming = [[o.run_id, o.recoveries] for o in outcomes if o.claimed]
    records: dict[str, RunRecord | str] = {}
    if claiming:
        params = {"claims": dumps(claiming), "worker": worker, "lease_until": now + lease_seconds, "now": now}
        records = {row[0]: claimed_run(row) for row in tx.execute(_Q["claim_many"], params)}
    entries = [[e.run_id, e.seq, e.event.value, e.at, e.epoch, e.worker,
                dumps(e.detail) if e.detail is not None else None] for o in outcomes for e in o.entries]
    stored: dict[str, tuple[int, float]] = {}
    if entries:
        for run_id, seq, at in tx.execute(_Q["insert_events_many"], {"entries": dumps(entries)}).fetchall():
            if seq > stored.get(run_id, (0, 0.0))[0]:
                stored[run_id] = (seq, at)
    claims: list[Claim | None] = []
    for outcome in outcomes:
        record = records.get(outcome.run_id)
        if isinstance(record, str):  # its own row is damaged: quarantined, not executed
            _apply(tx, lc.quarantine_damaged(outcome.run_id, outcome.epoch, outcome.recoveries, record, now))
            claims.append(None)
            continue
        if not outcome.claimed:
            claims.append(None)
            continue
        assert record is not None
        full = histories[outcome.run_id] + list(outcome.entries)
        claims.append(Claim(run=record, history=full, next_seq=full[-1].seq + 1))
        if outcome.run_id in stored:
            tails[outcome.run_id] = (record.epoch, *stored[outcome.run_id])
    return claims


def _claim_state(row: Sequence[Any]) -> lc.ClaimState:
    """The claim state in a ``lane_candidates`` row."""
    return lc.ClaimState(row[0], claim_status(row[3]), row[4], row[5], row[6])


def _queues_with_lanes(tx: sqlite3.Connection) -> list[str]:
    """Every queue with a run that has a runnable_at, one index seek each."""
    queues: list[str] = []
    after = ""
    while (row := tx.execute(_Q["next_queue"], {"after": after}).fetchone()) is not None:
        queues.append(after := row[0])
    return queues


def throwaway_store(durability: Durability = Durability.PROCESS) -> SQLiteStore:
    """A SQLite store in a private temporary directory, removed on ``close``
    (or once the store is garbage, or when the process exits): what
    ``memory://`` opens. Nothing in it survives the process, as the URL
    promises; everything else is the real SQLite store, so there is no
    second implementation of the contract to keep in step."""
    folder = tempfile.mkdtemp(prefix="cairn-memory-")
    try:
        store = _ThrowawayStore(Path(folder) / "cairn.db", durability=durability)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    store._cleanup = weakref.finalize(store, shutil.rmtree, folder, True)
    return store


class _ThrowawayStore(SQLiteStore):
    _cleanup: Callable[[], Any] | None = None

    def close(self) -> None:
        super().close()
        if self._cleanup is not None:
            self._cleanup()
