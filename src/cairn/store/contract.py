"""The store contract: the only way from Cairn to a database.

Every backend (``sqlite``, ``postgres``; ``memory://`` is a throwaway SQLite
store) implements this protocol and passes the same contract test suite
(``tests/store/``). The rules are documented here, on each method, and
decided in one place, ``lifecycle`` (the run state machine as pure
functions) and ``admission`` (which runs a claim takes), so that a backend
is a translation of them into its own dialect and nothing more. Optional
capabilities are protocols of their own (``Notifier``, ``Migratable``).

Rules common to every method:

* **Fencing.** Each claim of a run increments its ``epoch``. A method that
  takes ``epoch`` is a *fenced write*: it is applied only if the run is still
  ``running`` at exactly that epoch, otherwise it raises ``LeaseLost`` and
  changes nothing. Takeovers, cancellations and operator actions bump the
  epoch, so a stale holder cannot write after them.
* **Atomicity.** Each method is one transaction: it happens entirely or not
  at all.
* **History.** Every run has one append-only history; ``seq`` starts at 1 and
  has no gaps. Only the lease holder appends with explicit ``seq`` values (it
  knows the next one from its ``Claim``); writers that bump the epoch append
  after the current maximum.
* **Errors.** A backend raises only Cairn's errors (``StoreError`` and its
  subclasses, ``PayloadError``, ``ValueError`` for a misuse): a driver's
  own exceptions never escape it.
* **Actors.** Operator actions take ``actor`` (who did it, e.g.
  ``"cli:root@host"``), recorded as ``"actor"`` in the detail of the entry
  they append (left out when ``None``).
* **Clock.** Backends read time from the ``clock`` they were built with, so
  tests can drive lease expiry and timers deterministically.
* **Tenancy.** Every run belongs to one tenant, and every history entry is
  stored with its run's tenant, filled in by the store from the run row in
  the statement that writes the entry (never by the caller, so an entry can
  never claim a tenant its run does not have). Artifacts carry no tenant:
  they are content-addressed and shared, so identical bytes stored by two
  tenants are one artifact. Reading one needs its SHA-256 reference, that is
  the content itself or a reference from a row the reader may see.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from cairn.store.admission import QueueLimits, QueueShare, QueueStats
from cairn.store.erasuresql import ErasureRecord
from cairn.store.lifecycle import DEFAULT_PRUNE_STATUSES
from cairn.store.memrecords import (
    ItemTierMove,
    ItemTierUsage,
    MemoryItem,
    MemoryScope,
    MemoryWrite,
    Provenance,
    RunMemory,
    ThreadMessage,
)
from cairn.store.records import (
    Approval,
    ApprovalRequest,
    ApprovalStatus,
    ArchiveRecord,
    BundleRecord,
    Claim,
    Delivery,
    Durability,
    HistoryEvent,
    IndexEntry,
    NewRun,
    Payload,
    RunFilter,
    RunRecord,
    RunStatus,
    TokenRecord,
    UsageTotals,
)
from cairn.store.retention import Cutoffs, DataClass, Policy
from cairn.store.retentionsql import DeletedRun, Fence, Key
from cairn.store.schedules import Fired, ScheduleSpec, ScheduleState
from cairn.store.transactions import Tx
from cairn.store.vectorindex import (
    EmbeddingClaim,
    EmbeddingTask,
    MemorySearch,
    Scalar,
    TierMove,
    TierUsage,
)

_R = TypeVar("_R")

#: An artifact stored (or stored again) less than this many seconds ago is
#: never deleted by pruning, whatever ``older_than`` says: its writer may be
#: about to record the entry that points to it. Longer than any wait between
#: storing a payload and appending its entry (lock and connection timeouts).
ARTIFACT_GRACE_SECONDS = 3600.0

#: The holder writes: the ``Store`` methods by which a run's lease holder
#: writes its run, each fenced on ``(run_id, epoch)`` (``LeaseLost`` and
#: nothing written unless the caller holds the run at that epoch). The SQL
#: stores write every one but the hot append and the finish through one
#: primitive (``sqlbase.SQLStore._held_write``). The contract suite's fencing
#: matrix is derived from this set: every member against every way of
#: losing a lease (tests/store/contract/fencing.py), and a test there fails
#: when a method of a store that takes an ``epoch`` is missing here, so a new
#: holder write is fenced-tested by construction.
HOLDER_WRITES = frozenset({
    "append", "transact", "suspend_run", "release_run", "rewind_run", "finish_run", "start_child",
    "take_delivery", "request_approval", "expire_approval", "halt_run", "append_memory",
    "put_workspace_objects",
})


@runtime_checkable
class Notifier(Protocol):
    """A store that can say when runs may have become claimable (PostgreSQL's
    ``LISTEN``; SQLite's datagram sockets, ``store.wakeups``), so workers
    wake at once instead of at their next poll."""

    def listen(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` (on another thread) soon after any run may have
        become claimable, and once after every (re)connection; return a
        function that stops listening. A lost notification costs latency,
        never a stuck run: workers keep polling."""
        ...


@runtime_checkable
class Migratable(Protocol):
    """A store with a versioned schema (the SQL stores)."""

    def migrate(self) -> list[int]:
        """Apply the migrations the database lacks; return their versions."""
        ...

    def schema_version(self) -> int:
        """The highest migration applied (0: none)."""
        ...


@runtime_checkable
class Store(Protocol):
    """A durable home for runs, their histories and large payloads."""

    durability: Durability
    #: the time the store stamps rows with (Unix seconds; PostgreSQL: the server's)
    clock: Callable[[], float]

    # -- creating and reading runs -------------------------------------------

    def create_run(self, run: NewRun) -> tuple[RunRecord, bool]:
        """Create ``run`` as ``pending`` (epoch 0) with history ``[run.created]``.

        Idempotent on ``run_id``: if a run with that id exists it is returned
        unchanged with ``False``; otherwise the new record with ``True``.
        """
        ...

    def create_claimed_run(self, run: NewRun, worker: str, lease_seconds: float) -> Claim | None:
        """Create ``run`` already held by ``worker`` (status ``running``, epoch 1).

        The embedded fast path: one transaction instead of create + claim.
        History is ``[run.created, lease.claimed, run.started]``. Returns
        ``None`` and changes nothing if the run id already exists. Also
        ``None`` where queue admission binds the store (a tenant's role on
        PostgreSQL, migration 0027) and the run's queue does not admit it
        now: the run is then created pending, for ``claim_run`` (or a
        worker) to take once it does.
        """
        ...

    def get_run(self, run_id: str) -> RunRecord | None:
        """The run with this id, or ``None``."""
        ...

    def started_with(self, run_id: str) -> tuple[str | None, str | None] | None:
        """The role and token id run ``run_id`` was started with (either
        ``None``: started without a token), or ``None`` if there is no such
        run. Written at creation and never changed (the database refuses
        it), so a reader may keep it for as long as it holds the run."""
        ...

    def run_subject(self, run_id: str) -> str | None:
        """The subject run ``run_id`` was started for (``None``: none, or no
        such run). Never changed once written (the database refuses it)."""
        ...

    def list_runs(self, filter: RunFilter) -> list[RunRecord]:
        """Runs matching ``filter``, newest first, at most ``filter.limit``."""
        ...

    def history(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[HistoryEvent]:
        """History entries of ``run_id`` with ``seq > after_seq``, in order."""
        ...

    def history_headers(self, run_id: str, after_seq: int = 0) -> list[HistoryEvent]:
        """``history(run_id, after_seq)`` without the payloads (every entry's
        ``payload`` is ``None``, whether it has one or not): what a reader
        that needs a few entries' payloads reads first, fetching those with
        ``history_at`` (a graph run's history page reads ten of its
        checkpoints, not all of them, nor decompresses the rest)."""
        ...

    def history_index(self, run_id: str, after_seq: int = 0, last: int | None = None) -> list[IndexEntry]:
        r"""The entries of ``run_id`` after ``after_seq``, in order, as their
        seq, entry type, position, step kind, name and time only: a graph
        run's reader lists its checkpoints from these (a 3,000-super-step
        run's cold history page built 3,000 ``HistoryEvent``\ s it did not need).
        With ``last``, only the newest ``last`` of them (still in order): a
        cold reader's first page reads the run's tail, not its whole index."""
        ...

    def history_at(self, run_id: str, seqs: Collection[int]) -> list[HistoryEvent]:
        """The entries of ``run_id`` at ``seqs`` (those that exist), in order:
        a read of a few model calls fetches what they need, not the journal
        before them (``modelcalls.needs``)."""
        ...

    def model_calls(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[HistoryEvent]:
        """The recorded model calls of ``run_id`` (``step.completed`` entries
        of kind ``model`` with a payload) with ``seq > after_seq``, in order,
        at most ``limit``: a page of them, without the entries between."""
        ...

    def run_usage(self, run_id: str) -> UsageTotals:
        """What ``run_id`` has spent and its last ``seq``, summed in the
        database (a read of a long run must not load its history for three
        numbers); all zero for a run with no history. A model entry whose
        detail is damaged counts nothing."""
        ...

    # -- claiming and leases -----------------------------------------------

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
        """Claim up to ``limit`` runnable runs of the given workflows, in
        ``queues`` (``None``: every queue). A run that records a bundle is
        claimed only if ``bundles`` names it (``None``: any bundle); a run
        without one (older than bundles) by its workflow alone.

        Runnable means: ``pending``; ``suspended`` with ``wake_at`` due; or
        ``running`` under an expired lease (its holder is presumed dead).
        Which runnable runs are taken, and in what order, is decided by
        ``admission.plan`` (its module doc holds the rules): takeovers
        first; then, within each queue's configured limits (``set_queue``:
        concurrency and token-bucket rates, queue-wide and per tenant), the
        next run always comes from the tenant with the fewest runs of that
        queue running; a tenant's own runs go by higher ``priority``, then
        the longest-runnable. Limits hold across concurrent claimers on any
        number of machines. Each claimed run
        becomes ``running``, owned by ``worker`` until now + ``lease_seconds``,
        at ``epoch + 1``. Appended history: ``lease.claimed`` (+ ``run.started``
        the first time, ``run.woken`` after a suspension); a takeover appends
        ``lease.lost`` (naming the old holder) and ``lease.taken_over`` and
        increments ``recoveries``. A takeover that would exceed
        ``max_recoveries`` moves the run to ``quarantined`` (appending
        ``run.quarantined``) and does not return it. No run is ever returned
        to two concurrent callers.
        """
        ...

    def claim_run(self, run_id: str, worker: str, lease_seconds: float, max_recoveries: int) -> Claim | None:
        """Claim one specific run by the rules of ``claim_runs``; ``None`` if it
        is not runnable now."""
        ...

    def reclaim_owned(self, worker: str) -> int:
        """Make runs still ``running`` under ``worker`` runnable at once.

        Called when a worker (re)starts with a fixed id: whatever it held
        before is from a dead incarnation. They are claimed later as
        takeovers. Returns how many runs were affected.
        """
        ...

    def renew_leases(self, worker: str, leases: Mapping[str, int], lease_seconds: float) -> set[str]:
        """Extend each lease in ``leases`` (run id -> epoch) still held by
        ``worker`` at that epoch to now + ``lease_seconds``. Returns the run
        ids whose lease is no longer held (those are not touched)."""
        ...

    # -- queues ------------------------------------------------------------------

    def set_queue(self, limits: QueueLimits) -> None:
        """Replace the limits of queue ``limits.name``; they apply from the
        next claim on, on every worker. A ``QueueLimits`` without any limit
        removes the queue's configuration. A token bucket whose rate is
        removed is forgotten (a rate set later starts with a full bucket);
        one whose rate changes keeps its tokens."""
        ...

    def queue_stats(self, tenant: str | None = None) -> list[QueueStats]:
        """Every queue that has limits or runs that are running or runnable,
        by name, with how many of its runs are ``running`` and how many could
        be claimed now. With ``tenant``: the queues with limits or with runs
        of that tenant, counting only its runs (what a tenant may see)."""
        ...

    def set_queue_share(self, share: QueueShare) -> None:
        """Replace tenant ``share.tenant``'s own caps in queue ``share.queue``
        (``concurrency`` and ``rate`` both ``None``: remove the share). They
        apply from the next claim on, to that tenant's runs of the queue
        only, on top of the queue's limits (``set_queue``): they can only
        hold the tenant back further. A rate above the queue's
        ``tenant_rate`` raises ``InvalidArgument`` and writes nothing
        (``admission.check_share``, in the same transaction)."""
        ...

    def queue_shares(self, tenant: str | None = None) -> list[QueueShare]:
        """Every tenant's own queue shares (with ``tenant``: that tenant's),
        by queue, then tenant."""
        ...

    # -- schedules (store/schedules.py) ------------------------------------------

    def register_schedule(self, spec: ScheduleSpec) -> ScheduleState:
        """Record the definition of schedule (``spec.tenant``, ``spec.name``)
        as a worker's code declares it and return its row. The first
        registration sets ``created_at`` to now (no tick before it ever
        fires); a later one replaces the definition and ``updated_at`` and
        keeps the firing state (``last_tick``, ``last_run_id``, ``fired``)."""
        ...

    def list_schedules(self, tenant: str | None = None) -> list[ScheduleState]:
        """The registered schedules (of ``tenant``, or every one this store
        may read), by tenant then name."""
        ...

    def fire_schedule(self, tenant: str, name: str, tick: float, run: NewRun | None) -> Fired:
        """Fire one tick (UTC epoch seconds) of schedule (``tenant``, ``name``)
        in one transaction; return what happened.

        If ``last_tick`` is at or after ``tick``, nothing changes
        (``STALE``): whoever moved it there fired or passed over this tick.
        Otherwise ``last_tick`` becomes ``tick`` and, when ``run`` is given
        (its tenant must be ``tenant``: ``ValueError`` otherwise), ``run`` is
        created as by ``create_run`` (``CREATED``, which also sets
        ``last_run_id``, ``fired_at`` and counts it in ``fired``); a run of
        this tenant already under its id is kept unchanged (``EXISTED``),
        and one this store cannot read or of another tenant leaves the tick
        without a run (``TAKEN``) rather than blocking every later tick.
        ``run=None`` only moves ``last_tick`` (``PASSED``: a skipped tick).
        Concurrent calls for one schedule are serialised, so a tick creates
        at most one run however many workers fire it. An unregistered
        schedule changes nothing (``MISSING``).
        """
        ...

    # -- fenced writes by the lease holder -----------------------------------

    def append(
        self, run_id: str, epoch: int, events: Sequence[HistoryEvent], *, barrier: bool = False
    ) -> None:
        """Append ``events`` (consecutive ``seq`` from the holder's counter).

        Fenced. The first ``seq`` must be the current maximum + 1; anything
        else means another writer appended: ``LeaseLost`` is raised and
        nothing is written.

        ``barrier=True`` is the *effect barrier*: when this returns, these
        events and everything before them are on stable storage, whatever the
        store's durability mode (one fsync in the ``process`` mode). It is
        used before a side effect touches the outside world.
        """
        ...

    def transact(
        self, run_id: str, epoch: int, body: Callable[[Tx], tuple[Sequence[HistoryEvent], _R]]
    ) -> _R:
        """Run ``body`` in one write transaction fenced on the lease and
        append the entries it returns in that same transaction; return what
        it returned besides them (a transactional step: the user's SQL
        through the ``Tx`` and the step's record commit together or not at
        all).

        Fenced twice: ``LeaseLost`` before the body runs if the holder is
        stale, and the append itself is the fenced append. No epoch bump
        can interleave between the two. If ``body`` raises, or a statement
        it ran failed, everything rolls back and the exception propagates
        (a failed statement as ``SQLError``).
        """
        ...

    def suspend_run(
        self,
        run_id: str,
        epoch: int,
        event: HistoryEvent,
        wake_at: float | None,
        waiting_on: str | None,
        status: RunStatus = RunStatus.SUSPENDED,
        waiting_for: str | None = None,
    ) -> None:
        """Release the lease and park the run: ``suspended`` until ``wake_at``,
        or until run ``waiting_on`` finishes (it is runnable at once if that
        run is already terminal), or until a delivery for wait key
        ``waiting_for`` arrives (at once if one is already in its mailbox,
        unconsumed; else at the delivery or at ``wake_at``, its timeout,
        whichever comes first), or, with none of them, until an operator
        action (``set_budget``) wakes it. ``status`` may instead be
        ``needs_attention``: parked until ``resolve_operation``. Fenced;
        appends ``event``."""
        ...

    def release_run(self, run_id: str, epoch: int, event: HistoryEvent) -> None:
        """Give the run back unfinished (a draining worker): ``pending`` and
        runnable at once, no owner. Fenced; appends ``event``."""
        ...

    def rewind_run(self, run_id: str, epoch: int, rewound: HistoryEvent, released: HistoryEvent) -> None:
        """A logical failure sends the run back to an earlier step: append
        ``rewound`` (a ``run.rewound`` entry whose detail names the cut,
        ``from_position``) and ``released``, void every pending approval
        request at or after the cut (a re-execution asks again under a new
        request id, so a decision on the old one would never be read), and
        give the run back as ``release_run`` does. One fenced transaction."""
        ...

    def finish_run(
        self,
        run_id: str,
        epoch: int,
        event: HistoryEvent,
        status: RunStatus,
        result: Payload | None,
        error: dict[str, Any] | None,
    ) -> None:
        """End the run as ``completed`` (with ``result``) or ``failed`` (with
        ``error``). Fenced; appends ``event``. A parent suspended waiting on
        this run becomes runnable in the same transaction."""
        ...

    def start_child(self, parent_run_id: str, epoch: int, event: HistoryEvent, child: NewRun) -> RunRecord:
        """Append the parent's journal ``event`` and create ``child`` (with
        ``parent_run_id`` set) in one transaction. Fenced on the parent. If
        the child run id exists already it is left unchanged. Returns the
        child's record."""
        ...

    # -- mailboxes: deliveries a run waits for -----------------------------------

    def deliver(
        self, run_id: str, key: str, payload: Payload | None, *, sender: str | None = None,
        dedupe: str | None = None,
    ) -> tuple[Delivery, bool]:
        """Put a message for wait ``key`` (``"signal:NAME"``, ...) into run
        ``run_id``'s mailbox, after every message before it (``seq``), and
        make the run runnable if it is suspended waiting for ``key`` — one
        transaction, durable when it returns. A message delivered before
        the run waits is kept until it is consumed.

        ``dedupe`` (the sender's idempotency key): if the mailbox already
        holds a message with it, that message is returned with ``False`` and
        nothing changes, even if the run has finished since (a sender
        re-executed after a crash learns that its delivery stands);
        otherwise the new one with ``True``. ``sender`` (an
        actor, or ``"run:<id>"``) is recorded with it. Appends nothing to the
        run's history (its holder owns the next ``seq``): the mailbox row is
        the record of the delivery, and the journal entry that consumes it
        names it. Raises ``RunNotFound`` (also for another tenant's run) or
        ``InvalidRunState`` for a terminal run (``lifecycle.check_deliverable``).
        """
        ...

    def deliveries(self, run_id: str, key: str | None = None, after_seq: int = 0) -> list[Delivery]:
        """The messages of run ``run_id``'s mailbox with ``seq > after_seq``
        (for ``key`` only, if given), consumed or not, in order."""
        ...

    def delivery(self, run_id: str, key: str, seq: int | None = None) -> Delivery | None:
        """One message of run ``run_id``'s mailbox for wait key ``key``, one
        row read: message ``seq``, or without it the oldest message no entry
        has taken. What a receive reads (``Execution.next_delivery``): reading
        the key's whole mailbox each time made taking N queued messages
        read N² rows."""
        ...

    def take_delivery(
        self, run_id: str, epoch: int, event: HistoryEvent, seq: int, *, released: int | None = None
    ) -> None:
        """The holder consumes message ``seq``: appends ``event`` (the
        journal entry that records it, at ``event.position``) and marks the
        message taken at that position, in one transaction. Fenced. The
        message must be unconsumed, or consumed at position ``released`` by
        a journal entry that replay no longer reads (a retry or a rewind
        voided it); otherwise ``StoreError`` and nothing is written, so a
        message is never consumed by two live entries."""
        ...

    # -- published events (``ctx.set_event``) ------------------------------------

    def latest_event(self, run_id: str, key: str) -> HistoryEvent | None:
        """The latest ``step.completed`` entry of ``step_kind`` ``"event"``
        named ``key`` in run ``run_id``'s history (what it published last
        under ``key``), or ``None``. One index seek (``history_events``)."""

    # -- approvals: requests a run makes, decisions people take ------------------

    def request_approval(
        self, run_id: str, epoch: int, event: HistoryEvent, request: ApprovalRequest
    ) -> None:
        """The holder records that its run asks for approval: appends
        ``event`` (the journal entry of the request, whose payload holds its
        details) and writes the ``pending`` request row, in one fenced
        transaction. A request already stored under ``request.request_id``
        (made again after a retry voided its entry) keeps its status and
        decision and now points at ``event``."""
        ...

    def expire_approval(self, run_id: str, epoch: int, event: HistoryEvent, request_id: str) -> bool:
        """The holder records that request ``request_id`` timed out: if it
        is still ``pending``, marks it ``expired`` and appends ``event`` (the
        journal entry of the outcome), in one fenced transaction, and
        returns ``True``. If a decision came first, writes nothing and
        returns ``False``: the decision is in the mailbox for the run to take."""
        ...

    def decide_approval(
        self, run_id: str, request_id: str, status: ApprovalStatus, payload: Payload | None,
        comment: str | None, *, actor: str,
    ) -> Approval:
        """A person decides request ``request_id``: ``status`` approved,
        rejected or edited. In one durable transaction the request row
        records the decision (who, when, comment) and the decision is
        delivered into the run's mailbox under ``approval:<request_id>``
        (``payload``: what the run reads, comment and edit included; sender
        ``actor``), which wakes the run if it waits for it. The rules are
        ``lifecycle.check_decision``: ``RunNotFound`` (also another
        tenant's), ``InvalidRunState`` (a finished run), ``ApprovalNotFound``,
        ``ApprovalClosed`` (decided or expired already: a request is decided
        once), ``NotAnApprover``; nothing is stored then. Returns the request
        as it is after the decision. Appends nothing to the run's history (the
        holder owns its next ``seq``): the run records the decision, with its
        decider, when it consumes the message."""
        ...

    def approvals(
        self, *, tenant: str | None = None, run_id: str | None = None, request_id: str | None = None,
        pending: bool = True, limit: int = 1000,
    ) -> list[Approval]:
        """Approval requests, oldest first: with ``pending``, only those
        still open (``pending``, of a run that has not finished); otherwise
        every one, decided, expired and voided included. Filters by tenant, run and
        request id when given."""
        ...

    # -- operator actions (bump the epoch) ------------------------------------

    def cancel_run(self, run_id: str, reason: str, *, actor: str | None = None) -> RunRecord:
        """Cancel the run and every non-terminal descendant.

        Bumps each cancelled run's epoch (fencing out any holder) and appends
        ``run.cancelled`` (detail ``reason``, and ``actor``). A parent suspended waiting on a cancelled run
        becomes runnable. A terminal run is returned unchanged. Raises
        ``RunNotFound``.
        """
        ...

    def retry_run(self, run_id: str, *, actor: str | None = None) -> RunRecord:
        """Make a ``failed`` or ``quarantined`` run ``pending`` again.

        Appends ``run.retried`` whose detail holds ``previous_status``,
        ``actor`` and ``from_position``: the
        position of the last ``step.failed`` entry (or ``None``). Replay
        ignores journal entries at or after that position recorded before the
        retry, so the run resumes from its last good step. Resets
        ``recoveries`` and clears ``error``; bumps the epoch. Raises
        ``RunNotFound`` or ``InvalidRunState``.
        """
        ...

    def resolve_operation(
        self, run_id: str, position: int, done: bool, result: Payload | None, detail: dict[str, Any],
        *, actor: str | None = None,
    ) -> RunRecord:
        """An operator settles the uncertain operation at ``position`` of a
        ``needs_attention`` run, and the run becomes ``pending`` (epoch + 1).

        ``done=True``: the effect happened; a ``step.completed`` entry at
        ``position`` records ``result`` (detail ``{"resolved_by": "operator",
        **detail, "actor"}``), so replay returns it without executing.
        ``done=False``: an ``op.resolved`` entry (detail ``{"position",
        "done": False, **detail, "actor"}``) tells replay to execute again with the same operation id.
        Raises ``RunNotFound``, or ``InvalidRunState`` if the run does not
        need attention.
        """
        ...

    def kill_runs(
        self, reason: str, *, run_id: str | None = None, tenant: str | None = None, actor: str | None = None
    ) -> list[RunRecord]:
        """The kill switch: every non-terminal run matching ``run_id`` (with
        its descendants) or ``tenant`` becomes ``killed`` with epoch + 1, so
        no holder can write again; appends ``run.killed`` (detail ``reason``,
        and ``actor``). Returns the killed
        runs. Exactly one of ``run_id`` / ``tenant`` must be given; an unknown
        ``run_id`` raises ``RunNotFound``.
        """
        ...

    def revive_run(self, run_id: str, *, actor: str | None = None) -> RunRecord:
        """Make a ``killed`` or ``halted`` run ``pending`` again (epoch + 1),
        appending ``run.revived`` (detail ``previous_status``, and
        ``actor``); it resumes where it stopped. Raises
        ``RunNotFound`` or ``InvalidRunState``."""
        ...

    def set_budget(self, run_id: str, budget: dict[str, Any], *, actor: str | None = None) -> RunRecord:
        """Replace the run's budget limits; appends ``run.budget_changed``
        (detail ``budget``, and ``actor``). A
        run ``suspended`` with neither a timer nor a child to wait for (a
        budget suspension) becomes runnable at once. Raises ``RunNotFound``,
        or ``InvalidRunState`` for a ``running`` run (its holder owns its
        history and read its limits when it claimed it)."""
        ...

    def halt_run(self, run_id: str, epoch: int, event: HistoryEvent, error: dict[str, Any]) -> None:
        """Stop the run at once after a security failure: ``halted`` with
        ``error``, lease revoked (epoch + 1). Fenced on ``epoch``; appends
        ``event``. Only ``revive_run`` brings it back."""
        ...

    # -- bundles (cairn.engine.bundles) ------------------------------------------

    def put_bundles(self, bundles: Collection[BundleRecord]) -> None:
        """Store each bundle unless one with its id exists (an id is its
        content's hash: the stored one is the same bundle). Tenant-agnostic."""
        ...

    def bundles(self, workflows: Collection[str] | None = None) -> list[BundleRecord]:
        """The stored bundles of ``workflows`` (``None``: all), by workflow
        then age. The reader checks each against its id."""
        ...

    def serve_bundles(self, bundle_ids: Collection[str]) -> None:
        """A worker serving these bundles says so: ``served_at`` = now."""
        ...

    def run_counts(self) -> list[tuple[str, str, str, int]]:
        """``(tenant, workflow, status, runs)`` for every combination with
        runs this store may see (a tenant's own, under row-level security)."""
        ...

    def bundle_counts(self) -> list[tuple[str | None, str, str, str, int]]:
        """``(bundle, workflow, version, status, runs)`` for every bundle
        and status with runs this store may see (a tenant's own, under
        row-level security)."""
        ...

    def migrate_run(
        self, run_id: str, bundle: BundleRecord, detail: dict[str, Any], *, actor: str | None = None,
        checked_seq: int | None = None,
    ) -> RunRecord:
        """An operator moves run ``run_id`` to ``bundle`` (of its workflow):
        its journal stays, ``run.migrated`` records the old and new bundle,
        ``detail`` and the actor (``lifecycle.migrate`` decides). Raises
        ``RunNotFound`` or ``InvalidRunState`` (a running, completed or
        cancelled run; with ``checked_seq``, a run whose history no longer
        ends at that seq: the replay check that allowed the move saw a
        shorter journal, decided in the same transaction as the move)."""
        ...

    # -- retention -------------------------------------------------------------

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
        """Delete finished runs last changed before ``older_than`` (a time
        of the store's clock), with their histories; return how many runs
        were deleted. The one path that deletes runs: ``cairn prune`` and
        the retention controller both come here.

        ``older_than`` may be a retention policy's ``Cutoffs`` (class
        ``history``): each run is then due by the policy of its own tenant
        and workflow, and a tree goes when every member is due.
        ``fence``: the retention controller's lease (``RetentionFenced`` and
        nothing deleted unless it still holds it, checked in the deleting
        transaction). Each deleted run leaves a record (``deleted_runs``:
        tenant, workflow, last entry and its audit link, when, and
        ``actor``), written in the same transaction; its run memory goes
        with it (a trigger), and the artifacts it referenced are queued
        for collection. ``into``: a list the ids of the deleted runs are
        appended to (the pass that reports what it deleted). ``record=False``:
        no deletion record (an erasure, whose own record keeps the deleted
        runs' keyed digests and nothing that could name its subject).

        Runs go in whole trees. A *root* (a run without a parent, or whose
        parent no longer exists) is pruned together with all its descendants,
        and only if every run of that tree has one of ``statuses`` (default
        ``DEFAULT_PRUNE_STATUSES``) and ``updated_at < older_than``. So a
        non-terminal run is never deleted, nor a run whose parent or any
        other member of its tree is still live or recent, and no run is ever
        left behind pointing to a deleted parent. ``statuses`` may name only
        terminal statuses (``ValueError`` otherwise).

        One call deletes about ``limit`` runs (at least 1, else
        ``ValueError``): whole trees, oldest root first, stopping before a
        tree that would exceed the limit, except that the first tree is
        always taken. Call again until it returns 0. ``dry_run=True``
        changes nothing and returns how many runs the call would delete.

        Artifacts: each artifact a pruned run referenced is queued for
        collection, and deleted once no remaining run or history entry
        references it and it was last stored before both ``older_than`` and
        ``ARTIFACT_GRACE_SECONDS`` ago (storing the same bytes again counts
        as storing it); until then it stays queued. Every call, including one
        that deletes no run, collects what is ready in the queue (with
        ``Cutoffs``: what was stored before ``ARTIFACT_GRACE_SECONDS`` ago).

        ``roots``: only trees whose root is one of these runs (an erasure's,
        ``cairn.api.erasure``). ``grace=False``: artifacts go once last
        stored before ``older_than``, without ``ARTIFACT_GRACE_SECONDS`` (an
        erasure must not leave the subject's artifacts for a later call).
        """
        ...

    def prunable_runs(
        self, older_than: float | Cutoffs, statuses: Collection[RunStatus] | None = None, limit: int = 1000,
        *, roots: Collection[str] | None = None,
    ) -> list[str]:
        """The runs ``prune_runs`` with these arguments would delete now (the dry run)."""
        ...

    # -- retention policies and their controller (store.retentionsql) ---------------------

    def retention_policies(self, tenant: str | None = None) -> list[Policy]:
        """The policies of ``tenant`` and the installation's (``*``); ``None``:
        every one this store may read (a tenant's role: its own and ``*``)."""
        ...

    def set_retention_policy(self, policy: Policy, actor: str) -> Policy:
        """Store ``policy`` as set by ``actor`` unless the policies after it
        fail ``retention.check`` (``InvalidArgument``, nothing stored)."""
        ...

    def remove_retention_policy(self, tenant: str, workflow: str, cls: DataClass) -> bool:
        """Remove the policy of that scope (checked like a change); false: none."""
        ...

    def take_retention_lease(self, holder: str, seconds: float, held: int | None = None) -> int | None:
        """Renew or take the controller's lease; its epoch, ``None``: held by another."""
        ...

    def retention_due(self, cutoffs: Cutoffs, limit: int | None = None) -> list[Key]:
        """The rows of ``cutoffs``'s class (not ``history``) due now, in key order."""
        ...

    def retention_delete(self, cutoffs: Cutoffs, keys: Sequence[Key], fence: Fence | None) -> list[Key]:
        """Delete (bodies: expire) those of ``keys`` still due, fenced; the keys that went."""
        ...

    def deleted_runs(self, tenant: str | None = None) -> list[DeletedRun]:
        """The records of deleted runs, oldest first."""
        ...

    # -- erasure (cairn.api.erasure) ---------------------------------------------

    def subject_digest(self, tenant: str, subject: str) -> str:
        """What the store records for ``subject`` of ``tenant`` instead of it:
        a keyed digest under encryption (the tenant's key), SHA-256 without."""
        ...

    def shred(self, tenant: str, digest: str | None) -> list[int]:
        """Destroy the data keys of the subject of ``digest`` (``None``: of
        every subject of ``tenant``): crypto-shredding, so its values cannot
        be read from this database nor any copy of it. The key versions
        destroyed (none without encryption). Idempotent."""
        ...

    def erasure_runs(self, tenant: str, subject: str | None, thread_id: str | None
                     ) -> list[tuple[str, str, str | None]]:
        """``(run_id, status, parent_run_id)`` of ``tenant``'s runs of
        ``subject``, of ``thread_id``, or (both ``None``) all of them."""
        ...

    def count_subject_memory(self, tenant: str, subject: str) -> int:
        """How many rows ``delete_subject_memory`` would delete now (a dry run)."""
        ...

    def delete_subject_memory(self, tenant: str, subject: str) -> int:
        """Delete ``tenant``'s memory items and thread messages of ``subject``
        with their outbox rows, vectors and cold copies, in one transaction;
        offloaded values are queued for collection. Rows deleted."""
        ...

    def start_erasure(self, record: ErasureRecord) -> None:
        """Record an erasure as started (no personal data: ``ErasureRecord``)."""
        ...

    def finish_erasure(self, erasure_id: str, counts: Mapping[str, int], actor: str, *, tenant: str) -> None:
        """Record erasure ``erasure_id`` of ``tenant`` as completed, with its counts."""
        ...

    def note_erased_runs(self, erasure_id: str, digests: Collection[str]) -> None:
        """Record the digests (``run_digest``) of the runs an erasure deletes."""
        ...

    def erased_runs(self, tenant: str | None = None) -> dict[str, set[str]]:
        """tenant -> the digests of the runs its erasures deleted."""
        ...

    def erasures(self, tenant: str | None = None, *, unfinished: tuple[str, str] | None = None,
                 limit: int = 100) -> list[ErasureRecord]:
        """The erasure records, newest first (of ``tenant``; only the
        unfinished ones of ``unfinished`` = (scope, digest))."""
        ...

    def reclaim_space(self) -> dict[str, Any]:
        """Physically remove deleted rows' bytes (after an erasure): SQLite
        rewrites the database (``VACUUM``) with ``secure_delete`` on and
        truncates its WAL; PostgreSQL vacuums the tables that hold run data.
        What was done, for the erasure's report."""
        ...

    # -- tiers: archived runs (store.archivesql) ----------------------------------

    def archive_run(self, run_id: str, *, actor: str | None = None) -> ArchiveRecord:
        """Move closed run ``run_id``'s rows (history, mailbox, approvals,
        run memory) out of the hot tables into one compressed archive object
        in the artifact store (sealed, bound to tenant and run, when
        encryption is on); the run row stays. Fenced: ``InvalidRunState`` if
        the run is not closed, is archived already, or changed while being
        archived; a crash leaves it hot or archived, never both or neither.
        Until restored, the database refuses every change to the run, and
        the reads of its rows (history, mailbox, approvals of the run, run
        memory) answer from the archive. ``actor`` is recorded in the
        archive record and, with the move, in the tenant's operator log
        (``archive.move``)."""
        ...

    def restore_run(self, run_id: str, *, actor: str | None = None) -> ArchiveRecord:
        """Put archived run ``run_id``'s rows back, bit for bit; its record
        is returned with ``restored_by`` (``actor``) and ``restored_at``,
        which the tenant's operator log keeps (``archive.restore``, written in
        the restore's transaction). ``InvalidRunState`` if it is not archived,
        ``ArchiveError`` (naming the run) if its object is damaged or another's."""
        ...

    def run_archive(self, run_id: str) -> ArchiveRecord | None:
        """Run ``run_id``'s archive record; ``None`` while it is hot."""
        ...

    def archivable_runs(self, older_than: float, *, tenant: str | None = None, limit: int = 1000
                        ) -> list[str]:
        """Closed, hot runs last changed before ``older_than`` (store clock), oldest first."""
        ...

    # -- payloads too large to keep inline -------------------------------------

    def put_artifact(self, data: bytes) -> str:
        """Store ``data`` content-addressed; return its reference. Idempotent;
        durable as a commit of the store's mode before it returns (so a
        journal entry may point to it); an ``append`` with ``barrier=True``
        makes the artifacts its entries reference as durable as the entries.
        Stored bytes that no longer match their reference are rewritten, never
        trusted.

        New bytes are queued for collection (see ``prune_runs``) as they are
        stored: if the writer dies before recording the entry that points to
        them, nothing will ever reference them, and pruning deletes them like
        the artifacts of pruned runs."""
        ...

    def get_artifact(self, ref: str) -> bytes:
        """The bytes stored under ``ref``; ``PayloadError`` if absent, or if
        they no longer hash to ``ref`` (damaged or edited: never returned)."""
        ...

    # Artifacts stored under a name their writer chose: a sealed store's keyed
    # address (``cairn.store.sealedartifacts``), which survives re-encryption.
    # The store does not check such bytes against their name; the envelope,
    # bound to the name, is what authenticates them.

    def put_artifact_at(self, ref: str, data: bytes) -> None:
        """Store ``data`` as artifact ``ref`` (64 lower hex digits, else
        ``PayloadError``) unless bytes are stored under that name already:
        those are kept, and only when they were last stored is refreshed (so
        one writer cannot overwrite another's). Durable and queued for
        collection as ``put_artifact``."""
        ...

    def read_artifact(self, ref: str) -> bytes:
        """The bytes stored under ``ref``, unchecked; ``PayloadError`` if absent."""
        ...

    def replace_artifact(self, ref: str, old: bytes, new: bytes) -> bool:
        """Compare-and-set: ``ref``'s bytes become ``new`` if they are still
        ``old`` (``False``: changed or collected since they were read).
        When they were last stored is kept. Re-encryption's; on PostgreSQL
        the owner's role only (``StoreError`` for a tenant's)."""
        ...

    # -- workspace objects (store.wssql, cairn.workspace) ------------------------------

    def put_workspace_objects(self, run_id: str, epoch: int, objects: Mapping[str, bytes]) -> None:
        """Store workspace ``objects`` (``{id: stored bytes}``, ids 64 lower
        hex digits, else ``InvalidArgument``) for run ``run_id``'s tenant,
        read from the run row, keeping any already stored. A holder write:
        ``LeaseLost`` and nothing stored unless the caller holds the run at
        ``epoch``. Durable as a commit of the store's mode before it returns,
        so the entry recorded next may name them."""
        ...

    def workspace_objects(self, tenant: str, oids: Collection[str]) -> dict[str, bytes]:
        """The stored bytes of those of ``oids`` that ``tenant`` has (another
        tenant's identical object is not one of them). Not checked here:
        ``cairn.workspace`` checks each against its id before using it."""
        ...

    def workspace_tenants(self) -> list[str]:
        """The tenants that have workspace objects."""
        ...

    def workspace_roots(self, tenant: str) -> set[str]:
        """The snapshot root ids the journal entries of ``tenant``'s existing
        runs record (``detail["workspace"]``), whatever those entries'
        standing. ``WorkspaceError`` if any of those details is sealed and
        this store cannot open it (no keyring: the roots cannot be read, so
        nothing may be collected); a sealed store opens them, and a detail
        that does not open stops the collection (``SealError``)."""
        ...

    def workspace_plain_roots(self, tenant: str) -> set[str]:
        """The roots ``workspace_roots`` reads from details that are not
        sealed, ignoring sealed ones (a sealed store opens those itself)."""
        ...

    def workspace_sealed_entries(self, tenant: str) -> list[tuple[str, int]]:
        """``(run_id, seq)`` of every journal entry of ``tenant``'s existing
        runs whose detail is sealed, in order (a sealed store opens them to
        read their snapshot roots)."""
        ...

    def workspace_keys(self, tenant: str, oids: Collection[str]) -> set[str]:
        """What ``workspace_candidates`` may list for objects ``oids``: the
        ids themselves, and under encryption also their keyed addresses
        (``store.wssealed``), so a collection compares like with like."""
        ...

    def workspace_candidates(self, tenant: str, before: float, after: str = "", limit: int = 1000
                             ) -> list[str]:
        """Up to ``limit`` ids of ``tenant``'s objects last stored before
        ``before`` (a time of the store's clock), greater than ``after``, in
        order (a collection pages through them)."""
        ...

    def delete_workspace_objects(self, tenant: str, oids: Collection[str], before: float) -> int:
        """Delete those of ``tenant``'s objects ``oids`` that were last stored
        before ``before``, in one transaction; how many went. An object
        stored again since (``put_workspace_objects`` moves its time) stays."""
        ...

    # -- memory tiers (store.memsql): run, thread and long-term memory ---------------

    def append_memory(
        self, run_id: str, epoch: int, events: Sequence[HistoryEvent], writes: Sequence[MemoryWrite],
        provenance: Provenance,
    ) -> None:
        """``append`` (fenced, same rules) and apply ``writes`` in the same
        transaction: a step's memory writes commit with its journal entry or
        not at all, and a stale holder (``LeaseLost``) writes nothing. The
        writes take the run's tenant (read from the run row, never the
        caller's) and ``provenance`` (the run, position, operation id)."""
        ...

    def write_memory(self, tenant: str, writes: Sequence[MemoryWrite], provenance: Provenance) -> None:
        """Apply ``writes`` for ``tenant`` in one transaction, outside any
        run's journal (an operator: ``provenance.actor``). Run memory needs
        ``provenance.run_id``, a run of that tenant (``InvalidArgument``
        otherwise). A compaction beyond the thread's end is ``InvalidArgument``."""
        ...

    def memory_item(
        self, tenant: str, namespace: str, key: str, *, refresh: bool = False
    ) -> MemoryItem | None:
        """The live item (``None``: absent or expired). ``refresh=True``
        renews its expiry to ``ttl`` from now (a refresh-on-read policy)."""
        ...

    def memory_items(
        self, tenant: str | None, prefix: str = "", *, run_id: str | None = None, limit: int = 100
    ) -> list[MemoryItem]:
        """Live items under the stored namespace ``prefix`` (of ``tenant``;
        ``None``: every tenant the store may see), optionally only those
        written by ``run_id``, ordered by (tenant, namespace, key)."""
        ...

    def thread_messages(
        self, tenant: str, thread_id: str, *, after: int = -1, last: int | None = None,
        limit: int = 1000, refresh: bool = False,
    ) -> list[ThreadMessage]:
        """The messages of a live thread in order: those after index
        ``after`` (at most ``limit``), or the ``last`` ones. ``refresh``
        renews the thread's expiry."""
        ...

    def memory_threads(self, tenant: str | None, *, limit: int = 100) -> list[dict[str, Any]]:
        """The live threads (of ``tenant``): id, messages written, times."""
        ...

    def run_memory(
        self, run_id: str, key: str | None = None, *, tenant: str | None = None
    ) -> list[RunMemory]:
        """The run's memory keys (only ``key``; only if of ``tenant``)."""
        ...

    def delete_memory(self, scope: MemoryScope) -> int:
        """Delete what ``scope`` covers, in one transaction: one item, a
        namespace prefix, a thread, everything a run wrote (its run memory,
        its thread messages and items), or all of a tenant's memory, with
        the items' outbox rows and vectors; offloaded values are queued for
        collection (``prune_runs`` deletes them). Returns how many rows
        (items, messages, run keys) went."""
        ...

    def sweep_memory(self, limit: int = 1000) -> int:
        """Delete expired memory (about ``limit`` items, and every expired
        thread); expired rows are invisible already. Returns rows deleted."""
        ...

    # -- the cold tier of item values (store.memsql, store.coldvalues) -----------------------

    def tier_items(self, idle_seconds: float, *, limit: int = 1000) -> ItemTierMove:
        """Move the values of up to ``limit`` items unread and unwritten for
        ``idle_seconds`` to the cold tier (compressed, out of the hot row),
        and up to ``limit`` cold ones touched since back, in one transaction
        (idempotent: every item stays hot or cold, never lost). Reads of a
        cold item restore its value (read-through), or raise ``PayloadError``
        if its cold copy is damaged."""
        ...

    def item_tiers(self, tenant: str | None = None) -> list[ItemTierUsage]:
        """Items and the bytes of their values per tier."""
        ...

    # -- the HTTP API (cairn.server): tokens and a tenant's run changes ----------------------

    def create_token(self, token: TokenRecord) -> None:
        """Store a new API token (its id must be new: ``InvalidArgument`` otherwise)."""
        ...

    def get_token(self, token_id: str) -> TokenRecord | None:
        """The token with this id, revoked or not."""
        ...

    def list_tokens(self, tenant: str | None = None) -> list[TokenRecord]:
        """Every token (of ``tenant``), revoked ones included."""
        ...

    def revoke_token(self, token_id: str) -> bool:
        """Refuse the token from now on; false when it was unknown or revoked already."""
        ...

    def runs_changed(
        self, tenant: str, after: tuple[float, str], until: float, limit: int = 100
    ) -> list[RunRecord]:
        """The tenant's runs whose last change ``(updated_at, run_id)`` comes
        after the cursor ``after`` and no later than ``until``, in that
        order: the cursor of the tenant-wide event stream."""
        ...

    # -- semantic memory: the vector index (store.vectorindex) -----------------------------

    def search_memory(
        self, tenant: str, namespace_prefix: str, vector: Sequence[float], k: int,
        filter: Mapping[str, Scalar] | None = None, *, embedder: str | None = None,
    ) -> MemorySearch:
        """The ``k`` nearest items by cosine among ``tenant``'s vectors by
        ``embedder`` under ``namespace_prefix`` (encoded) whose metadata
        equals ``filter`` on every key (applied before the top-``k`` cut),
        and how many items in scope wait for their vector (``unindexed``)."""
        ...

    def claim_embeddings(self, worker: str, limit: int, lease_seconds: float) -> EmbeddingClaim:
        """Lease up to ``limit`` ready outbox rows (one task per item)."""
        ...

    def store_embeddings(
        self, token: str, embedder: str, dims: int, results: Sequence[tuple[EmbeddingTask, Sequence[float]]]
    ) -> int:
        """Store the tasks' vectors, fenced by the claim ``token``; how many were stored."""
        ...

    def fail_embeddings(self, token: str, failures: Sequence[tuple[EmbeddingTask, str, float]]) -> None:
        """Record ``(task, error, delay)``: its rows are ready again after ``delay`` seconds."""
        ...

    def tier_vectors(self, idle_seconds: float, *, limit: int = 1000) -> TierMove:
        """Cool vectors of items idle for ``idle_seconds``; queue cold ones touched since."""
        ...

    def vector_tiers(self, tenant: str | None = None) -> list[TierUsage]:
        """Vectors and bytes per tier."""
        ...

    def close(self) -> None:
        """Release connections and files. The store is unusable afterwards."""
        ...


__all__ = [
    "ARTIFACT_GRACE_SECONDS",
    "DEFAULT_PRUNE_STATUSES",
    "Migratable",
    "Notifier",
    "Store",
]
