"""What the SQL backends share: the operator transitions, the holder
writes, the reads of runs and their histories and the queue settings,
written once over a few dialect primitives.

Every operator transition is the same three moves in every dialect: read the
rows it decides on while holding them, let ``lifecycle`` decide, apply the
outcome. Every holder write (``contract.HOLDER_WRITES``) is one shape too:
hold the run at the caller's epoch, append the holder's entries under that
fence, read "now", write the rest, commit (``_held_write``, the one
primitive for "a fenced write with more in the same transaction"). The
moves are written here once; a dialect (``SQLiteStore``, ``PostgresStore``)
supplies only how to run a write transaction (``_in_write``), a read of
one statement (``_select``) or of several from one snapshot
(``_in_read``), how to hold rows in it (``_hold_lease``, ``_held_run``,
``_held_tree``, ...), how to append under the fence (``_append_held``),
how to apply a ``lifecycle.Transition`` (``_apply``) and the SQL of each
query name. What
"holding" means is the dialect's business: the SQLite write lock (and its
cache of each run's last entry, so an append need not read history),
PostgreSQL row locks (the run row locked, then the append). The hot paths
(the one-statement append, the finish, claims, run creation) and leases,
pruning, artifacts and a run's usage (PostgreSQL sums the entries of a run
whose detail its JSON operators refuse) stay in the dialects, each tuned to
its database.

Sections and prefixes say which way code faces: public methods are the
``contract.Store`` a caller sees; ``_`` methods under "dialect primitives"
face down, to what a dialect must supply.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Collection, Iterator, Sequence
from enum import Enum
from typing import Any, Generic, TypeVar

from cairn.errors import InvalidArgument, SQLError
from cairn.faults import fault_point
from cairn.store import admission, transactions
from cairn.store import lifecycle as lc
from cairn.store.archive import RunArchive
from cairn.store.archivesql import SQLArchive
from cairn.store.auditsql import PAGE, SQLAudit
from cairn.store.checkpointsql import SQLCheckpoints
from cairn.store.erasuresql import SQLErasure
from cairn.store.keysql import SQLKeys
from cairn.store.memsql import SQLMemory
from cairn.store.oplogsql import SQLOperatorLog
from cairn.store.records import (
    Approval,
    ApprovalRequest,
    ApprovalStatus,
    BundleRecord,
    Delivery,
    HistoryEvent,
    IndexEntry,
    NewRun,
    Payload,
    RunFilter,
    RunRecord,
    RunStatus,
    TokenRecord,
    approval_key,
)
from cairn.store.retentionsql import SQLRetention
from cairn.store.rows import (
    approval_from_row,
    approval_params,
    bundle_from_row,
    delivery_from_row,
    event_from_row,
    message_params,
    new_record,
    queue_from_row,
    queue_params,
    run_from_row,
    share_from_row,
    share_params,
    update_params,
)
from cairn.store.schedules import (
    Fired,
    ScheduleSpec,
    ScheduleState,
    check_tick_run,
    schedule_from_row,
    schedule_params,
)
from cairn.store.wssql import SQLWorkspaces

Tx = TypeVar("Tx")
T = TypeVar("T")

#: ``(before_commit, after_commit)``: the fault points of a transaction.
Faults = tuple[str, str]
NO_FAULTS: Faults = ("", "")


def commit_faults(name: str) -> Faults:
    """The fault points just before and just after the commit of transition
    ``name`` (``cairn.faults.POINTS``)."""
    return f"store.{name}.before_commit", f"store.{name}.after_commit"


class Hold(Enum):
    """How a holder write holds its run from the fence to its commit, so no
    epoch bump (a takeover, an operator action) interleaves. The SQLite
    write lock holds everything, whichever is asked; on PostgreSQL:"""

    #: the run row locked ``FOR UPDATE`` first, then the append: for writes
    #: that change the run row (a shared lock upgraded could deadlock with
    #: another) or must queue behind a delivery or a decision, which lock it too
    ROW = "row"
    #: only the fenced append's own ``FOR SHARE``: for writes of other tables
    #: only, committed with a step's entry (memory writes)
    APPEND = "append"
    #: the fence checked first, the row held ``FOR KEY SHARE``: it conflicts
    #: with the ``FOR UPDATE`` of every epoch bump but not with a lease
    #: renewal, so a long body (a transactional step's) starves no renewal
    KEY = "key"


class SQLStore(SQLMemory[Tx], SQLCheckpoints[Tx], SQLKeys[Tx], SQLWorkspaces[Tx], SQLArchive[Tx],
               SQLAudit[Tx], SQLErasure[Tx], SQLRetention[Tx],
               SQLOperatorLog[Tx], Generic[Tx]):
    """The operator transitions of ``contract.Store`` over a dialect's
    primitives; ``Tx`` is the dialect's transaction handle. The memory tiers
    are ``memsql.SQLMemory``'s, over the vector index of long-term memory
    (``vectorindex.VectorIndex``), over the same primitives."""

    # -- dialect primitives: transactions and holds --------------------------------

    def _in_write(self, work: Callable[[Tx], T], *, faults: Faults = NO_FAULTS, durable: bool = False) -> T:
        """Run ``work`` in one write transaction, with the fault points
        ``faults`` just before and just after its commit; ``durable``: it
        commits durably whatever the store's mode (PostgreSQL). A dialect
        keeps what it learnt of appends made under ``_append_held`` only
        once the commit is done (SQLite's tail cache)."""
        raise NotImplementedError

    def _hold_lease(
        self, tx: Tx, run_id: str, epoch: int, hold: Hold, events: Sequence[HistoryEvent]
    ) -> None:
        """The fence of a holder write, as ``hold`` says, and ``events``
        appended under it: ``LeaseLost`` (and nothing written) unless run
        ``run_id`` is running at ``epoch``. With no events the hold alone
        checks the fence."""
        raise NotImplementedError

    def _append_held(self, tx: Tx, run_id: str, epoch: int, events: Sequence[HistoryEvent]) -> None:
        """Append ``events`` under the fence inside ``tx`` (``LeaseLost`` if it fails)."""
        raise NotImplementedError

    def _create_in(self, tx: Tx, run: NewRun, now: float) -> bool:
        """Create ``run``, ``pending`` and runnable at ``now``, with its first
        entry, inside ``tx``; ``False`` (nothing written) if its id is taken."""
        raise NotImplementedError

    def _operate(self, body: Callable[[Tx], T]) -> T:
        """Durably (``sqlprimitives.SQLPrimitives._operate``): an operator's
        decision survives whatever crashes next."""
        return self._in_write(body, durable=True)

    # -- dialect primitives: rows held and statements -----------------------------

    def _held_run(self, tx: Tx, run_id: str) -> RunRecord | None:
        """The run, held until the transaction ends (``None``: no such run)."""
        raise NotImplementedError

    def _held_tree(self, tx: Tx, run_id: str) -> list[tuple[str, int]]:
        """``(run_id, epoch)`` of the non-terminal runs of ``run_id``'s tree
        (itself included), each held."""
        raise NotImplementedError

    def _held_of_tenant(self, tx: Tx, tenant: str) -> list[tuple[str, int]]:
        """``(run_id, epoch)`` of the tenant's non-terminal runs, each held."""
        raise NotImplementedError

    def _last_failed_position(self, tx: Tx, run_id: str) -> int | None:
        """The position of the run's last ``step.failed`` entry."""
        raise NotImplementedError

    def _read_run(self, tx: Tx, run_id: str) -> RunRecord | None:
        raise NotImplementedError

    def _apply(self, tx: Tx, transition: lc.Transition) -> RunRecord:
        """Apply ``transition`` to its held run; the run as it is after it."""
        raise NotImplementedError

    def cancel_run(self, run_id: str, reason: str, *, actor: str | None = None) -> RunRecord:
        def body(tx: Tx) -> RunRecord:
            run = self._held_run(tx, run_id)
            now = self.clock()  # read holding the row: a wait for it is not in the past
            live = self._held_tree(tx, run_id) if run is not None else []
            for transition in lc.cancel(run, run_id, live, reason, now, actor):
                self._apply(tx, transition)
            record = self._read_run(tx, run_id)
            assert record is not None
            return record

        return self._operate(body)

    def kill_runs(
        self, reason: str, *, run_id: str | None = None, tenant: str | None = None, actor: str | None = None
    ) -> list[RunRecord]:
        lc.check_kill_target(run_id, tenant)

        def body(tx: Tx) -> list[RunRecord]:
            run = None
            if run_id is not None:
                run = self._held_run(tx, run_id)
                live = self._held_tree(tx, run_id) if run is not None else []
            else:
                assert tenant is not None
                live = self._held_of_tenant(tx, tenant)
            now = self.clock()
            return [self._apply(tx, t) for t in lc.kill(run, run_id, live, reason, now, actor)]

        return self._operate(body)

    def retry_run(self, run_id: str, *, actor: str | None = None) -> RunRecord:
        def body(tx: Tx) -> RunRecord:
            run = self._held_run(tx, run_id)
            now = self.clock()
            position = self._last_failed_position(tx, run_id) if run is not None else None
            return self._apply(tx, lc.retry(run, run_id, position, now, actor))

        return self._operate(body)

    def resolve_operation(
        self, run_id: str, position: int, done: bool, result: Payload | None, detail: dict[str, Any],
        *, actor: str | None = None,
    ) -> RunRecord:
        def body(tx: Tx) -> RunRecord:
            run = self._held_run(tx, run_id)
            now = self.clock()
            return self._apply(tx, lc.resolve_operation(run, run_id, position, done, result, detail, now,
                                                        actor))

        return self._operate(body)

    def revive_run(self, run_id: str, *, actor: str | None = None) -> RunRecord:
        return self._operate(lambda tx: self._apply(tx, lc.revive(self._held_run(tx, run_id), run_id,
                                                                  self.clock(), actor)))

    def set_budget(self, run_id: str, budget: dict[str, Any], *, actor: str | None = None) -> RunRecord:
        return self._operate(lambda tx: self._apply(tx, lc.set_budget(self._held_run(tx, run_id), run_id,
                                                                      budget, self.clock(), actor)))

    # -- reads: runs and their histories ------------------------------------------
    # One statement each, outside any write transaction. A limit that is
    # ``None`` or negative means none: the statements take ``NULL`` for that.

    def get_run(self, run_id: str) -> RunRecord | None:
        rows = self._select("select_run", {"run_id": run_id})
        return run_from_row(rows[0]) if rows else None

    def started_with(self, run_id: str) -> tuple[str | None, str | None] | None:
        rows = self._select("select_started_with", {"run_id": run_id})
        return (rows[0][0], rows[0][1]) if rows else None

    def list_runs(self, filter: RunFilter) -> list[RunRecord]:
        statuses = None if filter.statuses is None else self._list_param([s.value for s in filter.statuses])
        params = {"tenant": filter.tenant, "workflow": filter.workflow, "thread_id": filter.thread_id,
                  "parent_run_id": filter.parent_run_id, "statuses": statuses, "limit": _limit(filter.limit)}
        return [run_from_row(row) for row in self._select("list_runs", params)]

    def history(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[HistoryEvent]:
        params = {"run_id": run_id, "after_seq": after_seq, "limit": _limit(limit)}
        rows = self._or_archived(self._select("select_history", params), run_id,
                                 lambda a: a.entries(after_seq, _limit(limit)))
        return [event_from_row(row) for row in rows]

    def history_headers(self, run_id: str, after_seq: int = 0) -> list[HistoryEvent]:
        params = {"run_id": run_id, "after_seq": after_seq}
        rows = self._or_archived(self._select("select_history_headers", params), run_id,
                                 lambda a: a.headers(after_seq))
        return [event_from_row(row) for row in rows]

    def history_index(self, run_id: str, after_seq: int = 0, last: int | None = None) -> list[IndexEntry]:
        if last is None:
            params: dict[str, Any] = {"run_id": run_id, "after_seq": after_seq}
            rows = self._or_archived(self._select("select_history_index", params), run_id,
                                     lambda a: a.index(after_seq))
        else:
            params = {"run_id": run_id, "after_seq": after_seq, "last": max(0, last)}
            rows = self._or_archived(self._select("select_history_index_last", params), run_id,
                                     lambda a: _newest(a.index(after_seq), last))
        # ``tuple.__new__`` straight from C: ``IndexEntry._make`` is a Python
        # frame per row, 40% of a cold reader's first page of a 3,000-step run
        return list(map(functools.partial(tuple.__new__, IndexEntry), rows))

    def history_at(self, run_id: str, seqs: Collection[int]) -> list[HistoryEvent]:
        if not seqs:
            return []
        params = {"run_id": run_id, "seqs": self._list_param(sorted(seqs))}
        rows = self._or_archived(self._select("select_history_at", params), run_id, lambda a: a.at(seqs))
        return [event_from_row(row) for row in rows]

    def model_calls(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[HistoryEvent]:
        params = {"run_id": run_id, "after_seq": after_seq, "limit": _limit(limit)}
        rows = self._or_archived(self._select("select_model_calls", params), run_id,
                                 lambda a: a.model_calls(after_seq, _limit(limit)))
        return [event_from_row(row) for row in rows]

    def _or_archived(self, rows: list[tuple[Any, ...]], run_id: str,
                     read: Callable[[RunArchive], list[tuple[Any, ...]]]) -> list[tuple[Any, ...]]:
        """``rows`` read from the hot tables, or, when they hold nothing for
        the run and it is archived, the same read from its archive (one
        probe of ``run_archives``, only for an empty answer)."""
        if rows:
            return rows
        archive = self.run_archived(run_id)
        return rows if archive is None else read(archive)

    def audit_entries(self, *, tenant: str | None = None, run_id: str | None = None,
                      page: int = PAGE, damaged: list[tuple[str, str]] | None = None
                      ) -> Iterator[tuple[Any, ...]]:
        """The hot entries, then the archived runs' (each run's entries
        together, as the verifier reads them: its archive keeps them
        verbatim). An archive that cannot be read (damaged, another run's) is
        passed over and named in ``damaged`` as (run, why), so that the
        verifier reports it and goes on with the other runs; without
        ``damaged`` its ``ArchiveError`` is raised."""
        return itertools.chain(SQLAudit.audit_entries(self, tenant=tenant, run_id=run_id, page=page),
                               self.archived_audit_entries(tenant=tenant, run_id=run_id, damaged=damaged))

    # -- holder writes: the lease holder's fenced transitions (contract.HOLDER_WRITES) --

    def _held_write(
        self, run_id: str, epoch: int, write: Callable[[Tx, float], T], *,
        events: Sequence[HistoryEvent] = (), hold: Hold = Hold.ROW, faults: Faults = NO_FAULTS,
        durable: bool = False,
    ) -> T:
        """The one primitive of a holder write: in one write transaction,
        hold run ``run_id`` at ``epoch`` (``LeaseLost`` unless its caller
        holds it; ``hold``), append ``events`` under that fence, read "now",
        then ``write(tx, now)`` the rest, which may append more
        (``_append_held``). Everything commits together or nothing does.

        "Now" is read once the run is held: a holder write that waited for
        a lock (another writer of the SQLite file, a delivery holding the
        run row on PostgreSQL) stamps the time it got it, never a time
        before a change it waited for (tests/store/test_time_after_lock.py)."""

        def work(tx: Tx) -> T:
            self._hold_lease(tx, run_id, epoch, hold, events)
            return write(tx, self.clock())

        return self._in_write(work, faults=faults, durable=durable)

    def suspend_run(
        self, run_id: str, epoch: int, event: HistoryEvent, wake_at: float | None, waiting_on: str | None,
        status: RunStatus = RunStatus.SUSPENDED, waiting_for: str | None = None,
    ) -> None:
        lc.check_suspend_status(status)
        lc.check_wait(waiting_on, waiting_for)

        def write(tx: Tx, now: float) -> None:
            # The run row is held from the fence: a delivery (which holds it too)
            # either committed before, and its message is seen below, or waits
            # for this suspension and then wakes the run. A child's status is
            # read holding its row (lock_child_status) for the same reason.
            child = None
            if status is RunStatus.SUSPENDED and waiting_on is not None:
                child = next((row[0] for row in self._query(tx, "lock_child_status", {"run_id": waiting_on})),
                             None)
            delivered = waiting_for is not None and bool(
                self._query(tx, "next_message", {"run_id": run_id, "key": waiting_for}))
            runnable_at = lc.suspended_runnable_at(status, wake_at, waiting_on, child, now, waiting_for,
                                                   delivered)
            self._query(tx, "suspend", {"run_id": run_id, "epoch": epoch, "now": now, "wake_at": wake_at,
                                        "waiting_on": waiting_on, "waiting_for": waiting_for,
                                        "status": status.value, "runnable_at": runnable_at})

        self._held_write(run_id, epoch, write, events=(event,), faults=commit_faults("suspend"))

    def release_run(self, run_id: str, epoch: int, event: HistoryEvent) -> None:
        self._held_write(run_id, epoch, lambda tx, now: self._release(tx, run_id, epoch, now),
                         events=(event,))

    def rewind_run(self, run_id: str, epoch: int, rewound: HistoryEvent, released: HistoryEvent) -> None:
        cut = lc.rewind_cut(rewound)

        def write(tx: Tx, now: float) -> None:
            self._query(tx, "void_approvals", {"run_id": run_id, "from_position": cut, "now": now})
            self._release(tx, run_id, epoch, now)

        self._held_write(run_id, epoch, write, events=(rewound, released))

    def _release(self, tx: Tx, run_id: str, epoch: int, now: float) -> None:
        self._query(tx, "release", {"run_id": run_id, "epoch": epoch, "now": now})

    def halt_run(self, run_id: str, epoch: int, event: HistoryEvent, error: dict[str, Any]) -> None:
        def write(tx: Tx, now: float) -> None:
            update = lc.halt(run_id, epoch, error, now)
            self._query(tx, "halt", update_params(update))
            self._query(tx, "wake_waiting_parent", {"child_id": run_id, "now": update.at})

        self._held_write(run_id, epoch, write, events=(event,), durable=True)

    def start_child(self, parent_run_id: str, epoch: int, event: HistoryEvent, child: NewRun) -> RunRecord:
        child = lc.child_of(child, parent_run_id)

        def write(tx: Tx, now: float) -> RunRecord:
            if self._create_in(tx, child, now):
                return new_record(child, now, RunStatus.PENDING, epoch=0)
            # someone else's run under the id (invisible if another tenant's, under
            # row-level security): refused, and the transaction takes the entry back
            return lc.existing_child(self._read_run(tx, child.run_id), child)

        return self._held_write(parent_run_id, epoch, write, events=(event,),
                                faults=commit_faults("start_child"))

    def take_delivery(
        self, run_id: str, epoch: int, event: HistoryEvent, seq: int, *, released: int | None = None
    ) -> None:
        def write(tx: Tx, now: float) -> None:
            params = {"run_id": run_id, "seq": seq, "now": now, "position": event.position,
                      "released": released}
            if self._changed(tx, "take_message", params) != 1:
                raise lc.already_taken(run_id, seq)

        self._held_write(run_id, epoch, write, events=(event,), faults=commit_faults("take_delivery"))

    def request_approval(
        self, run_id: str, epoch: int, event: HistoryEvent, request: ApprovalRequest
    ) -> None:
        # the run row is held: a decision (which holds it too) waits for the request
        self._held_write(run_id, epoch,
                         lambda tx, now: self._query(tx, "insert_approval",
                                                     approval_params(run_id, event, request, now)),
                         events=(event,), faults=commit_faults("request_approval"))

    def expire_approval(self, run_id: str, epoch: int, event: HistoryEvent, request_id: str) -> bool:
        def write(tx: Tx, now: float) -> bool:
            params = {"run_id": run_id, "request_id": request_id, "now": now}
            if self._changed(tx, "expire_approval", params) != 1:
                return False  # decided first: the decision waits in the mailbox
            self._append_held(tx, run_id, epoch, (event,))
            return True

        # the fence before the expiry is decided: a stale holder learns LeaseLost, whichever came first
        return self._held_write(run_id, epoch, write, faults=commit_faults("expire_approval"))

    def _append_with(
        self, run_id: str, epoch: int, events: Sequence[HistoryEvent], body: Callable[[Tx], None]
    ) -> None:
        # memory writes touch no run row: the append's own hold is enough
        self._held_write(run_id, epoch, lambda tx, now: body(tx), events=events, hold=Hold.APPEND,
                         faults=commit_faults("append"))

    def transact(
        self, run_id: str, epoch: int,
        body: Callable[[transactions.Tx], tuple[Sequence[HistoryEvent], T]],
    ) -> T:
        """Run ``body`` inside one write transaction fenced on the lease of
        ``run_id`` at ``epoch`` and append the entries it returns in that
        same transaction: the user's rows and the step's record commit
        together or not at all.

        The fence is checked before the body runs (a stale holder's body
        never runs) and again by the fenced append (the hard guarantee, as
        for every append). ``body`` gets a ``transactions.Tx`` that refuses
        transaction control; if it raises, or one of its statements failed,
        nothing commits and its exception propagates. A PostgreSQL
        transaction chosen as a deadlock victim runs again, body included
        (nothing of the first run committed)."""

        def write(tx: Tx, now: float) -> T:
            handle = self._user_tx(tx)
            try:
                events, result = body(handle)
            finally:
                handle.end()
            doomed = handle.doomed()
            if doomed is not None:  # the body caught a failed statement: it must not commit
                raise SQLError(f"{doomed} (the body went on after it, but a failed statement rolls "
                               "the whole transaction back)")
            self._check_session(tx)
            fault_point("store.transact.before_append")
            self._append_held(tx, run_id, epoch, events)
            return result

        return self._held_write(run_id, epoch, write, hold=Hold.KEY, faults=commit_faults("transact"),
                                durable=True)

    def _user_tx(self, tx: Tx) -> transactions.Tx:
        """The handle for the user's statements on ``tx``'s connection."""
        raise NotImplementedError

    def _check_session(self, tx: Tx) -> None:
        """After the body, before the append: undo or refuse what the body
        did to the session that outlives the transaction on this pooled
        connection (a temporary table that would shadow Cairn's, a changed
        setting), so the store's own statements run where they always do."""
        raise NotImplementedError

    # -- a worker's own runs ---------------------------------------------------------

    def reclaim_owned(self, worker: str) -> int:
        # several rows: on PostgreSQL a possible deadlock victim, hence a (retried) transaction
        return self._in_write(lambda tx: self._changed(tx, "reclaim_owned",
                                                       {"worker": worker, "now": self.clock()}))

    # -- queues (store/admission.py) -------------------------------------------------

    def set_queue(self, limits: admission.QueueLimits) -> None:
        def body(tx: Tx) -> None:
            params = queue_params(limits, self.clock())  # in the transaction: SQLite's write lock held
            self._changed(tx, "delete_queue" if limits.unlimited else "upsert_queue", params)
            self._changed(tx, "delete_stale_buckets", params)
            self._log_action(tx)

        self._in_write(body)

    def queue_stats(self, tenant: str | None = None) -> list[admission.QueueStats]:
        def body(tx: Tx) -> list[admission.QueueStats]:
            # one snapshot: the limits and the counts they are judged with
            query, params = ("queue_counts", {"now": self.clock()}) if tenant is None else (
                "tenant_queue_counts", {"now": self.clock(), "tenant": tenant})
            limits = {row[0]: queue_from_row(row) for row in self._query(tx, "select_queues", {})}
            counts = {q: (running, runnable) for q, running, runnable in self._query(tx, query, params)}
            return admission.stats(limits, counts)

        return self._in_read(body)

    def set_queue_share(self, share: admission.QueueShare) -> None:
        def body(tx: Tx) -> None:
            # judged against the queue's limits as they are in this very transaction
            limits = {row[0]: queue_from_row(row) for row in self._query(tx, "select_queues", {})}
            admission.check_share(share, limits.get(share.queue))
            params = share_params(share, self.clock())  # in the transaction: SQLite's write lock held
            self._changed(tx, "delete_share" if share.unset else "upsert_share", params)
            self._log_action(tx)

        self._in_write(body)

    def queue_shares(self, tenant: str | None = None) -> list[admission.QueueShare]:
        return [share_from_row(row) for row in self._select("select_shares", {"tenant": tenant})]

    # -- schedules (store/schedules.py) ------------------------------------------

    def register_schedule(self, spec: ScheduleSpec) -> ScheduleState:
        def body(tx: Tx) -> ScheduleState:
            before = self._query(tx, "lock_schedule", {"tenant": spec.tenant, "name": spec.name})
            params = schedule_params(spec, self.clock())
            state = schedule_from_row(self._query(tx, "upsert_schedule", params)[0])
            if not before or schedule_from_row(before[0]).spec != spec:  # each worker's start re-registers
                self._log_action(tx, created=not before)
            return state

        return self._in_write(body)

    def list_schedules(self, tenant: str | None = None) -> list[ScheduleState]:
        return [schedule_from_row(row) for row in self._select("select_schedules", {"tenant": tenant})]

    def fire_schedule(self, tenant: str, name: str, tick: float, run: NewRun | None) -> Fired:
        check_tick_run(tenant, run)

        def body(tx: Tx) -> Fired:
            # The schedule's row is held (SQLite: the write lock; PostgreSQL: FOR
            # UPDATE): every worker firing this tick queues here, and each later
            # one reads last_tick after the first one's commit.
            now = self.clock()
            rows = self._query(tx, "lock_schedule", {"tenant": tenant, "name": name})
            if not rows:
                return Fired.MISSING
            state = schedule_from_row(rows[0])
            if state.last_tick is not None and state.last_tick >= tick:
                return Fired.STALE
            fired = Fired.PASSED
            if run is not None:
                if self._create_in(tx, run, now):
                    fired = Fired.CREATED
                else:  # a run already holds the id: ours (a lost state), or one we cannot read
                    existing = self._read_run(tx, run.run_id)
                    ours = existing is not None and existing.tenant == tenant
                    fired = Fired.EXISTED if ours else Fired.TAKEN
            self._query(tx, "advance_schedule", {
                "tenant": tenant, "name": name, "tick": tick, "now": now,
                "run_id": run.run_id if run is not None else None, "created": int(fired is Fired.CREATED)})
            return fired

        return self._in_write(body, faults=commit_faults("fire_schedule"))

    # -- mailboxes ------------------------------------------------------------------

    def deliver(
        self, run_id: str, key: str, payload: Payload | None, *, sender: str | None = None,
        dedupe: str | None = None,
    ) -> tuple[Delivery, bool]:
        def body(tx: Tx) -> tuple[Delivery, bool]:
            run = self._held_run(tx, run_id)
            earlier = self._delivered(tx, run_id, dedupe) if run is not None else None
            if earlier is not None:  # the same delivery, even to a run that has finished since
                return earlier, False
            lc.check_deliverable(run, run_id, key)
            delivered = self._deliver(tx, run_id, key, payload, sender, dedupe, self.clock())
            fault_point("store.deliver.before_commit")
            return delivered

        delivered = self._operate(body)
        fault_point("store.deliver.after_commit")
        return delivered

    def deliveries(self, run_id: str, key: str | None = None, after_seq: int = 0) -> list[Delivery]:
        params = {"run_id": run_id, "key": key, "after_seq": after_seq}
        rows = self._or_archived(self._select("select_messages", params), run_id,
                                 lambda a: a.messages(key, after_seq))
        return [delivery_from_row(row) for row in rows]

    def delivery(self, run_id: str, key: str, seq: int | None = None) -> Delivery | None:
        if seq is None:
            rows = self._select("next_message", {"run_id": run_id, "key": key})
        else:
            rows = self._select("message_at", {"run_id": run_id, "key": key, "seq": seq})

        def archived(archive: RunArchive) -> list[tuple[Any, ...]]:
            row = archive.message(key, seq)
            return [] if row is None else [row]

        rows = self._or_archived(rows, run_id, archived)
        return delivery_from_row(rows[0]) if rows else None

    def latest_event(self, run_id: str, key: str) -> HistoryEvent | None:
        rows = self._select("latest_event", {"run_id": run_id, "key": key})
        if not rows and (archive := self.run_archived(run_id)) is not None:
            row = archive.latest_event(key)
            rows = [] if row is None else [row]
        return event_from_row(rows[0]) if rows else None

    def _delivered(self, tx: Tx, run_id: str, dedupe: str | None) -> Delivery | None:
        """The message of run ``run_id``'s mailbox delivered with ``dedupe``."""
        if dedupe is None:
            return None
        for (seq,) in self._query(tx, "message_by_dedupe", {"run_id": run_id, "dedupe": dedupe}):
            params = {"run_id": run_id, "key": None, "after_seq": seq - 1}
            return delivery_from_row(self._query(tx, "select_messages", params)[0])
        return None

    def _deliver(
        self, tx: Tx, run_id: str, key: str, payload: Payload | None, sender: str | None, dedupe: str | None,
        now: float,
    ) -> tuple[Delivery, bool]:
        """``deliver`` inside a transaction that holds the run and has checked
        it may take deliveries (``lifecycle.check_deliverable``): for
        transitions that deliver as a part of what they do (a decision on an
        approval records the decision and delivers it, atomically)."""
        earlier = self._delivered(tx, run_id, dedupe)
        if earlier is not None:
            return earlier, False
        params = message_params(run_id, key, payload, sender, dedupe, now)
        ((seq,),) = self._query(tx, "insert_message", params)
        self._query(tx, "wake_waiting_for", {"run_id": run_id, "key": key, "now": now})
        return Delivery(run_id, seq, key, payload, sender, dedupe, now), True

    # -- approvals ------------------------------------------------------------------

    def decide_approval(
        self, run_id: str, request_id: str, status: ApprovalStatus, payload: Payload | None,
        comment: str | None, *, actor: str,
    ) -> Approval:
        def body(tx: Tx) -> Approval:
            run = self._held_run(tx, run_id)  # held: the holder's request and expiry wait for us
            now = self.clock()
            found = self._query(tx, "select_approvals", self._approval_filter(run_id, request_id))
            approval = approval_from_row(found[0]) if found else None
            lc.check_decision(run, run_id, approval, request_id, status, actor, now)
            key = approval_key(request_id)
            delivery, _ = self._deliver(tx, run_id, key, payload, actor, key, now)
            self._query(tx, "decide_approval", {"run_id": run_id, "request_id": request_id,
                                                "status": status.value, "actor": actor, "now": now,
                                                "comment": comment, "decision_seq": delivery.seq})
            (row,) = self._query(tx, "select_approvals", self._approval_filter(run_id, request_id))
            return approval_from_row(row)

        return self._operate(body)

    def approvals(
        self, *, tenant: str | None = None, run_id: str | None = None, request_id: str | None = None,
        pending: bool = True, limit: int = 1000,
    ) -> list[Approval]:
        params = self._approval_filter(run_id, request_id, tenant, pending, limit)
        rows = self._select("select_approvals", params)
        if run_id is not None and not pending:  # an archived run's from its archive (none is pending)
            rows = self._or_archived(rows, run_id,
                                     lambda a: self._archived_approvals(a, request_id, tenant, limit))
        elif not pending:  # across runs: the archived runs' too, merged in the statement's order
            rows = _merged_approvals(rows, self._all_archived_approvals(request_id, tenant, limit), limit)
        return [approval_from_row(row) for row in rows]

    def _all_archived_approvals(self, request_id: str | None, tenant: str | None,
                                limit: int) -> list[tuple[Any, ...]]:
        """The approvals of every archived run of ``tenant`` (of all, without
        one), each run's first ``limit`` (none is pending: an archived run is
        closed); ``archived_approvals`` keeps each archive's rows once read."""
        found: list[tuple[Any, ...]] = []
        for _, rows in itertools.groupby(self.archived_approvals(tenant), key=lambda r: r[0]):
            chosen = [r for r in rows if (tenant is None or r[2] == tenant)  # (the records' filter, again)
                      and (request_id is None or r[1] == request_id)]
            found.extend(chosen if limit < 0 else chosen[:limit])
        return found

    def _archived_approvals(self, archive: RunArchive, request_id: str | None, tenant: str | None,
                            limit: int) -> list[tuple[Any, ...]]:
        if tenant is not None and archive.tenant != tenant:
            return []
        run = self.get_run(archive.run_id)
        rows = archive.approvals(request_id, "" if run is None else run.status.value)
        return rows if limit < 0 else rows[:limit]

    def _approval_filter(
        self, run_id: str | None, request_id: str | None, tenant: str | None = None, pending: bool = False,
        limit: int = 1000,
    ) -> dict[str, Any]:
        """Parameters of ``select_approvals`` (a dialect may add its own)."""
        return {"run_id": run_id, "request_id": request_id, "tenant": tenant, "pending": pending,
                "limit": limit, "terminal": list(lc.TERMINAL)}

    # -- the HTTP API (cairn.server): tokens and a tenant's run changes ----------------------
    # Token checks are reads (one per request), so they never take the write lock.

    def create_token(self, token: TokenRecord) -> None:
        def body(tx: Tx) -> None:
            if self._query(tx, "select_token", {"token_id": token.token_id}):
                raise InvalidArgument(f"a token with id {token.token_id!r} exists already")
            self._query(tx, "insert_token", {
                "token_id": token.token_id, "tenant": token.tenant, "role": token.role, "name": token.name,
                "digest": token.digest, "created_at": token.created_at, "created_by": token.created_by})
            self._log_action(tx)

        self._operate(body)

    def get_token(self, token_id: str) -> TokenRecord | None:
        rows = self._select("select_token", {"token_id": token_id})
        return _token_from_row(rows[0]) if rows else None

    def list_tokens(self, tenant: str | None = None) -> list[TokenRecord]:
        return [_token_from_row(row) for row in self._select("list_tokens", {"tenant": tenant})]

    def revoke_token(self, token_id: str) -> bool:
        def body(tx: Tx) -> bool:
            live = any(row[7] is None for row in self._query(tx, "select_token", {"token_id": token_id}))
            if live:
                self._query(tx, "revoke_token", {"token_id": token_id, "now": self.clock()})
                self._log_action(tx)
            return live

        return self._operate(body)

    def runs_changed(
        self, tenant: str, after: tuple[float, str], until: float, limit: int = 100
    ) -> list[RunRecord]:
        params = {"tenant": tenant, "after_at": float(after[0]), "after_run_id": after[1],
                  "until": float(until), "limit": limit}
        return [run_from_row(row) for row in self._select("runs_changed", params)]


    # -- bundles (cairn.engine.bundles): not on any hot path ------------------------

    def put_bundles(self, bundles: Collection[BundleRecord]) -> None:
        def body(tx: Tx) -> None:
            now = self.clock()
            for b in bundles:
                if self._changed(tx, "insert_bundle", {"bundle_id": b.bundle_id, "workflow": b.workflow,
                                                       "version": b.version, "code": b.code,
                                                       "content": b.content, "now": now}):
                    # a bundle new to the store (one already there is not a change)
                    self._log_action(tx, object_id=b.bundle_id, workflow=b.workflow, version=b.version,
                                     code=b.code)

        if bundles:
            self._operate(body)

    def bundles(self, workflows: Collection[str] | None = None) -> list[BundleRecord]:
        wanted = None if workflows is None else self._list_param(sorted(set(workflows)))
        return [bundle_from_row(row) for row in self._select("select_bundles", {"workflows": wanted})]

    def serve_bundles(self, bundle_ids: Collection[str]) -> None:
        if bundle_ids:
            ids = self._list_param(sorted(set(bundle_ids)))
            self._operate(lambda tx: self._query(tx, "serve_bundles",
                                                 {"bundle_ids": ids, "now": self.clock()}))

    def run_counts(self) -> list[tuple[str, str, str, int]]:
        rows = self._select("run_counts", {})
        return [(str(row[0]), str(row[1]), str(row[2]), int(row[3])) for row in rows]

    def bundle_counts(self) -> list[tuple[str | None, str, str, str, int]]:
        return [(row[0], row[1], row[2], str(row[3]), int(row[4]))
                for row in self._select("bundle_counts", {})]

    def migrate_run(
        self, run_id: str, bundle: BundleRecord, detail: dict[str, Any], *, actor: str | None = None,
        checked_seq: int | None = None,
    ) -> RunRecord:
        def body(tx: Tx) -> RunRecord:
            run = self._held_run(tx, run_id)  # held: no claim, so no append, until the commit
            journal = None if run is None or checked_seq is None else \
                (checked_seq, int(self._query(tx, "max_seq", {"run_id": run_id})[0][0]))
            return self._apply(tx, lc.migrate(run, run_id, bundle, detail, self.clock(), actor, journal))

        return self._operate(body)


def _newest(rows: list[tuple[Any, ...]], last: int) -> list[tuple[Any, ...]]:
    """The last ``last`` of ``rows`` (none for ``last`` <= 0)."""
    return rows[max(0, len(rows) - last):] if last > 0 else []


def _merged_approvals(hot: list[tuple[Any, ...]], archived: list[tuple[Any, ...]],
                      limit: int) -> list[tuple[Any, ...]]:
    """``select_approvals``' hot rows and archived runs' rows, in its order
    (request time, run, request id) and its limit (a negative one: none)."""
    if not archived:
        return hot
    rows = sorted(hot + archived, key=lambda r: (r[9], r[0], r[1]))
    return rows if limit < 0 else rows[:limit]


def _limit(limit: int | None) -> int | None:
    """A read's limit as its statement takes it: ``None`` for no limit."""
    return None if limit is None or limit < 0 else limit


def _token_from_row(row: tuple[Any, ...]) -> TokenRecord:
    return TokenRecord(token_id=row[0], tenant=row[1], role=row[2], name=row[3], digest=row[4],
                       created_at=float(row[5]), created_by=row[6],
                       revoked_at=None if row[7] is None else float(row[7]))
