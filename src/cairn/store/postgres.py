"""The server backend: PostgreSQL, shared by workers on any number of machines.

It implements the same contract as the SQLite backend (``contract.Store``)
and mirrors its observable behaviour: the same history entries, details,
epochs, runnable rules and error dicts. What differs is how the rules are
made safe when writers no longer queue on one file lock.

Why these choices:

* **A dialect.** The rules are ``lifecycle``'s (the run state machine as
  pure functions) and ``admission``'s (claims); the operator transitions,
  the holder writes, the reads of runs and histories and the queue settings
  are written once in ``sqlbase.SQLStore`` over this module's primitives
  (hold rows ``FOR UPDATE``, lock then append, apply a transition, read one
  snapshot); rows map through ``rows``. What
  is here is how PostgreSQL holds rows and how the hot paths (one-statement
  append, pipelined finish, set-based claim) are made cheap. Every psycopg
  error leaves as ``StoreError`` (``_conn``, the only way to a connection).
  ``_conn`` hands out the pooled connection used last first (``pgrecent``):
  a thread working alone stays on one backend and its prepared statements.
* **Row locks, not a global write lock.** Transactions run at READ COMMITTED
  (a read of several statements, ``_in_read``, at REPEATABLE READ: one snapshot).
  Every writer that bumps a run's epoch (claims, takeovers, cancels, kills,
  operator actions, halts) first locks the run row ``FOR UPDATE``. A fenced
  append checks the epoch and takes ``FOR SHARE`` on the same row in the same
  statement, so an append and an epoch bump are serialised: the append either
  commits first (and the bump appends after it) or sees the new epoch and is
  refused. A second writer of the same ``seq`` hits the history primary key.
  Either way the loser gets ``LeaseLost`` and nothing it wrote survives.
* **Claims use ``FOR UPDATE SKIP LOCKED``**: concurrent claimers pass over
  each other's rows instead of queueing on them, and the lock re-checks the
  row's newest version, so no run is ever handed to two callers.
* **Fencing, argued.** Every writer that changes a run's epoch holds the run
  row ``FOR UPDATE`` from before it reads the epoch until it commits, and
  appends its own entry after the history's current maximum in that same
  transaction: claims and takeovers (``select_lanes`` / ``select_claim_state``,
  quarantine included), ``cancel_run`` and ``kill_runs`` (``lock_run``,
  ``lock_runs``, ``select_live_of_tenant``), ``retry_run``, ``revive_run``
  and ``resolve_operation`` (``lock_run``), and ``halt_run`` (``lock_fenced``).
  A holder's write at epoch ``e`` takes a lock on the same row that conflicts
  with ``FOR UPDATE`` (``FOR SHARE`` in the one-statement append,
  ``FOR UPDATE`` in ``lock_fenced``), and under READ COMMITTED a row lock
  re-reads the newest committed version and re-checks ``epoch = e AND status
  = 'running'``. So either the holder's lock is granted first, and the bump
  waits for the holder's commit and then reads the history in a later
  statement and appends after the holder's entry; or the bump's lock is
  granted first, and the holder's lock waits for the bump to commit, finds
  epoch ``e + 1`` (or an ended run) and writes nothing (``LeaseLost``). In
  that second case the holder's statement may have taken its snapshot before
  the bump, so its gap check (``seq = max + 1``) can miss the bump's entry;
  but that entry holds exactly the ``seq`` the holder would write, and the
  history primary key refuses the duplicate (``LeaseLost``). Epochs only
  grow, so a fence that failed once never holds again. The append keeps
  ``FOR SHARE`` although the key alone would catch a stale append: without
  the lock a claim racing an append (it reads the history in one statement
  and inserts with explicit seqs in another) would fail on the key instead of
  waiting. The lock costs about 22 µs of a durable append's 370
  (``bench.pg_statement``: it writes the run row's lock, 416 instead of 360
  bytes of WAL per append), which is the price of takeovers and operator
  actions that wait for an append in flight instead of failing on the key.
* **Few round trips.** A single-event ``append`` (once per step) is one
  autocommit statement; batches use ``unnest`` to stay one statement.
  ``create_run`` and ``create_claimed_run`` are one statement each (atomic in
  autocommit, durable like every commit). ``finish_run`` sends
  ``lock_fenced`` and ``finish_fenced`` as one simple-query message (the
  parameters bound on the client): one round trip, and one implicit
  transaction that the server runs statement by statement, each with its own
  snapshot. The lock is a statement of its own so that ``finish_fenced``
  runs with the row already held at epoch ``e`` and with a snapshot taken
  after the lock was granted: it sees every entry committed before, and a
  parent whose suspension held this row ``FOR SHARE`` (``lock_child_status``)
  before us, so the wake-up cannot be lost. Inside ``finish_fenced`` each part
  runs only if the one before wrote (entry, then run, then parent), so a
  refused finish writes nothing; a failing statement rolls the whole message
  back.
* **No transaction waits on a frozen client for long.** A worker can be
  frozen at any instant (SIGSTOP, a stalled VM, a debugger) with row locks
  held on the server, and claims pass over locked rows (``SKIP LOCKED``):
  its runs would be stuck for as long as it is frozen. PostgreSQL 15 has no
  ``transaction_timeout``, and ``statement_timeout`` stops counting when a
  statement completes, so the bound is built from what does exist:
  ``idle_in_transaction_session_timeout`` (5 s) ends a session that keeps a
  transaction open while the server waits for its next command, and no
  transaction here is ever sent as a pipeline. (Between the commands of a
  pipeline, before its Sync, the server reports the session ``active`` and
  no timeout applies: a worker frozen there used to wedge its runs forever.)
  Transactions are either one message (``finish_run``, and LangGraph's
  writes, ``_lg_operate``: the fence checked in the server by ``lg_hold``,
  migration 0051, then every statement, as one implicit transaction: the
  server runs all of it on receipt, so a freeze holds nothing), two whole
  messages (a LangGraph put whose parent's pending writes are not the rows
  its store expects to fold: ``BEGIN``, the fence and the statements that
  need nothing read, then, once the client folded the rows that moved, the
  checkpoint with ``COMMIT``; between the two the session is idle in
  transaction, so the timeout applies) or commands sent whole and answered
  one at a time (everything else, the claim's ``BEGIN; SET LOCAL``
  included). On top, ``statement_timeout`` (30 s) bounds each statement and
  ``lock_timeout`` (10 s) each wait for a lock, so no statement waits for
  good on a peer that holds a lock. A frozen worker that wakes up finds its
  session gone (``StoreError``) and its lease fenced.
* **Durability.** Every commit uses ``synchronous_commit=on`` (or the
  server's stronger default, e.g. ``remote_apply``): it returns only once its
  WAL is flushed to disk. This holds in both modes. The ``process`` mode
  promises that a committed step survives the crash of *any* process, and
  here the database server is one: with asynchronous commits an OOM-killed
  PostgreSQL would forget the last few hundred milliseconds of recorded steps,
  and those steps would run again. (Asynchronous commit was measured at about
  half the per-append latency; it is deliberately not offered.) If the server
  runs with ``fsync=off`` no client setting helps. The effect barrier is
  therefore free here: every commit already is one.
* **Time is the server's.** Lease expiry, ``runnable_at`` and every other
  time the store writes and compares come from the store's ``clock``, which
  by default is ``DatabaseClock``: the server's ``clock_timestamp()``, read
  every few seconds and carried forward by this machine's monotonic clock. A
  worker whose wall clock is wrong (120 s ahead, or stepped by NTP) therefore
  neither takes over a lease that is live by the server's clock nor writes
  leases that are too short or too long. The clock is still a Python value
  passed into every statement (never ``now()`` in SQL), so tests inject a
  fake clock and drive leases with it. What is left to the worker's own
  clock is what the engine stamps (entry times, ``ctx.sleep`` deadlines):
  a skewed worker's timers fire early or late by its skew.
* **Schemas.** Every object lives in one schema (``cairn`` by default), set as
  each connection's ``search_path``; migrations run at open inside one
  transaction guarded by an advisory lock, so many workers starting at once
  apply each migration exactly once.
* **Prepared statements.** psycopg prepares a statement after a few uses on a
  connection. Behind PgBouncer in transaction mode this needs PgBouncer 1.21+
  with ``max_prepared_statements`` set.
* **Tenancy is a boundary bound to database roles** (migration 0006). Every
  history row carries its run's tenant, read from the run row by the INSERT
  itself. Every table is under row-level security. The owner of the tables
  (the role that migrated them) is exempt and sees every tenant: it is the
  operator. Any other role acts only for the tenants ``tenant_grants``
  grants it, a table only the owner writes; the session setting
  ``cairn.tenant`` (set by ``?tenant=`` in the URL, on every pooled
  connection) narrows that to one tenant and can never widen it: a role of
  tenant A that sets ``cairn.tenant = 'B'`` sees nothing at all, and a store
  opened that way is refused at once, naming the grant it lacks. Setting up
  a tenant's role, once, as a superuser (or a role with CREATEROLE) and the
  schema's owner::

      CREATE ROLE acme_agent LOGIN PASSWORD '...';         -- an administrator
      SELECT cairn.grant_tenant('acme_agent', 'acme');     -- the schema's owner

  ``grant_tenant`` records the grant and gives exactly the privileges a
  tenant's store needs, as the ``tenant_privileges`` table lists them
  (``revoke_tenant`` removes the grant; the privileges then reach nothing). Then ``postgresql://acme_agent@host/db?tenant=acme``.
  What such a role can do, whatever SQL it runs:

  - ``runs`` and ``history``: read, create and change only its tenants'
    rows; no DELETE (pruning is the owner's). Another tenant's run is
    exactly a missing run: ``get_run`` is ``None``, lists and claims skip
    it, its history is empty, operator actions raise ``RunNotFound`` with
    the message a missing id gets, fenced writes raise ``LeaseLost``. Run
    ids are unique across tenants, so creating a run under an id another
    tenant holds fails with "run id ... is already taken" (``lifecycle.
    id_taken``), which names no tenant.
  - ``artifacts``: content-addressed bytes stay shared (identical bytes of
    two tenants are one row; a tenant's step results are large and often
    identical, and pruning would otherwise need a copy per tenant), but a
    role reads a row only through a reference it owns: a run or history
    entry of its own tenants naming it. It cannot write the table; it stores
    bytes through ``store_artifact`` (``SECURITY DEFINER``), which hashes
    them itself, so no role can file bytes under a reference they do not
    hash to, nor rewrite stored bytes. What sharing leaves: a role that
    already holds some exact bytes can learn whether they are stored (by
    naming their hash in a row of its own); it learns nothing it did not
    have, and a reference is the SHA-256 of more than ``inline_limit``
    bytes. ``put_artifact`` sends the bytes even when they exist already,
    so its answer does not tell either.
  - ``queues``: limits are operator state: readable, never changed by a
    tenant role (it locks a queue's row while it claims, which ``FOR
    UPDATE`` allows, but an UPDATE fails the policy).
  - ``queue_buckets`` and ``queue_shares``: it reads its own tenants'
    buckets and shares and the queue-wide buckets, and writes none
    (migration 0025; a share is written by the owner, for the tenant's
    admin). It locks its own shares' rows while it claims, as for queues.
  - **Admission** (migration 0027): a run its role moves to ``running``
    (inserted so, updated to it, moved to another queue or tenant while
    running: whatever SQL did it) is admitted when the transaction commits,
    by ``admit_claim``, a deferred constraint trigger on ``runs``
    (``SECURITY DEFINER``). Under the claim's own locks (the queue's row,
    then the share's) it refuses the transaction if the queue, the tenant
    or its share would run more than their concurrency, and takes one
    token from every bucket the run is subject to (queue-wide, per tenant,
    the share's), refusing an empty one, with the row's ``updated_at``
    (the claimer's clock, capped by the server's) as the time. The store's
    claims plan under the same locks first (``admission.plan``), so they
    pass; a refusal is SQLSTATE 40001, so a claim that lost a race to the
    owner's inline start (which takes no lock) is planned again. A run that
    left ``running`` again before the commit claimed nothing. The role
    therefore cannot fake claims past a limit, nor spend another tenant's
    share of a rate but by claims admitted under it; the spending
    functions (``spend_queue_tokens``, ``spend_tenant_tokens``,
    ``spend_share_tokens``) do nothing for it (they used to charge "the
    rows this transaction moved", counted by ``xmin`` on every call, which
    repeated calls and merely touched rows inflated at will: the
    queue-wide bucket, every tenant's rate, drained). ``claim_run`` and
    ``create_claimed_run`` (``App.run``) of such a store are admitted like
    a claim, since the database cannot tell them from a fake one: on a
    full queue the run is created pending and waits for its turn.
  - ``artifact_gc`` is the owner's; ``schema_migrations`` is read-only;
    ``tenant_grants`` shows a role its own grants only.
  - ``queue_running_totals`` (``SECURITY DEFINER``) tells every role how many
    runs of a queue are running across all tenants: a queue-wide limit must
    count them. That total is the only thing of other tenants it sees.

  ``SECURITY DEFINER`` functions run with ``search_path`` fixed to the
  store's schema then ``pg_temp``. Not covered: a role can hold a queue
  row's lock (delaying claims of that queue until ``lock_timeout`` or its
  session's end; its own admission check at commit takes them in the
  order it chose, so it can also make a claim the loser of a deadlock)
  and send ``NOTIFY cairn_runnable`` (waking workers for nothing); a
  database role is still a resource to give with care. The owner (and any
  role exempt from row-level security) is the installation: its claims are
  not checked again (the triggers' ``WHEN`` is false for it, so nothing is
  queued or run for them) and its inline starts are never held back. A scoped
  store does not migrate (the owner does: ``cairn db migrate``) and does not
  prune. Trees spanning tenants are not supported under a scoped role (a
  child could not wake a parent it cannot see).
* **Pruning** (``prune_runs``) locks the chosen finished trees, checks them
  again under the locks and deletes them in one transaction, queueing the
  artifacts they referenced in ``artifact_gc``; later transactions delete
  the queued artifacts nothing references and nobody stored since the
  cutoff (``artifacts.touched_at``, refreshed by every ``put_artifact``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import selectors
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from cairn.errors import LeaseLost, MissingExtra, PayloadError, StoreError, TransactionMisuse

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg import pq, sql
    from psycopg.conninfo import conninfo_to_dict
    from psycopg.rows import TupleRow
    from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout
except ImportError as exc:
    raise MissingExtra("cairn.store.postgres", "postgres") from exc
from cairn.faults import fault_point
from cairn.store import admission, auditlinks, pgliterals, transactions
from cairn.store import lifecycle as lc
from cairn.store.auditlinks import Digester
from cairn.store.checkpointsql import (
    Closing,
    Holder,
    Stale,
    ThreadKey,
    pack_id,
    pack_id_key,
    thread_taken,
)
from cairn.store.contract import ARTIFACT_GRACE_SECONDS, Migratable, Notifier
from cairn.store.pgrecent import Recent
from cairn.store.records import (
    Claim,
    Durability,
    EventType,
    HistoryEvent,
    NewRun,
    Payload,
    RunRecord,
    RunStatus,
    UsageTotals,
)
from cairn.store.retention import Cutoffs
from cairn.store.retentionsql import Fence
from cairn.store.rows import (
    EVENT_COLUMNS,
    claim_history,
    claim_status,
    claimed_run,
    event_from_row,
    event_values,
    finish_params,
    new_record,
    pack_payload,
    share_bucket_from_row,
    share_from_row,
    update_params,
)
from cairn.store.rows import dumps as _dumps
from cairn.store.rows import queue_from_row as _queue_from_row
from cairn.store.rows import run_from_row as _run_from_row
from cairn.store.rows import run_params as _run_params
from cairn.store.sqlbase import NO_FAULTS, Faults, Hold, SQLStore, commit_faults
from cairn.store.sqlfiles import load_migrations, load_queries
from cairn.store.vectorindex import ExactScorer, Scored

_Q = load_queries("postgres")
#: lg_fold_writes refusing its transaction unless it moved exactly the rows given (the
#: writes' arrays, as lg_put_writes_many takes them; migration 0051, lg_fold_as_sent): a put
#: sent as one message with its COMMIT folds the rows it expects (``PostgresStore._lg_operate``)
#: and is sent again in two otherwise. The same statement, so it moves what the two-message
#: put moves and walks the index alike. (FULL JOIN needs "=": no column of lg_writes is NULL.)
_Q["lg_fold_as_sent"] = (
    f"WITH moved AS (\n{_Q['lg_fold_writes']}\n)\n"
    "SELECT lg_fold_as_sent(count(*)) FROM moved AS m FULL JOIN unnest(\n"
    "    %(task_ids)s::text[], %(idxs)s::bigint[], %(channels)s::text[], %(task_paths)s::text[],\n"
    "    %(kinds)s::text[], %(refs)s::bytea[]) AS e (task_id, idx, channel, task_path, kind, refs)\n"
    "  ON m.task_id = e.task_id AND m.idx = e.idx AND m.channel = e.channel\n"
    "  AND m.task_path = e.task_path AND m.kind = e.kind AND m.refs = e.refs\n"
    "WHERE m.idx IS NULL OR e.idx IS NULL")
#: how many checkpoints' expected rows of lg_writes a store remembers (``_lg_expect``)
_LG_EXPECTED = 1024
#: SQLSTATEs of migrations 0051 and 0052: ``lg_hold`` refused the writer (its DETAIL: the
#: holder's epoch), or its memory of the thread (``Stale``; its DETAIL: the collection count),
#: ``lg_fold_as_sent`` found other rows to fold than those the put sent folded
_LG_TAKEN, _LG_STALE, _LG_FOLD = "LGT01", "LGS01", "LGF01"
_TUPLES_OK = psycopg.pq.ExecStatus.TUPLES_OK
#: rows scored at a time by the client's exact vector scan (7.5 MB at 384 float32 dimensions)
_SCAN_CHUNK = 5000
_TERMINAL = list(lc.TERMINAL)
#: An entry's parameter names: ``epoch`` is the fence's, so the entry's own is ``event_epoch``.
_EVENT_KEYS = tuple("event_epoch" if column == "epoch" else column for column in EVENT_COLUMNS)

#: The hot path's append with its link computed by the client (``PostgresStore._append_one``).
_INSERT_LINKED = _Q["insert_event_linked"]
#: Runs whose last entry and link a store keeps at most (``PostgresStore._links``).
_MAX_LINKS = 4096

#: How a page of ``audit_entries`` is read: by the primary key, whatever the
#: statistics. A table filled since its last ANALYZE (a fresh one has none)
#: was read by a sequential scan that sorted the whole table for each page of
#: 2,000 (measured: 111k entries/s against 208k/s once analyzed); with both
#: off the only plan left is the walk of ``history_pkey`` from the page's key
#: (tests/audit/test_verify_plan.py pins it with EXPLAIN).
_AUDIT_BEGIN = "BEGIN READ ONLY; SET LOCAL enable_seqscan = off; SET LOCAL enable_sort = off"
#: The page in one message (its values bound by the client): the settings
#: cost no round trip of their own, the read the one it always cost.
_AUDIT_PAGE = f"{_AUDIT_BEGIN}; {_Q['audit_entries']}; COMMIT"
#: Seconds to wait for a connection: at open, and from the pool afterwards.
_CONNECT_TIMEOUT = 10
log = logging.getLogger("cairn.store.postgres")
#: How often a transaction chosen as a deadlock victim is run again. Deadlocks
#: are possible only between operator actions on run trees and the ends of
#: runs in those trees (they lock parent and child rows in opposite orders);
#: PostgreSQL detects them and aborts one side, which simply runs again.
_TX_ATTEMPTS = 5
#: How long a connection may sit idle inside a transaction before the server
#: ends it and releases its locks (see ``_configure``).
_IDLE_IN_TRANSACTION = "5s"
#: The longest any one statement may run, and wait for a lock, before the
#: server cancels it (see ``_configure``).
_STATEMENT_TIMEOUT = "30s"
_LOCK_TIMEOUT = "10s"
#: How often ``DatabaseClock`` reads the server's clock again.
_CLOCK_RESYNC_SECONDS = 10.0
#: Artifacts at least this large are looked up before they are sent: a
#: content-addressed store often already has them.
_LOOKUP_BEFORE_SEND = 64 * 1024

_T = TypeVar("_T")
_Conn = psycopg.Connection[TupleRow]


def _one_line(exc: BaseException) -> str:
    """libpq messages span lines (a hint on the second); a StoreError is one line."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _relay(
    conn: _Conn, wake: socket.socket, stop: threading.Event, schema: str, callback: Callable[[], None]
) -> None:
    """Call ``callback`` for each notification on ``conn`` (which LISTENs)
    whose payload is ``schema``, until ``stop`` is set or ``wake``'s peer is
    closed; returns then, without calling back again, even for notifications
    that came with the stop. The peer closed is a stop whether or not
    ``stop`` was set: a caller that dropped ``listen``'s stop function
    without calling it closes the peer when it is collected, and a wait that
    went on would find ``wake`` at end of file at once, again and again.

    It waits on the connection's socket and on ``wake`` together, with no
    timeout, so a stop, which closes ``wake``'s peer, ends the wait at once: a
    ``notifies`` wait cannot be interrupted from another thread, and its
    timeout made every stop wait. ``notifies(timeout=0)`` then reads what
    arrived, and what arrived while ``LISTEN`` ran (psycopg keeps those for
    the next ``notifies``); a connection the server closed reads as an error,
    which the caller retries."""
    with selectors.DefaultSelector() as selector:
        selector.register(conn.fileno(), selectors.EVENT_READ)
        selector.register(wake, selectors.EVENT_READ)
        while True:
            for note in conn.notifies(timeout=0):
                if stop.is_set():
                    return
                if note.payload == schema:
                    callback()
            if stop.is_set():
                return
            if any(key.fileobj is wake for key, _ in selector.select()):
                return


class DatabaseClock:
    """The database server's clock, as every PostgresStore's "now".

    Lease expiry and the times runs become runnable are compared across
    machines, so they must come from one clock: the server's, not each
    worker's (a worker whose clock ran 120 s ahead used to take over live
    leases at once). Reading the server for every "now" would cost a round
    trip per call, so this reads ``clock_timestamp()`` once every
    ``resync`` seconds, on a connection of its own, and in between adds this
    machine's *monotonic* clock, which a wrong or stepped wall clock does not
    move. The error is half a round trip at the last reading plus the
    monotonic clock's drift since (parts per million of ``resync``). Should
    the server be unreachable at a resync, the last offset stays in use (the
    store's own statements fail then anyway).
    """

    def __init__(self, url: str, kwargs: Mapping[str, Any], resync: float = _CLOCK_RESYNC_SECONDS) -> None:
        self._url = url
        self._kwargs = dict(kwargs)
        self._resync = resync
        self._lock = threading.Lock()
        self._conn: _Conn | None = None
        self._offset: float | None = None
        self._read_at = 0.0

    def __call__(self) -> float:
        if self._offset is None or time.monotonic() - self._read_at >= self._resync:
            with self._lock:
                if self._offset is None or time.monotonic() - self._read_at >= self._resync:
                    self._read()
        assert self._offset is not None
        return time.monotonic() + self._offset

    def _read(self) -> None:
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(self._url, **self._kwargs)
            before = time.monotonic()
            row = self._conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
            after = time.monotonic()
        except psycopg.Error as exc:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            if self._offset is None:
                raise StoreError(f"cannot read the PostgreSQL server's clock: {_one_line(exc)}") from None
            log.warning("cannot read the PostgreSQL server's clock (%s); keeping the last offset",
                        _one_line(exc))
            self._read_at = time.monotonic()
            return
        assert row is not None
        self._offset = float(row[0]) - (before + after) / 2
        self._read_at = after

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __del__(self) -> None:
        # A store dropped without close(): its pool's connections go quietly
        # with it, and so does this one.
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


#: the parameters of the LangGraph statements that name checkpoints by id (``_packed_ids``)
_KEY_IDS = ("checkpoint_id", "folded_id", "before")


#: statements prepared at their first execution on a connection, not at psycopg's sixth: the
#: one-statement LangGraph reads, whose text takes longer to parse, analyse and plan than to
#: run (issue 24, 2026-12-07 seventh session: a new pooled connection's first five history
#: pages took 15-17 ms each against 7-9 once prepared, its first get_state reads 4-7 ms against
#: ~1; prepared at once, only the first of each pays it, then custom plans until the server
#: settles on its generic one)
_PREPARED_AT_ONCE = frozenset({"lg_read_page", "lg_read_one"})


def _packed_ids(params: Mapping[str, Any]) -> Mapping[str, Any]:
    """``params`` with its checkpoint ids packed as the columns hold them
    (migrations 0049, 0050): packed here, not by ``lg_id_key`` in the
    statement, which took ~0.1 ms a statement to inline and run."""
    packed: dict[str, Any] = {k: pack_id_key(params[k]) for k in _KEY_IDS if isinstance(params.get(k), str)}
    if isinstance(params.get("parent_id"), str):
        packed["parent_id"] = pack_id(params["parent_id"])
    if "wids" in params:
        packed["wids"] = [pack_id_key(str(i)) for i in params["wids"]]
    return {**params, **packed} if packed else params


def _lg_binder(conn: _Conn) -> Callable[[str, Mapping[str, Any]], str]:
    """How a LangGraph write sent as one message binds its statements'
    parameters on the client (``_lg_operate``): ``pgliterals.bind`` (~5x less
    CPU than psycopg's ``mogrify``) where its literals mean what they say, the
    connection's ``standard_conforming_strings`` on (else a backslash in a
    string escapes the next character) and its encoding UTF8; psycopg's
    ``mogrify`` otherwise, and for any statement ``bind`` does not render
    (``pgliterals.Unrenderable``: another type, NUL in text, a name missing),
    which then raises psycopg's own error."""
    status = conn.pgconn.parameter_status
    if status(b"standard_conforming_strings") != b"on" or status(b"client_encoding") != b"UTF8":
        return psycopg.ClientCursor(conn).mogrify

    def bind(query: str, params: Mapping[str, Any]) -> str:
        try:
            return pgliterals.bind(query, params)
        except pgliterals.Unrenderable:
            return psycopg.ClientCursor(conn).mogrify(query, params)

    return bind


#: a row of lg_writes as ``lg_fold_writes`` returns it: task id, index, channel, task path, kind, refs
_LgRow = tuple[Any, ...]


def _write_arrays(rows: Sequence[_LgRow]) -> dict[str, list[Any]]:
    """``rows`` of lg_writes as the arrays ``lg_put_writes_many`` and ``lg_fold_as_sent`` take."""
    names = ("task_ids", "idxs", "channels", "task_paths", "kinds", "refs")
    return {name: [row[i] for row in rows] for i, name in enumerate(names)}


class PostgresStore(SQLStore[_Conn], Migratable, Notifier):
    """Store contract on a PostgreSQL database (see ``contract.Store``).

    ``url`` is anything libpq accepts: ``postgresql://user@host:5432/db`` or
    ``host=... dbname=...``. ``schema`` holds every table (created if missing).
    ``pool_size`` caps the connections this store opens; it starts with one and
    grows while threads use it concurrently. ``auto_migrate=False`` opens the
    store without touching the schema (for tools that only report its
    version); ``migrate()`` then brings it up to date. ``tenant`` narrows
    the store to one of the tenants its role is granted: it sets
    ``cairn.tenant`` on every connection (see the module doc; the owner of
    the tables is not confined by it). ``clock`` is for tests: by default
    "now" is the server's clock (``DatabaseClock``).
    """

    #: LangGraph checkpoint rows go in one statement per table, and are read
    #: in few statements outside a transaction (checkpointsql)
    _lg_arrays = True
    _lg_batched = True
    _lg_fold_in_put = True
    #: folded writes in the binary record (checkpointsql.FOLD_TAG_2: ~55 bytes a super-step, not ~107)
    _lg_compact_fold = True
    #: every other list version is a tail in the checkpoint's row, not a row of lg_blobs
    #: (cairn.langgraph.TAIL: a row of lg_blobs cost ~225 bytes a super-step at 3,000)
    lg_tail_every = 2
    lg_pack_metadata = True  # metadata compressed, its kind stored as '' (issue 24, 2026-12-06)


    def __init__(
        self,
        url: str,
        *,
        durability: Durability = Durability.PROCESS,
        clock: Callable[[], float] | None = None,
        schema: str = "cairn",
        pool_size: int = 10,
        auto_migrate: bool = True,
        tenant: str | None = None,
    ) -> None:
        if pool_size < 1:
            raise ValueError(f"pool_size must be at least 1, not {pool_size}")
        if not schema:
            raise ValueError("schema must be a non-empty name")
        if tenant is not None and not tenant:
            raise ValueError("tenant must be a non-empty name (or None for the owner's unscoped store)")
        self.durability = durability
        self.schema = schema
        #: the tenant this store is confined to by row-level security, if any
        self.tenant = tenant
        self._closed = False
        self._lane_cursor = admission.LaneCursor()
        #: rows of lg_writes this store inserted and no put folded yet, per (tenant, thread,
        #: namespace, checkpoint id): what a put folding that checkpoint expects (``_lg_operate``)
        self._lg_expected: OrderedDict[tuple[str, str, str, str], dict[tuple[str, int], _LgRow]] = (
            OrderedDict())
        self._lg_expected_lock = threading.Lock()
        #: opens a sealed entry's payload and detail for its digest (a ``SealedStore`` sets it)
        self.audit_digest: Digester | None = None
        #: whether history has the audit columns (migration 0031); ``None``: not looked yet
        self._audit_columns: bool | None = None
        #: run -> (epoch, seq, at, link) of the last entry the hot path appended to it, committed:
        #: the next entry's link is computed here from it (``_append_one``)
        self._links: dict[str, tuple[int, int, float, bytes | None]] = {}
        try:
            params = conninfo_to_dict(url)
        except psycopg.Error as exc:
            raise StoreError(f"malformed PostgreSQL URL: {_one_line(exc)}") from None
        self._where = _describe(params)
        self._url = url
        kwargs: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in params:
            kwargs["connect_timeout"] = _CONNECT_TIMEOUT
        if "application_name" not in params:
            kwargs["application_name"] = "cairn"
        #: what "now" is for every lease and runnable time this store writes
        #: and compares: the database server's clock unless one is injected
        self.clock: Callable[[], float] = clock if clock is not None else DatabaseClock(url, kwargs)
        try:
            with psycopg.connect(url, **kwargs) as conn:
                # The level a commit that must be durable uses: the server's
                # (or role's) own default, unless that is "off".
                row = conn.execute("SELECT current_setting('synchronous_commit')").fetchone()
                configured = str(row[0]) if row else "on"
                self._durable_level = "on" if configured == "off" else configured
                self._search_path = sql.Identifier(schema).as_string(conn)
                if auto_migrate:
                    self._migrate(conn)
        except psycopg.Error as exc:
            raise StoreError(f"cannot open PostgreSQL database {self._where}: {_one_line(exc)}") from None
        # Every commit is flushed in both modes (see the module doc): the
        # database server is a process too, and "process" promises to survive
        # the crash of any process.
        self._default_level = self._durable_level
        self._connect_kwargs = kwargs
        self._pool: ConnectionPool[_Conn] = ConnectionPool(
            url,
            kwargs=kwargs,
            min_size=1,
            max_size=pool_size,
            configure=self._configure,
            open=False,
            timeout=_CONNECT_TIMEOUT,
            name=f"cairn:{schema}",
        )
        #: the pool's connections, the one used last first (issue 24, 2026-12-07: see pgrecent)
        self._recent = Recent(self._pool, _idle)
        try:
            self._pool.open(wait=True, timeout=_CONNECT_TIMEOUT)
        except PoolTimeout:
            self.close()
            raise StoreError(
                f"cannot open PostgreSQL database {self._where}: no connection within {_CONNECT_TIMEOUT}s"
            ) from None
        try:
            #: whether row-level security passes this role by (the owner's, a superuser)
            self._exempt = self._check_role()
            #: pgvector's statements, where migration 0016 found the extension (else the client scores)
            self._pgvector_sql = self._find_pgvector()
        except BaseException:
            self.close()
            raise

    @property
    def pgvector(self) -> bool:
        """Whether hot vectors are scored by pgvector in SQL (else by the client, exactly)."""
        return self._pgvector_sql is not None

    def _check_role(self) -> bool:
        """Whether the role is exempt from row-level security; a scoped
        store whose role is not granted its tenant is refused here, with the
        fix, instead of opening onto a database where it sees nothing."""
        with self._conn() as conn:
            if conn.execute("SELECT to_regclass('tenant_grants') IS NULL").fetchone() in (None, (True,)):
                return True  # not migrated yet (cairn db): nothing to scope by
            row = conn.execute(_Q["role_scope"], {"tenant": self.tenant}).fetchone()
            user = conn.info.user
        exempt, granted = bool(row and row[0]), bool(row and row[1])
        if not exempt and not granted:
            raise StoreError(
                f"role {user!r} may not act for tenant {self.tenant!r} in schema {self.schema!r} on "
                f"{self._where} (the schema's owner grants it: SELECT {self.schema}.grant_tenant("
                f"'{user}', '{self.tenant}'))"
            )
        return exempt

    # -- connections, transactions, migrations: where psycopg errors become StoreError --------

    def _configure(self, conn: _Conn) -> None:
        """Run once per new pooled connection: one round trip sets the
        schema, the commit level and (for a tenant-scoped store) the tenant
        for the connection's whole life."""
        # idle_in_transaction_session_timeout: a client frozen mid-transaction
        # (SIGSTOP, a stalled VM, a partition) would otherwise keep its run rows
        # locked for as long as it is frozen, and claims (SKIP LOCKED) would
        # pass over those runs even after their lease expired. It fires only
        # while the server waits for the client's next command, which is why
        # no transaction here is ever sent as a pipeline (see
        # ``_one_message``). statement_timeout bounds what the server does on
        # one command, lock_timeout how long it waits for a row lock: nothing
        # a frozen or hostile peer holds can stall a statement here for good.
        # jit off: every statement here is short, and the claim's recursive
        # lane walk has estimates large enough that JIT compiling it cost
        # 30 ms per claim, a hundred times the walk itself.
        settings = (
            "SELECT set_config('search_path', %s, false), set_config('synchronous_commit', %s, false), "
            "set_config('idle_in_transaction_session_timeout', %s, false), set_config('jit', 'off', false), "
            "set_config('statement_timeout', %s, false), set_config('lock_timeout', %s, false)"
        )
        values: tuple[str, ...] = (self._search_path, self._default_level, _IDLE_IN_TRANSACTION,
                                   _STATEMENT_TIMEOUT, _LOCK_TIMEOUT)
        if self.tenant is not None:  # unset: a role that is not the owner sees all its granted tenants
            settings += ", set_config('cairn.tenant', %s, false)"
            values += (self.tenant,)
        conn.execute(settings, values)

    @contextlib.contextmanager
    def _conn(self) -> Iterator[_Conn]:
        """A pooled connection; database failures leave as one-line ``StoreError``."""
        if self._closed:
            raise StoreError("store is closed")
        try:
            with self._recent.connection() as conn:
                yield conn
        except PoolClosed:
            raise StoreError("store is closed") from None
        except PoolTimeout:
            raise StoreError(
                f"no PostgreSQL connection to {self._where} within {_CONNECT_TIMEOUT}s"
            ) from None
        except pg_errors.InsufficientPrivilege as exc:  # row-level security included
            who = "access" if self.tenant is None else f"a store scoped to tenant {self.tenant!r}"
            raise StoreError(f"PostgreSQL refused {who} ({self._where}): {_one_line(exc)}") from None
        except psycopg.Error as exc:
            if _nul_parameter(exc):  # bad input, not a database failure: never retried, nor a 503
                raise lc.nul_text() from None
            raise StoreError(f"PostgreSQL error ({self._where}): {_one_line(exc)}") from None
        except UnicodeEncodeError as exc:  # a parameter no database can hold
            raise lc.unstorable_text(exc) from None

    def _transaction(
        self, body: Callable[[_Conn], _T], *, durable: bool = False, faults: Faults = NO_FAULTS,
        begin: str = "BEGIN",
    ) -> _T:
        """Run ``body`` in one transaction, again if it was a deadlock victim.

        ``durable=True`` commits with ``synchronous_commit`` on even in the
        process mode (see the module doc for which writes need it).
        ``faults``: the transition's fault points, hit just before the
        commit and just after it. ``begin``: the statements that open the
        transaction, sent as one message (``BEGIN; SET LOCAL ...`` costs the
        round trip ``BEGIN`` costs alone).

        Every command is sent whole, followed by its Sync, and answered
        before the next is sent: whenever the server waits for this client
        inside the transaction it is idle in transaction, so a client frozen
        anywhere in ``body`` loses its session (and its locks) after
        ``idle_in_transaction_session_timeout``. (A pipeline would leave the
        server ``active`` between its commands, where no timeout of
        PostgreSQL 15 applies, and a frozen client's locks would be held for
        as long as it is frozen.)
        """
        return self._opened(lambda conn, _: body(conn), durable=durable, faults=faults, begin=begin)

    def _opened(
        self, body: Callable[[_Conn, list[list[tuple[Any, ...]]]], _T], *, durable: bool = False,
        faults: Faults = NO_FAULTS, begin: str | Callable[[_Conn], str] = "BEGIN", links: bool = True,
        commit: Callable[[_Conn, _T], str] | None = None,
        errors: Callable[[psycopg.Error], BaseException | None] | None = None,
    ) -> _T:
        """``_transaction``, its opening message ``begin`` (or what it
        returns for the connection, its parameters bound on the client) sent
        as one simple query, whole: the server runs it all on receipt, then
        waits for this client idle in transaction, as after a lone ``BEGIN``.
        ``body`` also gets the rows of each of the message's statements.
        ``links=False``: the body writes no history entry, so there is none to
        link before the commit (``_link_unlinked``: a round trip spared), and
        the COMMIT goes as a simple query (LangGraph's writes, issue 24, 2026-12-07).
        ``commit``: the closing message for the body's result, its last
        statement ``COMMIT`` (a simple query: one round trip for both).
        ``errors``: what a database error means instead (``None``: itself),
        raised once the transaction is rolled back."""
        read_only = isinstance(begin, str) and "READ ONLY" in begin
        with self._conn() as conn:
            for attempt in range(1, _TX_ATTEMPTS + 1):
                try:
                    message = begin if isinstance(begin, str) else begin(conn)
                    opening = psycopg.ClientCursor(conn)
                    opening.execute(message)
                    found: list[list[tuple[Any, ...]]] = []
                    while True:  # each statement of the message answers in turn
                        found.append(opening.fetchall() if opening.description is not None else [])
                        if not opening.nextset():
                            break
                    if durable:
                        self._commit_durably(conn)
                    result = body(conn, found)
                    if links and not read_only and self._chained(conn):
                        _link_unlinked(conn, self.audit_digest)
                    fault_point(faults[0])
                    if links and commit is None:
                        conn.execute("COMMIT")
                    else:  # a simple query: psycopg spends ~130 us of CPU on an extended one, ~55 on this
                        closing = "COMMIT" if commit is None else commit(conn, result)
                        psycopg.ClientCursor(conn).execute(closing)
                except BaseException as exc:
                    _end_transaction(conn)
                    _again_after(exc, attempt, errors)
                    continue
                fault_point(faults[1])
                return result
        raise AssertionError("unreachable")  # pragma: no cover

    def _chained(self, conn: _Conn) -> bool:
        """Whether history has the audit columns (a store opened on an
        older schema without migrating has none: nothing to link)."""
        if self._audit_columns is None:
            row = conn.execute("SELECT to_regclass('history_unlinked') IS NOT NULL").fetchone()
            self._audit_columns = bool(row and row[0])
        return self._audit_columns

    def _one_message(
        self, statements: Sequence[str], params: Mapping[str, Any], run_id: str, epoch: int,
        faults: Faults = NO_FAULTS,
    ) -> list[tuple[Any, ...] | None]:
        """Run ``statements`` as one transaction sent as one message (a
        simple query with the parameters bound here): one round trip, and
        the server runs the whole transaction on receiving it, never waiting
        for this client in the middle, so a client frozen at any instant
        holds no lock (a frozen pipeline would). Again if it was a deadlock
        victim; returns the first row of each statement. A duplicate history
        ``seq`` raises ``LeaseLost``.

        Nothing can depend on an earlier result, so every statement must
        hold its own conditions (a fence that fails writes nothing). Each
        statement takes its own snapshot (READ COMMITTED), as it would sent
        one by one. Not prepared: this costs a plan per call."""
        query = ";\n".join(statements)
        with self._conn() as conn:
            for attempt in range(1, _TX_ATTEMPTS + 1):
                try:
                    fault_point(faults[0])  # dies with nothing sent: the transaction never was
                    cur = psycopg.ClientCursor(conn)
                    # Several statements in one simple query are one implicit
                    # transaction: all of them commit, or none.
                    cur.execute(query, params)
                    rows = [cur.fetchone()]
                    while cur.nextset():
                        rows.append(cur.fetchone())
                except pg_errors.UniqueViolation:
                    raise LeaseLost(run_id, epoch) from None  # seq taken: someone else appended
                except psycopg.OperationalError as exc:
                    _again_after(exc, attempt, None)
                    continue
                fault_point(faults[1])
                return rows
        raise AssertionError("unreachable")  # pragma: no cover

    def _commit_durably(self, tx: _Conn) -> None:
        """Make the transaction in progress commit with ``synchronous_commit``
        on (a no-op where every commit already does). Any time before the
        commit will do: the setting is read when the commit record is flushed."""
        if self._default_level != self._durable_level:
            tx.execute("SELECT set_config('synchronous_commit', %s, true)", (self._durable_level,))

    def _migrate(self, conn: _Conn) -> list[int]:
        schema = sql.Identifier(self.schema)
        applied: list[int] = []
        with conn.transaction():
            # A migration may rewrite big tables and wait for another
            # migrator: no statement or lock timeout (a pooled connection has
            # them, see _configure) for this transaction.
            conn.execute("SELECT set_config('statement_timeout', '0', true), "
                         "set_config('lock_timeout', '0', true)")
            # One migrator per schema at a time, across every machine; the
            # lock is released with the transaction.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"cairn.migrate:{self.schema}",))
            # Look before creating: CREATE SCHEMA IF NOT EXISTS still demands
            # the CREATE privilege on the database.
            exists = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (self.schema,)).fetchone()
            if exists is None:
                conn.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
            conn.execute("SELECT set_config('search_path', %s, true)", (schema.as_string(conn),))
            # Only DDL when needed: a role without CREATE on the schema (a
            # tenant-scoped one) can open an up-to-date store.
            row = conn.execute("SELECT to_regclass('schema_migrations') IS NULL").fetchone()
            if row is not None and row[0]:
                conn.execute(
                    "CREATE TABLE schema_migrations ("
                    "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)"
                )
            done = {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}
            for migration in load_migrations("postgres"):
                if migration.version in done:
                    continue
                conn.execute(migration.sql.encode())  # no parameters: may hold several statements
                conn.execute(
                    "INSERT INTO schema_migrations (version, name, applied_at) VALUES (%s, %s, %s)",
                    (migration.version, migration.name, time.time()),
                )
                applied.append(migration.version)
        return applied

    def migrate(self) -> list[int]:
        """Apply the migrations this database lacks; return their versions
        (empty when it was up to date). Safe to run from many machines at once."""
        with self._conn() as conn:
            return self._migrate(conn)

    def schema_version(self) -> int:
        """The highest migration applied to this store's schema (0: none)."""
        with self._conn() as conn:
            row = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
            if row is None or not row[0]:
                return 0
            row = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()
            return int(row[0]) if row else 0

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._recent.close()
        self._pool.close()
        if isinstance(self.clock, DatabaseClock):
            self.clock.close()

    # -- wake-ups (contract.Notifier) ---------------------------------------------------------

    def listen(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` soon after any run of this schema may have become
        claimable (``LISTEN cairn_runnable``); returns a function that stops
        listening. Runs on its own thread and connection; reconnects with
        backoff, and calls ``callback`` after every (re)connection because
        notifications sent while it was away are lost. Workers keep polling
        too: a lost notification costs latency, never a stuck run.

        Stopping closes one end of a socket pair whose other end the thread
        waits on beside the connection (``_relay``), so it returns at once,
        and no call is made once it is stopped. It used to wait in ``notifies(timeout=0.5)`` and
        see the stop only at that timeout: every worker drain and app close
        on PostgreSQL paid up to half a second. That wake-up needs no
        database, so a stop while the server is down or unreachable is as
        prompt, and no pooled connection is borrowed to send a NOTIFY."""
        stop = threading.Event()
        wake, waker = socket.socketpair()

        def loop() -> None:
            backoff = 0.1
            with wake:
                while not stop.is_set():
                    try:
                        with psycopg.connect(self._url, **self._connect_kwargs) as conn:
                            conn.execute("LISTEN cairn_runnable")
                            backoff = 0.1
                            if stop.is_set():
                                return
                            callback()
                            _relay(conn, wake, stop, self.schema, callback)
                            return  # stopped (_relay returns for nothing else; a lost connection raises)
                    except psycopg.Error as exc:
                        log.warning("listening for runnable runs failed (%s); retrying", _one_line(exc))
                        stop.wait(backoff)
                        backoff = min(backoff * 2, 5.0)

        thread = threading.Thread(target=loop, name=f"cairn-listen-{self.schema}", daemon=True)
        thread.start()

        def close() -> None:
            stop.set()
            waker.close()  # its peer reads as ready (end of file): the thread's wait ends
            thread.join(timeout=5)  # a reconnection may be stuck in its connect timeout

        return close

    # -- contract, dialect code: creating runs, and a run's usage -----------------------------

    def create_run(self, run: NewRun) -> tuple[RunRecord, bool]:
        now = self.clock()
        params = _run_params(run, now, status=RunStatus.PENDING, runnable_at=now)
        params.update(_created_arrays([lc.create(run, now)], run.tenant, self.audit_digest))
        if self._insert_run(params):
            return new_record(run, now, RunStatus.PENDING, epoch=0), True
        with self._conn() as conn:
            existing = _select_run(conn, run.run_id)
        if existing is None:  # another tenant's (row-level security), or pruned meanwhile
            raise lc.id_taken(run.run_id)
        return existing, False

    def create_claimed_run(self, run: NewRun, worker: str, lease_seconds: float) -> Claim | None:
        started: float | None
        if self._exempt:
            # The owner's: one autocommit statement (atomic on its own, so one
            # round trip), and durable like every commit: it hands out epoch 1.
            # Never held back by a queue (module doc of store.admission).
            now = self.clock()
            claimed = _claimed_params(run, worker, lease_seconds, now, self.audit_digest)
            started = now if self._insert_run(claimed) else None
        else:
            started = self._transaction(lambda tx: self._start_admitted(tx, run, worker, lease_seconds))
        if started is None:
            with self._conn() as conn:
                if _select_run(conn, run.run_id) is None:  # another tenant's (row-level security)
                    raise lc.id_taken(run.run_id)
            return None
        record = new_record(run, started, RunStatus.RUNNING, epoch=1, owner=worker,
                            lease_until=started + lease_seconds)
        return Claim(run=record, history=lc.create_claimed(run, worker, started, lease_seconds), next_seq=4)

    def _start_admitted(self, tx: _Conn, run: NewRun, worker: str, lease_seconds: float) -> float | None:
        """``create_claimed_run`` for a tenant's role, in ``tx``: the time it
        started the run, or ``None`` if the id exists or its queue does not
        admit it now (then it is created pending, for ``claim_run`` or a
        worker once its queue admits it). The database cannot tell a run
        started inline from a fake claim, so it admits both alike (migration
        0027): a run started past a limit would fail at the commit."""
        now = self._admitted(tx, run.run_id, run.queue, run.tenant, run.priority, self.clock())
        if now is not None:
            return now if _insert_run(tx, _claimed_params(run, worker, lease_seconds, now, self.audit_digest),
                                      False) else None
        now = self.clock()
        pending = _run_params(run, now, status=RunStatus.PENDING, runnable_at=now)
        pending.update(_created_arrays([lc.create(run, now)], run.tenant, self.audit_digest))
        _insert_run(tx, pending, False)
        return None

    def _admitted(
        self, tx: _Conn, run_id: str, queue: str, tenant: str, priority: int, now: float
    ) -> float | None:
        """Whether the queue admits a fresh claim of one run (by id, or an
        inline start) at ``now``: the time to claim it at, or ``None``.
        Always for the owner (the installation's own runs are not held
        back); for a tenant's role by ``admission.plan``, under the locks of
        a claim and at a time read holding them, which ``admit_claim`` checks
        again at the commit with the same time (the row's ``updated_at``)."""
        if self._exempt:
            return now
        candidate = admission.Candidate(run_id, queue, tenant, priority, now, False)
        lane = admission.Lane(queue, tenant, 0, [candidate])
        limits, queue_running, buckets = _lock_limits(tx, [lane])
        now = self.clock()  # holding the locks: a wait for them is not in the past
        return now if admission.plan([lane], limits, queue_running, buckets, now, 1) else None

    def _insert_run(self, params: Mapping[str, Any]) -> bool:
        """Insert a run and its first entries; ``False`` if the id exists.
        The owner's is one autocommit statement; a tenant's role needs two
        (``create_run_row``), in one transaction."""
        if self._exempt:
            with self._conn() as conn:
                return _insert_run(conn, params, True)
        return self._transaction(lambda tx: _insert_run(tx, params, False))

    def run_usage(self, run_id: str) -> UsageTotals:
        with self._conn() as conn:
            try:
                row = conn.execute(_Q["run_usage"], {"run_id": run_id}).fetchone()
            except psycopg.DataError:  # a damaged detail (not JSON): sum the entries here instead
                conn.rollback()
                row = None
        if row is None:  # the connection is back in the pool: history takes one (pool_size may be 1)
            return _summed_usage(self.history(run_id))
        if not row[3] and (archived := self.archived_usage(run_id)) is not None:
            return archived
        return UsageTotals(int(row[0]), float(row[1]), int(row[2]), int(row[3]))

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
        params = {
            "workflows": list(workflows),
            "bundles": None if bundles is None else sorted(set(bundles)),
            "queues": sorted(set(queues)) if queues is not None else None,
            "limit": limit,
            "max_lanes": admission.MAX_LANES,
        }

        def body(tx: _Conn) -> list[Claim]:
            lanes, locked = self._select_lanes(tx, {**params, "now": self.clock()})
            if not any(lane.candidates for lane in lanes):
                return []  # an idle poll: one statement, nothing written
            # Durable only now that it bumps epochs.
            self._commit_durably(tx)
            limits, queue_running, buckets = _lock_limits(tx, lanes)
            # "Now" again, holding the queues' rows: a lease or a refill from
            # before a wait for another claimer's lock would be in the past
            # (tests/store/test_time_after_lock.py); a run due then is due now.
            now = self.clock()
            claims: list[Claim] = []
            claimed: list[admission.Candidate] = []
            # Candidates the plan leaves out stay locked until the commit, a
            # moment; other claimers pass over them meanwhile.
            chosen = admission.plan(lanes, limits, queue_running, buckets, now, limit)
            states = [locked[candidate.run_id] for candidate in chosen]
            for candidate, claim in zip(chosen, _claim_many(tx, states, worker, now, lease_seconds,
                                                            max_recoveries), strict=True):
                if claim is not None:  # None: a takeover that quarantined its run
                    claims.append(claim)
                    claimed.append(candidate)
            if self._exempt:  # a tenant's role: admit_claim charges its claims as they commit (0027)
                _spend_tokens(tx, admission.charge(limits, buckets, claimed, now), claimed, now)
                _spend_share_tokens(tx, lanes, claimed, now)
            fault_point("store.claim.before_commit")  # an idle poll returned above: not a boundary
            return claims

        # The lane walk takes about three times longer to plan than to run,
        # and its plan does not depend on the values: once psycopg has
        # prepared it on this connection, reuse one generic plan. The setting
        # travels with the BEGIN, in its round trip.
        claims = self._transaction(body, begin="BEGIN; SET LOCAL plan_cache_mode = force_generic_plan")
        if claims:
            fault_point("store.claim.after_commit")
        return claims

    def _select_lanes(
        self, tx: _Conn, params: Mapping[str, Any]
    ) -> tuple[list[admission.Lane], dict[str, tuple[Any, ...]]]:
        """The lanes of one claim (``select_lanes``), and the claim state
        (``run_id, status, owner, epoch, recoveries``) of each run it locked.

        Each queue's lanes start after its cursor position; a queue that ran
        out of lanes before ``MAX_LANES`` wraps around in a second statement,
        from its first lane up to that position (``admission.lane_window``,
        in the server's collation order)."""
        lanes: dict[tuple[str, str], admission.Lane] = {}
        locked: dict[str, tuple[Any, ...]] = {}
        seen: dict[str, list[str]] = {}

        def select(cursor: Mapping[str, tuple[str, str | None, int]], extra: Mapping[str, Any]) -> None:
            afters, uptos, rooms = zip(*cursor.values(), strict=True) if cursor else ((), (), ())
            rows = tx.execute(_Q["select_lanes"], {
                **params, **extra, "cursor_queues": list(cursor), "cursor_afters": list(afters),
                "cursor_uptos": list(uptos), "cursor_rooms": list(rooms),
            })
            for queue, tenant, run_id, status, priority, at, owner, epoch, recoveries, running in rows:
                lane = lanes.get((queue, tenant))
                if lane is None:
                    lane = lanes[(queue, tenant)] = admission.Lane(queue, tenant, running or 0)
                    seen.setdefault(queue, []).append(tenant)
                if run_id is not None:
                    lane.candidates.append(admission.Candidate(run_id, queue, tenant, priority, at,
                                                               status == RunStatus.RUNNING))
                    locked[run_id] = (run_id, status, owner, epoch, recoveries)

        served = params["queues"]
        positions = {q: after for q, after in self._lane_cursor.positions().items()
                     if served is None or q in served}
        select({q: (after, None, admission.MAX_LANES) for q, after in positions.items()}, {})
        wrap = {q: ("", after, admission.MAX_LANES - len(seen.get(q, ())))
                for q, after in positions.items() if len(seen.get(q, ())) < admission.MAX_LANES}
        if wrap:
            select(wrap, {"queues": sorted(wrap)})
        for queue, tenants in seen.items():
            self._lane_cursor.saw(queue, tenants)
        return list(lanes.values()), locked

    def claim_run(self, run_id: str, worker: str, lease_seconds: float, max_recoveries: int) -> Claim | None:
        def body(tx: _Conn) -> Claim | None:
            state = tx.execute(_Q["select_claim_state"], {"run_id": run_id}).fetchone()
            now = self.clock()  # read holding the run row (FOR UPDATE): a wait for it is not in the past
            if state is None or state[4] is None or state[4] > now:
                return None
            if state[0] != RunStatus.RUNNING:  # a takeover was admitted before (its run is running)
                admitted = self._admitted(tx, run_id, state[5], state[6], state[7], now)
                if admitted is None:
                    return None
                now = admitted
            self._commit_durably(tx)
            claim = _claim_many(tx, [(run_id, *state[:4])], worker, now, lease_seconds, max_recoveries)[0]
            fault_point("store.claim.before_commit")
            return claim

        claim = self._transaction(body)
        if claim is not None:
            fault_point("store.claim.after_commit")
        return claim

    def renew_leases(self, worker: str, leases: Mapping[str, int], lease_seconds: float) -> set[str]:
        if not leases:
            return set()
        now = self.clock()
        params = {
            "worker": worker,
            "run_ids": list(leases),
            "epochs": list(leases.values()),
            "lease_until": now + lease_seconds,
            "now": now,
        }
        # One autocommit statement: a heartbeat never leaves a transaction open
        # (a frozen heartbeat must not hold run rows locked); it simply runs
        # again if it was a deadlock victim.
        with self._conn() as conn:
            for attempt in range(1, _TX_ATTEMPTS + 1):
                try:
                    held = {row[0] for row in conn.execute(_Q["renew_leases"], params)}
                    break
                except psycopg.OperationalError as exc:
                    _again_after(exc, attempt, None)
        return set(leases) - held

    # -- contract, dialect code: the hot append and the pipelined finish ----------------------

    def append(
        self, run_id: str, epoch: int, events: Sequence[HistoryEvent], *, barrier: bool = False
    ) -> None:
        for event in events:
            if event.run_id != run_id:
                raise ValueError(f"event for run {event.run_id!r} appended to run {run_id!r}")
        if not events:
            return
        if any(event.seq != events[0].seq + i for i, event in enumerate(events)):
            raise LeaseLost(run_id, epoch)  # a gap or a repeat: the history would not be gap-free
        digester = self.audit_digest
        if barrier and self._default_level != self._durable_level:
            # The effect barrier in the process mode: the same statement in a
            # transaction committed with synchronous_commit on, which returns
            # once the WAL up to it (so every earlier commit too) is on disk.
            self._transaction(lambda tx: _append_fenced(tx, run_id, epoch, events, digester), durable=True,
                              faults=commit_faults("append"))
        elif len(events) > 1:  # a batch is linked before its commit (store/auditlinks.py)
            self._transaction(lambda tx: _append_fenced(tx, run_id, epoch, events, digester),
                              faults=commit_faults("append"))
        else:  # the per-step hot path: one autocommit statement
            with self._conn() as conn:
                fault_point("store.append.before_commit")
                self._append_one(conn, run_id, epoch, events[0], digester)
            fault_point("store.append.after_commit")

    def _append_one(self, conn: _Conn, run_id: str, epoch: int, event: HistoryEvent,
                    digester: Digester | None) -> None:
        """Append one entry in an autocommit statement. When this store
        appended the entry before it (``_links``: same epoch, the seq before)
        the link is computed here from that one's (``insert_event_linked``),
        and the statement stores it only if the entry before still holds that
        link and time: a stale or wrong cache is refused, never forks the
        chain. Refused (or not known), ``insert_event_fenced`` reads the entry
        before and hashes the link in the server, and says whether the fence
        or the seq failed. What was stored is remembered once committed."""
        links = self._links
        known = links.pop(run_id, None)
        if known is not None and known[0] == epoch and known[1] == event.seq - 1 and event.run_id == run_id:
            params = _linked_params(event, known[2], known[3], digester)
            params["epoch"] = epoch
            try:
                inserted = conn.execute(_INSERT_LINKED, params).rowcount
            except pg_errors.UniqueViolation:
                raise LeaseLost(run_id, epoch) from None  # seq taken: someone else appended
            if inserted == 1:
                _remember(links, run_id, (epoch, event.seq, params["at"], params["link"]))
                return
        query, params = _fenced_insert(run_id, epoch, [event], digester)
        try:
            row = conn.execute(query, params).fetchone()
        except pg_errors.UniqueViolation:
            raise LeaseLost(run_id, epoch) from None
        if row is None:
            raise LeaseLost(run_id, epoch)
        stored = row[1]
        if stored is None or bytes(stored) != auditlinks.PENDING:  # a pending link is linked later
            _remember(links, run_id, (epoch, event.seq, row[0], None if stored is None else bytes(stored)))

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
        params = finish_params(run_id, epoch, now, status, result, error)

        if event.run_id != run_id:
            raise ValueError(f"event for run {event.run_id!r} appended to run {run_id!r}")
        self._links.pop(run_id, None)  # the run ends: nothing follows its last entry
        params.update(_event_params(event, self.audit_digest))
        # lock_fenced then finish_fenced, one transaction in one message: one
        # round trip. The lock is a statement of its own so that
        # finish_fenced's snapshot is taken after it was granted (see
        # finish_fenced).
        locked, ended = self._one_message([_Q["lock_fenced"], _Q["finish_fenced"]], params,
                                          run_id, epoch, commit_faults("finish"))
        if not locked or ended is None or ended[0] != 1 or ended[1] != 1:
            raise LeaseLost(run_id, epoch)

    # -- primitives for sqlbase: write transactions, the hold of a holder write, creation -----

    def _in_write(
        self, work: Callable[[_Conn], _T], *, faults: Faults = NO_FAULTS, durable: bool = False
    ) -> _T:
        # One pooled connection, the tenant's settings on it (_configure): row-level
        # security applies to a transactional step's statements as to the store's.
        return self._transaction(work, durable=durable, faults=faults)

    def _hold_lease(
        self, tx: _Conn, run_id: str, epoch: int, hold: Hold, events: Sequence[HistoryEvent]
    ) -> None:
        # Lock, then append (see "Fencing, argued" in the module doc): the row
        # lock re-reads the newest committed run row and re-checks the fence,
        # and the append's snapshot, taken after it, sees every entry before.
        if hold is Hold.ROW:
            _lock_fenced(tx, run_id, epoch)
        elif (hold is Hold.KEY or not events) and tx.execute(
                _Q["transact_fence"], {"run_id": run_id, "epoch": epoch}).fetchone() is None:
            raise LeaseLost(run_id, epoch)
        if events:
            _append_fenced(tx, run_id, epoch, events, self.audit_digest)

    def _append_held(self, tx: _Conn, run_id: str, epoch: int, events: Sequence[HistoryEvent]) -> None:
        _append_fenced(tx, run_id, epoch, events, self.audit_digest)

    def _create_in(self, tx: _Conn, run: NewRun, now: float) -> bool:
        params = _run_params(run, now, status=RunStatus.PENDING, runnable_at=now)
        params.update(_created_arrays([lc.create(run, now)], run.tenant, self.audit_digest))
        return _insert_run(tx, params, self._exempt)

    def _user_tx(self, tx: _Conn) -> transactions.Tx:
        def many(query: str, params: Iterable[transactions.Params]) -> int:
            # one command at a time, each answered before the next is sent:
            # psycopg's executemany is a pipeline, and a client frozen inside
            # one keeps its session active (no idle-in-transaction timeout)
            # with its locks held (see _transaction)
            count = 0
            with tx.cursor() as cursor:
                for one in params:
                    cursor.execute(query, one)
                    count += max(cursor.rowcount, 0)
            return count

        def run(query: str, params: transactions.Params | None) -> psycopg.Cursor[TupleRow]:
            # binary: the extended protocol even without parameters, which
            # takes one statement only (the simple protocol would run
            # "SELECT 1; COMMIT" and commit the transaction midway)
            return tx.execute(query, params, binary=True)

        return transactions.Tx(run, dialect="postgres", paramstyle="pyformat", driver_errors=(psycopg.Error,),
                               infrastructure=_connection_lost, many=many, describe=_one_line)

    def _check_session(self, tx: _Conn) -> None:
        # One round trip: the settings _configure gave the connection set again
        # (a body's set_config(..., false) would otherwise outlive it), and
        # whether the body left a temporary relation behind.
        params = {"search_path": self._search_path, "commit": self._default_level,
                  "idle": _IDLE_IN_TRANSACTION, "statement": _STATEMENT_TIMEOUT, "lock": _LOCK_TIMEOUT,
                  "tenant": self.tenant}
        row = tx.execute(_Q["transact_session_check"], params).fetchone()
        if row is None or row[0]:
            raise TransactionMisuse("a transactional step's body created a temporary relation: it would "
                                    "outlive the transaction on the store's connection and could shadow "
                                    "Cairn's own tables")

    # -- primitives for sqlbase: rows held, statements, reads ---------------------------------

    def _held_run(self, tx: _Conn, run_id: str) -> RunRecord | None:
        return _lock_run(tx, run_id)

    def _read_run(self, tx: _Conn, run_id: str) -> RunRecord | None:
        return _select_run(tx, run_id)

    def _held_tree(self, tx: _Conn, run_id: str) -> list[tuple[str, int]]:
        return _lock_live_descendants(tx, run_id)

    def _held_of_tenant(self, tx: _Conn, tenant: str) -> list[tuple[str, int]]:
        params = {"tenant": tenant, "terminal": _TERMINAL}
        return [(row[0], row[1]) for row in tx.execute(_Q["select_live_of_tenant"], params)]

    def _last_failed_position(self, tx: _Conn, run_id: str) -> int | None:
        row = tx.execute(_Q["last_failed_position"], {"run_id": run_id}).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def _apply(self, tx: _Conn, transition: lc.Transition) -> RunRecord:
        return _apply(tx, transition)

    def _lg_operate(self, key: ThreadKey, holder: Holder,
                    opening: Sequence[tuple[str, Mapping[str, Any]]],
                    close: Callable[[_Conn, list[tuple[Any, ...]] | None], Closing],
                    fold: tuple[str, Mapping[str, Any]] | None = None,
                    before_commit: str | None = None) -> tuple[int, int]:
        # One message, COMMIT included (issue 24, 2026-12-07): the fence is checked in the server
        # (lg_hold, migration 0051: the thread's lock, its holder and hold_rule in one statement),
        # so nothing waits for this client; a super-step (put_writes, put) is 2 round trips, not 4.
        # Sent as one simple query without BEGIN, the statements are one implicit transaction,
        # each with its own snapshot (READ COMMITTED): lg_hold reads the holder after its lock
        # was granted. A statement that fails (lg_hold refusing the writer: LGT01) stops the
        # message and rolls all of it back, the COMMIT included.
        # A put folds its parent's pending writes that are rows of lg_writes (LangGraph's loop
        # often stores a node's writes before the put of their checkpoint) with a record built
        # here (checkpointsql._lg_fold): it builds it from the rows this store inserted
        # (_lg_expect), and the fold refuses the message (LGF01) unless exactly those rows moved;
        # then the put is sent again in two messages, the second built from the rows that moved.
        where: dict[str, Any] = {"tenant": key.tenant, "thread_id": key.thread_id, "ns": key.ns}
        hold = ("lg_hold", {**where, "owner": holder.owner, "epoch": holder.epoch, "lease": holder.lease,
                            "collected": holder.collected})
        expected = [] if fold is None else self._lg_expect(key, str(fold[1]["checkpoint_id"]))

        def bound(conn: _Conn, sent: Sequence[tuple[str, Mapping[str, Any]]]) -> list[str]:
            bind = _lg_binder(conn)
            return [bind(_Q[name], _packed_ids(params)) for name, params in sent]

        def refused(exc: psycopg.Error) -> BaseException | None:
            if exc.sqlstate == _LG_STALE:
                detail = exc.diag.message_detail or "0"
                return Stale(key.thread_id, None if detail == "deleted" else int(detail))
            if exc.sqlstate != _LG_TAKEN:
                return None
            return thread_taken(key.thread_id, int(exc.diag.message_detail or "0"), holder.lease)

        def whole(conn: _Conn) -> list[str]:
            sent = [hold, *opening]
            if fold is not None:
                sent.append(("lg_fold_as_sent", {**fold[1], **_write_arrays(expected)}))
            return [*bound(conn, sent), *bound(conn, close(conn, None if fold is None else expected)),
                    *self._durable_statement(conn)]

        done = self._lg_message(whole, refused, before_commit)
        if done is not None:
            held, counts = done
            for (name, params), inserted in zip(opening, counts[1:], strict=False):
                if name == "lg_put_writes_many" and inserted:  # rows, not appended to a stored checkpoint
                    self._lg_inserted(key, params)
            return held

        def run(tx: _Conn, found: list[list[tuple[Any, ...]]]) -> tuple[tuple[int, int], Closing]:
            # found: BEGIN's, lg_hold's, the opening's, the fold's rows
            closing = close(tx, found[-1])
            if before_commit is not None:
                fault_point(before_commit)  # nothing of the write is committed yet
            return (int(found[1][0][0]), int(found[1][0][1])), closing

        assert fold is not None  # only a fold refuses the one message
        # A LangGraph write touches the lg_ tables alone (no trigger of theirs writes
        # history): no entry of its transaction to link, a round trip less (links=False).
        return self._opened(run, durable=True, links=False, errors=refused,
                            begin=lambda conn: ";\n".join(["BEGIN", *bound(conn, [hold, *opening, fold])]),
                            commit=lambda conn, out: ";\n".join([*bound(conn, out[1]), "COMMIT"]))[0]

    def _lg_inserted(self, key: ThreadKey, params: Mapping[str, Any]) -> None:
        """Remember the rows ``lg_put_writes_many`` inserted (its checkpoint
        was not stored), as the statement keeps them: a regular write as
        first written, a special one (index < 0) as last written."""
        at = (key.tenant, key.thread_id, key.ns, str(params["checkpoint_id"]))
        with self._lg_expected_lock:
            rows = self._lg_expected.setdefault(at, {})
            for row in zip(params["task_ids"], params["idxs"], params["channels"], params["task_paths"],
                           params["kinds"], params["refs"], strict=True):
                if row[1] < 0 or (row[0], row[1]) not in rows:
                    rows[(row[0], row[1])] = row
            self._lg_expected.move_to_end(at)
            while len(self._lg_expected) > _LG_EXPECTED:
                self._lg_expected.popitem(last=False)

    def _lg_expect(self, key: ThreadKey, checkpoint_id: str) -> list[_LgRow]:
        """The rows of lg_writes of ``checkpoint_id`` a put folding it expects
        to move: those this store inserted (``_lg_inserted``), forgotten here
        (the put moves them, or they are read from the table). A guess: the
        fold refuses the put unless they are exactly the rows there."""
        with self._lg_expected_lock:
            rows = self._lg_expected.pop((key.tenant, key.thread_id, key.ns, checkpoint_id), {})
        return list(rows.values())

    def _durable_statement(self, conn: _Conn) -> list[str]:
        """What makes a transaction sent as one message commit durably
        (``_commit_durably``'s setting; none where every commit is)."""
        if self._default_level == self._durable_level:
            return []
        return [_lg_binder(conn)("SELECT set_config('synchronous_commit', %(level)s, true)",
                                 {"level": self._durable_level})]

    def _lg_message(self, statements: Callable[[_Conn], list[str]],
                    errors: Callable[[psycopg.Error], BaseException | None],
                    before_commit: str | None) -> tuple[tuple[int, int], list[int]] | None:
        """Send a LangGraph write as one simple query with no BEGIN, one
        implicit transaction committed when its last statement is done
        (``_lg_operate``): the epoch and collection count its first statement (``lg_hold``)
        returned and how many rows each statement changed, or ``None`` when
        its fold refused it (``_LG_FOLD``), rolled back. The fault point
        ``before_commit`` is hit before it is sent: nothing of the write is
        committed yet. Again if it was a deadlock victim."""
        with self._conn() as conn:
            message = ";\n".join(statements(conn))
            if before_commit is not None:
                fault_point(before_commit)
            for attempt in range(1, _TX_ATTEMPTS + 1):
                try:
                    cursor = psycopg.ClientCursor(conn)
                    cursor.execute(message)
                    row = cursor.fetchone()
                    counts = [cursor.rowcount]
                    while cursor.nextset():
                        counts.append(cursor.rowcount)
                except psycopg.Error as exc:
                    _end_transaction(conn)  # (a failed implicit transaction is rolled back already)
                    if exc.sqlstate == _LG_FOLD:
                        return None
                    _again_after(exc, attempt, errors)
                    continue
                assert row is not None
                return (int(row[0]), int(row[1])), counts
        raise AssertionError("unreachable")  # pragma: no cover

    def _query(self, tx: _Conn, name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        if name.startswith("lg_"):
            params = _packed_ids(params)
        cursor = tx.execute(_Q[name], params, prepare=True if name in _PREPARED_AT_ONCE else None)
        # whether the statement returned rows, from its result's status:
        # ``cursor.description`` builds a Column per column to say the same
        # (~25 us for lg_read_one's nine: issue 24, 2026-12-07)
        return cursor.fetchall() if _has_rows(cursor) else []

    def _changed(self, tx: _Conn, name: str, params: Mapping[str, Any]) -> int:
        return int(tx.execute(_Q[name], params).rowcount)

    def _audit_page(self, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        with self._conn() as conn:
            cursor = psycopg.ClientCursor(conn)
            try:
                cursor.execute(_AUDIT_PAGE, params)
                while cursor.description is None:  # BEGIN, SET LOCAL, SET LOCAL, then the page
                    if not cursor.nextset():
                        raise StoreError("the audit page statement answered no rows")
                return cursor.fetchall()
            finally:
                _end_transaction(conn)  # the COMMIT ended it, unless a statement failed

    def _select(self, name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        with self._conn() as conn:
            cursor = conn.execute(_Q[name], params)
            return cursor.fetchall() if cursor.description is not None else []

    def _in_read(self, work: Callable[[_Conn], _T]) -> _T:
        # REPEATABLE READ: one snapshot for the whole transaction (READ
        # COMMITTED would take one per statement); read-only, it never fails
        # to serialise
        return self._transaction(work, begin="BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")

    def _list_param(self, items: Collection[str] | Collection[int]) -> Any:
        return list(items)

    def _in_statements(self, work: Callable[[_Conn], _T]) -> _T:
        # a pooled connection is in autocommit: each statement its own snapshot
        with self._conn() as conn:
            return work(conn)

    def _ws_insert(self, tx: _Conn, tenant: str, objects: Mapping[str, bytes], now: float) -> None:
        self._query(tx, "ws_put_objects", {"tenant": tenant, "oids": list(objects),
                                           "datas": list(objects.values()), "now": now})

    # -- primitives for vectorindex: the pgvector path (tests/memory/test_pgvector.py) --------

    def _find_pgvector(self) -> dict[str, str] | None:
        """The pgvector statements with the extension's schema spelled out,
        or ``None`` where migration 0016 added no ``vec`` column (or this
        role may not use the extension's schema): then the client scores.
        The schema is wherever the extension was created (the store's own,
        or ``public`` where an administrator created it first); it is
        named in each statement rather than put on the ``search_path``,
        which stays the store's schema alone."""
        try:
            rows = self._select("has_pgvector", {})
        except StoreError:
            return None
        if not rows or not rows[0][1]:
            return None
        schema = sql.Identifier(str(rows[0][0]))
        with self._conn() as conn:
            quoted = schema.as_string(conn)
        return {name: _Q[name].replace("pgvector_schema.", quoted + ".")
                for name in ("search_vectors", "upsert_vector_with_pgvector")}

    def _scored_in_sql(self, params: dict[str, Any], query: bytes) -> list[Scored] | None:
        # pgvector scores the hot vectors that have its copy in SQL; the client
        # scores the rest exactly, streamed (every vector in scope without pgvector).
        # One read-only snapshot, so a vector the tiering moves meanwhile is
        # scored once, not twice or never. Custom plans: the statements'
        # optional clauses (no prefix, no filter) fold away only when the plan
        # sees the values, and a generic plan misjudged the scope's size and
        # fully sorted it on disk (measured: twice the time at 100,000 rows);
        # planning costs far less than the scan.
        with self._conn() as conn:
            try:
                conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; "
                             "SET LOCAL plan_cache_mode = force_custom_plan")
                hot: list[Scored] = []
                if self._pgvector_sql is not None:
                    import numpy as np  # where vectors are read: not at import

                    vec = _pgvector_text(np.frombuffer(query, dtype="<f4").tolist())
                    found = conn.execute(self._pgvector_sql["search_vectors"], {**params, "vec": vec})
                    hot = [(r[0], r[1], int(r[2]), float(r[3])) for r in found.fetchall()]
                name = "search_candidates" if self._pgvector_sql is None else "search_without_pgvector"
                rest = _stream_scored(conn, _Q[name], params, query)
                conn.execute("COMMIT")
            finally:
                _end_transaction(conn)
        return sorted(hot + rest, key=lambda hit: (hit[3], hit[0], hit[1]))[: params["k"]]

    def _upsert_vector(self, tx: _Conn, params: dict[str, Any]) -> None:
        if self._pgvector_sql is None:
            self._query(tx, "upsert_vector", params)
            return
        import numpy as np  # where vectors are read: not at import

        vec = _pgvector_text(np.frombuffer(params["embedding"], dtype="<f4").tolist())
        tx.execute(self._pgvector_sql["upsert_vector_with_pgvector"], {**params, "vec": vec})

    def _cool_vector(self, tx: _Conn, params: dict[str, Any]) -> None:
        name = "cool_vector" if self._pgvector_sql is None else "cool_vector_with_pgvector"
        self._query(tx, name, params)

    # -- contract, dialect code: retention ----------------------------------------------------

    def _check_archiver(self) -> None:
        if not self._exempt:
            who = "a tenant's role" if self.tenant is None else f"a store scoped to tenant {self.tenant!r}"
            raise StoreError(f"{who} cannot archive or restore runs: a tenant's history is append-only for "
                             "its role (archive as the owner)")
    def prunable_runs(
        self, older_than: float | Cutoffs, statuses: Collection[RunStatus] | None = None, limit: int = 1000,
        *, roots: Collection[str] | None = None,
    ) -> list[str]:
        wanted = lc.prune_statuses(statuses)
        lc.check_prune_limit(limit)
        with self._conn() as conn:
            only = None if roots is None else sorted(roots)
            return _select_prunable(conn, older_than, wanted, limit, only)[1]

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
        if not self._exempt:
            who = "a tenant's role" if self.tenant is None else f"a store scoped to tenant {self.tenant!r}"
            raise StoreError(f"{who} cannot prune: artifacts are shared, and only the owner role sees "
                             "every reference to them (prune as the owner)")

        def body(tx: _Conn, taken: list[str]) -> int:
            taken.clear()  # a deadlock victim's retry starts again
            self.check_fence(tx, fence)
            roots, chosen = _select_prunable(tx, older_than, wanted, limit, only)
            if not chosen:
                return 0
            # Lock the chosen runs (one order, like every multi-run lock), then
            # check their trees again under the locks: a run retried, revived
            # or changed since the read above disqualifies its tree.
            locked = {row[0] for row in tx.execute(_Q["lock_runs"], {"run_ids": chosen})}
            now = self.clock()  # read holding the runs: a wait for them is not in the past
            trees = {root: tree for root, tree in _trees(tx, roots).items()
                     if all(row[0] in locked for row in tree)}
            doomed: list[str] = []
            lc.choose_trees(roots, trees, wanted, older_than, limit, doomed)
            taken.extend(doomed)
            if doomed:
                ids = {"run_ids": doomed}
                if record:  # an erasure records its runs by keyed digest only (no run id kept)
                    tx.execute(_Q["record_deleted_runs"], {**ids, "now": now, "actor": actor or "prune"})
                tx.execute(_Q["queue_artifacts_of_runs"], {**ids, "now": now})
                tx.execute(_Q["delete_history_of_runs"], ids)
                tx.execute(_Q["delete_mailbox_of_runs"], ids)
                tx.execute(_Q["delete_approvals_of_runs"], ids)
                tx.execute(_Q["delete_runs"], ids)
            return len(doomed)

        taken: list[str] = []
        pruned = self._transaction(lambda tx: body(tx, taken))
        if into is not None:
            into.extend(taken)
        # Only after the runs are gone for good (committed): a crash from here
        # on leaves queued refs, never a run whose artifacts were deleted.
        # without ``grace`` (an erasure), what was stored until now goes too
        stored_before = self.clock() - ARTIFACT_GRACE_SECONDS * grace
        if not isinstance(older_than, Cutoffs):
            stored_before = min(older_than, stored_before)
        self._collect_artifacts(stored_before, lc.prune_page_size(limit))
        return pruned

    def reclaim_space(self) -> dict[str, Any]:
        """``VACUUM`` of the tables that hold run data: their dead rows'
        space is marked free for reuse and their index entries go. Not
        ``VACUUM FULL`` (an exclusive lock on every table): the dead bytes
        stay in the data files until overwritten, unreadable through SQL and
        absent from dumps; see docs/design.md, "Erasure"."""
        if not self._exempt:
            raise StoreError("only the owner role reclaims space (VACUUM)")
        with self._conn() as conn:
            for table in _RUN_DATA_TABLES:
                conn.execute(f"VACUUM {table}")
        return {"vacuumed": list(_RUN_DATA_TABLES)}

    def _collect_artifacts(self, stored_before: float, page: int) -> None:
        """Walk the collection queue a page per transaction: delete the
        artifacts nothing references and nobody stored since
        ``stored_before``; drop the refs referenced again or already gone."""
        after: tuple[float | None, str] = (None, "")
        while True:
            params = {"after_at": after[0], "after_ref": after[1], "page": page}
            page_of = functools.partial(_collect_page, params=params, stored_before=stored_before)
            rows = self._transaction(page_of)
            if len(rows) < page:
                return
            after = (rows[-1][1], rows[-1][0])

    # -- contract, dialect code: artifacts ----------------------------------------------------

    def put_artifact(self, data: bytes) -> str:
        """Artifacts commit like appends. Storing bytes that exist already
        refreshes ``touched_at`` (when they were last stored), which keeps
        pruning from deleting them under a writer about to reference them."""
        ref = hashlib.sha256(data).hexdigest()
        params = {"ref": ref, "now": self.clock()}
        with self._conn() as conn:
            if not self._exempt:  # a tenant's role: only through store_artifact (see the module doc)
                row = conn.execute(_Q["store_artifact"], {**params, "data": data}).fetchone()
                if row is None or row[0] != ref:
                    raise StoreError(f"the server filed an artifact under {row!r}, not {ref}")
                return ref
            if len(data) >= _LOOKUP_BEFORE_SEND and conn.execute(_Q["touch_artifact"], params).rowcount == 1:
                return ref
            conn.execute(_Q["put_artifact"], {**params, "data": data})
        return ref

    def get_artifact(self, ref: str) -> bytes:
        data = self.read_artifact(ref)
        lc.check_artifact(ref, data, f"{self._where} (schema {self.schema!r})")
        return data

    def read_artifact(self, ref: str) -> bytes:
        lc.check_artifact_name(ref)
        with self._conn() as conn:
            row = conn.execute(_Q["get_artifact"], {"ref": ref}).fetchone()
        if row is None:
            raise PayloadError(f"artifact {ref} is missing from {self._where} (schema {self.schema!r})")
        return bytes(row[0])

    def put_artifact_at(self, ref: str, data: bytes) -> None:
        """A tenant's role stores under a name only through ``store_artifact_at``
        (migration 0040), which adds a name never taken and never replaces bytes."""
        lc.check_artifact_name(ref)
        params = {"ref": ref, "now": self.clock()}
        with self._conn() as conn:
            if not self._exempt:
                conn.execute(_Q["store_artifact_at"], {**params, "data": data})
                return
            if len(data) >= _LOOKUP_BEFORE_SEND and conn.execute(_Q["touch_artifact_at"],
                                                                 params).rowcount == 1:
                return
            conn.execute(_Q["put_artifact_at"], {**params, "data": data})

    @property
    def owner_role(self) -> bool:
        """Whether this store's role passes row-level security by (the
        owner's, a superuser's): what ``cairn keys reencrypt`` and ``adopt`` need."""
        return self._exempt

    def replace_artifact(self, ref: str, old: bytes, new: bytes) -> bool:
        """The owner's only: a tenant's role that could replace bytes it can
        read (any artifact a row of its own names, a victim's ref copied into
        it included) could destroy another tenant's artifact."""
        lc.check_artifact_name(ref)
        if not self._exempt:
            raise StoreError("re-encrypting artifacts takes the database owner's role (a tenant's role "
                             "may add artifacts, never rewrite one)")
        with self._conn() as conn:
            done = conn.execute(_Q["replace_artifact"], {"ref": ref, "old": old, "new": new}).rowcount
        return bool(done == 1)


# -- helpers: each runs inside the caller's transaction (or autocommit statement) --


def _summed_usage(history: Sequence[HistoryEvent]) -> UsageTotals:
    """``run_usage`` summed from the entries (the statement's rule, for a
    history with a damaged detail, which reads as ``{"damaged": ...}`` and
    counts nothing)."""
    tokens, cost, tool_calls = 0, 0.0, 0
    for e in history:
        if e.position is None:
            continue
        if e.step_kind == "model" and e.event is EventType.STEP_COMPLETED:
            detail = e.detail or {}
            usage = detail.get("usage")
            tokens += int((usage.get("total_tokens") if isinstance(usage, dict) else 0) or 0)
            cost += float(detail.get("cost") or 0.0)
        elif e.step_kind == "tool" and e.event in (EventType.STEP_COMPLETED, EventType.STEP_FAILED,
                                                   EventType.STEP_RETRIED):
            tool_calls += 1
    return UsageTotals(tokens, cost, tool_calls, history[-1].seq if history else 0)


def _nul_parameter(exc: psycopg.Error) -> bool:
    """Whether ``exc`` is psycopg refusing, before sending, a text parameter
    that holds a NUL (PostgreSQL's text has no NUL; SQLite's has)."""
    return isinstance(exc, psycopg.DataError) and exc.sqlstate is None and "NUL" in str(exc)


def _has_rows(cursor: psycopg.Cursor[Any]) -> bool:
    """Whether the cursor's statement returned rows (``cursor.description is
    not None``, without making its columns' descriptions)."""
    res = cursor.pgresult
    return res is not None and (bool(res.nfields) or res.status == _TUPLES_OK)


def _connection_lost(exc: BaseException) -> bool:
    """Whether a failure of a user statement is the database's, not the
    statement's: the connection went (class 08, or no SQLSTATE at all) or
    the server is shutting down (class 57, but a timeout's 57014 is the
    statement's own)."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or (state.startswith("57") and state != "57014")


def _stream_scored(conn: _Conn, query_sql: str, params: Mapping[str, Any], query: bytes) -> list[Scored]:
    """The exact client search over the rows of ``query_sql``, fetched in
    the binary format (bytea's text form is hex: twice the bytes, and
    decoding it was most of the old fallback's time) and scored a chunk at
    a time, so only a chunk of rows is ever Python objects. One round trip:
    a server-side cursor's fetches measured slower at 20,000 rows."""
    scorer = ExactScorer(query, int(params["k"]))
    with conn.cursor(binary=True) as cursor:
        cursor.execute(query_sql, params)
        while chunk := cursor.fetchmany(_SCAN_CHUNK):
            scorer.add(chunk)
    return scorer.result()


def _pgvector_text(vector: Sequence[float]) -> str:
    """A vector as pgvector's text input (``[1,2,3]``)."""
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


def _rolled_back(exc: BaseException) -> bool:
    """Whether ``exc`` is of SQLSTATE class 40 (transaction rollback: a
    deadlock victim, a serialization failure such as ``admit_claim``'s
    refusal of a claim planned on a state that changed), after which the
    transaction may simply run again. psycopg 3 gives each SQLSTATE a class
    of its own that is not a subclass of ``TransactionRollback``
    (``DeadlockDetected`` is an ``OperationalError``): an ``isinstance``
    check of that class never matched them, and deadlock victims were not
    run again as this module meant."""
    return isinstance(exc, psycopg.Error) and (exc.sqlstate or "").startswith("40")


def _link_unlinked(conn: _Conn, digester: Digester | None) -> None:
    """Link the entries this transaction wrote without their link (bulk
    claims, lifecycle transitions, batches), before it commits: each after
    the link before it, in ``seq`` order; their digests of the rows as read
    back (keyed by ``digester`` where sealed). The partial index
    ``history_unlinked`` holds only this transaction's (every writer links
    its own before committing), so the look costs one index probe."""
    rows = conn.execute(_Q["audit_unlinked"]).fetchall()
    if not rows:
        return
    done: dict[tuple[str, int], bytes] = {}
    updates: dict[str, list[Any]] = {"run_ids": [], "seqs": [], "digests": [], "links": []}
    for row in rows:
        run_id, seq = row[0], int(row[1])
        previous = done.get((run_id, seq - 1)) or auditlinks.previous_of(row[16])
        assert previous is not None, f"entry {seq} of run {run_id!r} follows an entry left unlinked"
        digest = row[15]
        if digest is None:
            event = event_from_row(row[:15])
            digest = digester(event, row[17]) if digester is not None else auditlinks.digest(
                None if event.payload is None else event.payload.data, event.detail)
        link = auditlinks.link(previous, (*row[:12], row[13]), bytes(digest))
        done[(run_id, seq)] = link
        updates["run_ids"].append(run_id)
        updates["seqs"].append(seq)
        updates["digests"].append(bytes(digest))
        updates["links"].append(link)
    conn.execute(_Q["audit_set_link"], updates)  # one command: no pipeline (see the query)


def _end_transaction(conn: _Conn) -> None:
    """Roll back whatever transaction ``conn`` has open (a failed statement
    leaves it aborted); a connection that broke meanwhile is the pool's."""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        with contextlib.suppress(psycopg.Error):
            conn.execute("ROLLBACK")


def _describe(params: Mapping[str, Any]) -> str:
    """``host:port/dbname`` for messages: never the password."""
    host = params.get("host") or params.get("hostaddr") or "localhost"
    port = params.get("port") or "5432"
    return f"{host}:{port}/{params.get('dbname') or params.get('user') or ''}"


def _created_arrays(events: Sequence[HistoryEvent], tenant: str, digester: Digester | None) -> dict[str, Any]:
    """``_lifecycle_arrays`` of a new run's first entries, with their audit
    digests and links: they follow nothing, so the store computes the whole
    chain itself (no lifecycle entry has a payload)."""
    arrays = _lifecycle_arrays(events)
    previous = auditlinks.GENESIS
    digests, links = [], []
    for event in events:
        digest = digester(event, tenant) if digester is not None else auditlinks.digest(None, event.detail)
        previous = auditlinks.link(previous, (*event_values(event)[:12], None), digest)
        digests.append(digest)
        links.append(previous)
    arrays["digests"], arrays["links"] = digests, links
    return arrays


def _lifecycle_arrays(events: Sequence[HistoryEvent]) -> dict[str, Any]:
    """Column arrays for ``unnest`` of entries that carry no journal fields."""
    return {
        "seqs": [e.seq for e in events],
        "events": [e.event.value for e in events],
        "ats": [e.at for e in events],
        "epochs": [e.epoch for e in events],
        "workers": [e.worker for e in events],
        "details": [_dumps(e.detail) if e.detail is not None else None for e in events],
    }


def _insert_run(conn: _Conn, params: Mapping[str, Any], exempt: bool) -> bool:
    """Insert a run and its first history entries (``params`` of
    ``create_run``); ``False`` (nothing written) if the run id exists. An
    exempt role does it in one statement; any other in two, inside the
    caller's transaction (the history policy must see the run's row)."""
    if exempt:  # the rows counted are the history entries: none when the run exists
        return conn.execute(_Q["create_run"], params).rowcount > 0
    if conn.execute(_Q["create_run_row"], params).rowcount != 1:
        return False
    conn.execute(_Q["create_run_entries"], params)
    return True


def _claimed_params(
    run: NewRun, worker: str, lease_seconds: float, now: float, digester: Digester | None
) -> dict[str, Any]:
    """The parameters of ``create_run`` for ``run`` created already held by
    ``worker`` at ``now`` (``create_claimed_run``)."""
    until = now + lease_seconds
    params = _run_params(run, now, status=RunStatus.RUNNING, runnable_at=until, epoch=1, owner=worker,
                         lease_until=until)
    params.update(_created_arrays(lc.create_claimed(run, worker, now, lease_seconds), run.tenant, digester))
    return params


def _select_run(conn: _Conn, run_id: str) -> RunRecord | None:
    row = conn.execute(_Q["select_run"], {"run_id": run_id}).fetchone()
    return _run_from_row(row) if row else None


def _lock_run(tx: _Conn, run_id: str) -> RunRecord | None:
    """The run, locked ``FOR UPDATE`` until the transaction ends."""
    row = tx.execute(_Q["lock_run"], {"run_id": run_id}).fetchone()
    return _run_from_row(row) if row else None


def _collect_page(tx: _Conn, params: Mapping[str, Any], stored_before: float) -> list[tuple[Any, ...]]:
    """One page of ``PostgresStore._collect_artifacts``; returns the page's
    queue rows ``(ref, queued_at, referenced)``."""
    rows = tx.execute(_Q["select_gc_page"], params).fetchall()
    done = [ref for ref, _, referenced in rows if referenced]
    unreferenced = [ref for ref, _, referenced in rows if not referenced]
    if unreferenced:
        cutoff = {"refs": unreferenced, "stored_before": stored_before}
        done += [row[0] for row in tx.execute(_Q["delete_stale_artifacts"], cutoff)]
    if done:
        tx.execute(_Q["dequeue_artifacts"], {"refs": done})
    return rows


def _trees(conn: _Conn, roots: Sequence[str]) -> dict[str, list[lc.TreeRow]]:
    """Each root's tree as ``(run_id, status, updated_at, tenant, workflow)`` rows."""
    trees: dict[str, list[lc.TreeRow]] = {}
    for root, *member in conn.execute(_Q["select_trees"], {"roots": list(roots)}):
        trees.setdefault(root, []).append(tuple(member))
    return trees


#: the tables an erasure deletes from (``reclaim_space`` vacuums them)
_RUN_DATA_TABLES = ("runs", "history", "mailbox", "approvals", "artifacts", "artifact_gc", "memory_run",
                    "memory_thread_messages", "memory_items", "memory_outbox", "memory_vectors",
                    "memory_item_cold", "data_keys")


def _select_prunable(
    conn: _Conn, older_than: float | Cutoffs, statuses: Collection[RunStatus], limit: int,
    roots: list[str] | None = None,
) -> tuple[list[str], list[str]]:
    """The roots and the runs ``prune_runs`` would delete now (see
    ``lifecycle.select_prunable``; ``roots``: only the trees of these
    roots). Reads without locking."""
    params: dict[str, Any] = {"statuses": sorted(s.value for s in statuses),
                              "cutoff": lc.prune_cutoff(older_than), "roots": roots}

    def roots_after(at: float | None, run_id: str, page: int) -> list[tuple[str, float]]:
        query = {**params, "after_at": at, "after_id": run_id, "page": page}
        return [(row[0], row[1]) for row in conn.execute(_Q["select_prune_roots"], query)]

    return lc.select_prunable(roots_after, functools.partial(_trees, conn), statuses, older_than, limit)

def _lock_live_descendants(tx: _Conn, run_id: str) -> list[tuple[str, int]]:
    """Lock ``run_id`` and its non-terminal descendants; return the latter
    as ``(run_id, epoch)``, read once all of them are locked.

    A live descendant's holder may start a child between reading the tree and
    locking it, so read the tree again under the locks until it stops growing:
    once every live member is locked, none of them can start another child.
    """
    locked: set[str] = set()
    params = {"run_id": run_id, "terminal": _TERMINAL}
    while True:
        live = [(row[0], row[1]) for row in tx.execute(_Q["select_live_descendants"], params)]
        new = [rid for rid, _ in live if rid not in locked]
        if not new:
            return live
        tx.execute(_Q["lock_runs"], {"run_ids": new})
        locked.update(new)


def _event_params(event: HistoryEvent, digester: Digester | None = None) -> dict[str, Any]:
    """The parameters of an entry's insert, with its audit digest and the
    body its link hashes after the previous link (the statement reads that one)."""
    values = event_values(event)
    params = dict(zip(_EVENT_KEYS, values, strict=True))
    if digester is None:
        # not stored, as on SQLite (``sqlite._audited``): the plain digest of the plaintext stored
        # beside it, which the verifier recomputes and the link checks; whatever removes that
        # plaintext stores it first (``SQLAudit._store_audit_digest``)
        digest = auditlinks.digest(None if event.payload is None else event.payload.data, event.detail)
        params["digest"] = None
    else:
        digest = params["digest"] = digester(event, None)
    # the body a link hashes, split around ``at``: the statement puts in the
    # time it stores (clamped to the entry before's, as history_monotonic_at would)
    params["audit_head"], params["audit_tail"] = auditlinks.body_around_at(
        (*values[:12], values[13]), digest)
    return params


def _again_after(exc: BaseException, attempt: int,
                 errors: Callable[[psycopg.Error], BaseException | None] | None) -> None:
    """After attempt ``attempt`` of a transaction failed with ``exc`` and was
    rolled back: raise what ``exc`` means instead (``errors``), or ``exc``
    itself unless it was a deadlock or serialization victim with attempts
    left; else wait a little before the next attempt."""
    meant = errors(exc) if errors is not None and isinstance(exc, psycopg.Error) else None
    if meant is not None:
        raise meant from None
    if not _rolled_back(exc) or attempt == _TX_ATTEMPTS:
        raise exc
    time.sleep(0.005 * attempt)


def _idle(conn: _Conn) -> bool:
    """Whether ``conn`` is open and outside any transaction (``Recent`` may hand it out again)."""
    return not conn.closed and conn.info.transaction_status == pq.TransactionStatus.IDLE


def _linked_params(event: HistoryEvent, at_before: float, link_before: bytes | None,
                   digester: Digester | None = None) -> dict[str, Any]:
    """The parameters of ``insert_event_linked``: the entry's, its time
    clamped to ``at_before`` (the entry before's, as ``insert_event_fenced``
    does), its digest (``None`` without a keyring: recomputed by the
    verifier) and its link, computed here from ``link_before`` (the entry
    before's stored link, ``None`` if written before the chain: the chain
    starts after it), which the statement checks is still there."""
    values = event_values(event)
    if values[3] < at_before:
        values = (*values[:3], at_before, *values[4:])
    params = dict(zip(_EVENT_KEYS, values, strict=True))
    previous = auditlinks.GENESIS if link_before is None else link_before
    if digester is None:
        payload = event.payload
        params["digest"] = None
        params["link"] = auditlinks.written_link(previous, values, None,
                                                 None if payload is None else payload.data, event.detail)
    else:
        digest = params["digest"] = digester(event, None)
        params["link"] = auditlinks.written_link(previous, values, digest)
    params["previous"] = link_before
    return params


def _remember(links: dict[str, tuple[int, int, float, bytes | None]], run_id: str,
              last: tuple[int, int, float, bytes | None]) -> None:
    """Keep ``last`` as ``run_id``'s last entry (``PostgresStore._links``),
    at most ``_MAX_LINKS`` runs (executions that end pop theirs; this only
    bounds those that never said)."""
    if len(links) >= _MAX_LINKS:
        links.clear()
    links[run_id] = last


def _batch_params(run_id: str, epoch: int, events: Sequence[HistoryEvent]) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "epoch": epoch,
        "first_seq": events[0].seq,
        "seqs": [e.seq for e in events],
        "events": [e.event.value for e in events],
        "ats": [e.at for e in events],
        "epochs": [e.epoch for e in events],
        "workers": [e.worker for e in events],
        "positions": [e.position for e in events],
        "step_kinds": [e.step_kind for e in events],
        "names": [e.name for e in events],
        "input_hashes": [e.input_hash for e in events],
        "attempts": [e.attempt for e in events],
        "started_ats": [e.started_at for e in events],
        "payloads": [pack_payload(e.payload.data) if e.payload else None for e in events],
        "payload_refs": [e.payload.ref if e.payload else None for e in events],
        "details": [_dumps(e.detail) if e.detail is not None else None for e in events],
    }


def _fenced_insert(
    run_id: str, epoch: int, events: Sequence[HistoryEvent], digester: Digester | None
) -> tuple[str, dict[str, Any]]:
    """The one statement that appends ``events`` under the fence (a batch
    unlinked: the transaction it is in links it before its commit)."""
    if len(events) == 1:
        params = _event_params(events[0], digester)
        params["epoch"] = epoch
        return _Q["insert_event_fenced"], params
    return _Q["insert_events_fenced"], _batch_params(run_id, epoch, events)


def _append_fenced(
    conn: _Conn, run_id: str, epoch: int, events: Sequence[HistoryEvent], digester: Digester | None
) -> None:
    """Append consecutive ``events`` under the fence, all or nothing, in one
    statement; ``LeaseLost`` if the fence or the next ``seq`` does not hold."""
    if any(event.run_id != run_id for event in events):
        raise ValueError(f"event for run {events[0].run_id!r} appended to run {run_id!r}")
    query, params = _fenced_insert(run_id, epoch, events, digester)
    try:
        inserted = conn.execute(query, params).rowcount
    except pg_errors.UniqueViolation:
        raise LeaseLost(run_id, epoch) from None  # seq taken: someone else appended
    if inserted != len(events):
        raise LeaseLost(run_id, epoch)


def _lock_fenced(tx: _Conn, run_id: str, epoch: int) -> None:
    """Start a multi-statement fenced write: hold the run row ``FOR UPDATE``
    (so no epoch bump can interleave) or raise ``LeaseLost``."""
    if tx.execute(_Q["lock_fenced"], {"run_id": run_id, "epoch": epoch}).fetchone() is None:
        raise LeaseLost(run_id, epoch)


def _apply(tx: _Conn, transition: lc.Transition) -> RunRecord:
    """Apply a lifecycle transition to a run ``tx`` holds ``FOR UPDATE``;
    return the run as it is after it."""
    update = transition.update
    row = tx.execute(_Q[update.statement], update_params(update)).fetchone()
    assert row is not None, f"{update.statement} found no run {update.run_id!r}"
    for entry in transition.entries:  # after the current maximum: the row is held
        tx.execute(_Q["append_auto"], _event_params(entry))
    if transition.wakes_parent:
        tx.execute(_Q["wake_waiting_parent"], {"child_id": update.run_id, "now": update.at})
    return _run_from_row(row)


def _lock_limits(
    tx: _Conn, lanes: Sequence[admission.Lane]
) -> tuple[dict[str, admission.QueueLimits], dict[str, int], dict[admission.BucketKey, admission.Bucket]]:
    """Lock the limited queues among ``lanes`` (name order: no deadlock
    between claimers) and read, under those locks, what ``admission.plan``
    needs: their limits, running totals, each lane's own running count and
    share (updated in place) and the token buckets. A lane's tenant share
    (``queue_shares``) is locked too, after the queues, in key order."""
    names = sorted({lane.queue for lane in lanes if lane.candidates})
    limits = {row[0]: _queue_from_row(row) for row in tx.execute(_Q["lock_queues"], {"queues": names})}
    keys = sorted((lane.queue, lane.tenant) for lane in lanes if lane.candidates)
    shares = {(row[0], row[1]): (share_from_row(row), share_bucket_from_row(row[6], row[7]))
              for row in tx.execute(_Q["lane_shares"], {
                  "queues": [k[0] for k in keys], "tenants": [k[1] for k in keys]})}
    queue_running: dict[str, int] = {}
    buckets: dict[admission.BucketKey, admission.Bucket] = {}
    if not limits and not shares:
        return limits, queue_running, buckets
    # Statements of their own, after the locks: under READ COMMITTED they see
    # every claim the previous holder of a lock committed.
    limited = {"queues": sorted(limits)}
    queue_running = dict(tx.execute(_Q["queue_running_totals"], limited).fetchall()) if limits else {}
    counted = {"queues": sorted(limits.keys() | {q for q, _ in shares})}
    running = {(q, t): n for q, t, n in tx.execute(_Q["lane_running"], counted)}
    for lane in lanes:
        lane.share, lane.share_bucket = shares.get((lane.queue, lane.tenant), (None, None))
        if lane.queue in limits or lane.share is not None:
            lane.running = running.get((lane.queue, lane.tenant), 0)
    rated = sorted({key[0] for key in admission.bucket_keys(limits, lanes)})
    if rated:
        for q, t, tokens, at in tx.execute(_Q["select_buckets"], {"queues": rated}):
            buckets[(q, t)] = admission.Bucket(tokens, at)
    return limits, queue_running, buckets


def _spend_tokens(
    tx: _Conn, charged: Mapping[admission.BucketKey, admission.Bucket],
    claimed: Sequence[admission.Candidate], now: float,
) -> None:
    """Store the token buckets an exempt role's claim spent (the owner's:
    a tenant's role's claims are charged by ``admit_claim`` as they commit,
    migration 0027), through the functions that recompute each from its
    current row under the row's lock: a tenant's own buckets through
    ``spend_tenant_tokens``, the queue-wide ones through
    ``spend_queue_tokens``."""
    own = sorted(key for key in charged if key[1] != admission.QUEUE_WIDE)
    if own:
        counts = [sum(1 for c in claimed if (c.queue, c.tenant) == key and not c.takeover) for key in own]
        tx.execute(_Q["spend_tenant_tokens"], {"queues": [k[0] for k in own], "tenants": [k[1] for k in own],
                                               "counts": counts, "now": now})
    wide = sorted(key[0] for key in charged if key[1] == admission.QUEUE_WIDE)
    if wide:
        counts = [sum(1 for c in claimed if c.queue == queue and not c.takeover) for queue in wide]
        tx.execute(_Q["spend_queue_tokens"], {"queues": wide, "counts": counts, "now": now})


def _spend_share_tokens(
    tx: _Conn, lanes: Sequence[admission.Lane], claimed: Sequence[admission.Candidate], now: float,
) -> None:
    """Store what an exempt role's claim spent of its lanes' share buckets,
    through ``spend_share_tokens``, which recomputes each under the share
    row's lock (``lane_shares``); a tenant's role's claims are charged by
    ``admit_claim`` (migration 0027)."""
    spent = admission.charge_shares(lanes, claimed, now)
    if spent:
        keys = sorted(spent)
        counts = [sum(1 for c in claimed if (c.queue, c.tenant) == key and not c.takeover) for key in keys]
        tx.execute(_Q["spend_share_tokens"], {"queues": [k[0] for k in keys], "tenants": [k[1] for k in keys],
                                              "counts": counts, "now": now})


def _claim_many(
    tx: _Conn,
    states: Sequence[Sequence[Any]],
    worker: str,
    now: float,
    lease_seconds: float,
    max_recoveries: int,
) -> list[Claim | None]:
    """Claim runs whose rows ``tx`` holds ``FOR UPDATE``; each state is
    ``(run_id, status, owner, epoch, recoveries)`` as read under that lock.
    Returns a claim per state, in order, or ``None`` for a takeover that
    quarantined its run instead (``lifecycle.claim`` decides).

    Set-based: one statement reads every history, one claims every run, one
    appends every lifecycle entry, however many runs (a quarantine adds one).
    """
    ids = [state[0] for state in states]
    # Read after the locks, in a statement of its own: under READ COMMITTED it
    # sees every append that committed before the locks were granted.
    rows: dict[str, list[Sequence[Any]]] = {run_id: [] for run_id in ids}
    for row in tx.execute(_Q["select_histories"], {"run_ids": ids}):
        rows[row[0]].append(row)
    histories: dict[str, list[HistoryEvent]] = {}
    outcomes: list[lc.ClaimOutcome] = []
    for run_id, status, owner, epoch, recoveries in states:
        state = lc.ClaimState(run_id, claim_status(status), owner, epoch, recoveries)
        histories[run_id], last_seq, damage = claim_history(rows[run_id])  # damage quarantines the run
        outcome = lc.claim(state, last_seq, worker, now, lease_seconds, max_recoveries, damage)
        if outcome.quarantine is not None:
            tx.execute(_Q["quarantine"], update_params(outcome.quarantine))
        outcomes.append(outcome)
    claiming = [o for o in outcomes if o.claimed]
    records: dict[str, RunRecord | str] = {}
    if claiming:
        params = {"run_ids": [o.run_id for o in claiming], "recoveries": [o.recoveries for o in claiming],
                  "worker": worker, "lease_until": now + lease_seconds, "now": now}
        records = {row[0]: claimed_run(row) for row in tx.execute(_Q["claim_many"], params)}
    entries = [e for o in outcomes for e in o.entries]
    if entries:
        tx.execute(_Q["insert_events_many"], {"run_ids": [e.run_id for e in entries],
                                              **_lifecycle_arrays(entries)})
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
    return claims
