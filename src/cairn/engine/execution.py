"""One execution of a claimed run: the journal cursor and every fenced write.

An ``Execution`` lives from a claim to the end of that claim (completion,
failure, suspension, release, or loss of the lease). All writes for the run
go through it, each fenced on the claim's epoch and numbered with the next
history ``seq``; the counter only advances once a write is durable, so a
failed write never leaves a gap.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import hashlib
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from cairn.codec import schemas, values
from cairn.engine import signals
from cairn.engine.budget import Budget
from cairn.engine.definitions import WorkflowDef
from cairn.engine.journal import Journal
from cairn.engine.runtime import Runtime
from cairn.engine.signals import Abandon, Ended, Release, Suspend
from cairn.engine.startedwith import inherited
from cairn.errors import (
    ChildFailed,
    IncompatiblePayload,
    LogicalFailure,
    NonDeterminismError,
    PayloadError,
    StepFailed,
    StoreError,
    TransactionMisuse,
)
from cairn.retry import NO_RETRY, RetryPolicy
from cairn.security import redaction
from cairn.store.memrecords import MemoryWrite, Provenance
from cairn.store.records import (
    ApprovalRequest,
    Claim,
    Delivery,
    EventType,
    HistoryEvent,
    NewRun,
    Payload,
    RunRecord,
    RunStatus,
)

if TYPE_CHECKING:
    from cairn.store.transactions import Tx

R = TypeVar("R")

#: The execution whose workflow code is running in this context.
CURRENT: contextvars.ContextVar[Execution] = contextvars.ContextVar("cairn_execution")


def _note_suspension(signal: Suspend) -> None:
    """A suspension is being made: the execution of this context is suspending."""
    execution = CURRENT.get(None)
    if execution is not None:
        execution.suspending(signal)


def _flow() -> tuple[int, int | None]:
    """The thread, and the asyncio task if any, a call is made from."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop in this thread
        task = None
    return threading.get_ident(), None if task is None else id(task)


signals.on_suspend = _note_suspension

#: the execution whose transactional step's body runs in this context. A
#: context variable, not a thread id: a thread the body starts with its
#: context (``copy_context().run``, ``asyncio.to_thread``) is inside the body
#: too, and must be refused, not left waiting for the lock the body holds.
_TRANSACTING: contextvars.ContextVar[Execution | None] = contextvars.ContextVar(
    "cairn_transacting", default=None)

_OPERATION_NS = uuid.UUID("6f1d3c2e-8a4b-4c7d-9e0f-0c41a1b2c3d4").bytes


def operation_id(run_id: str, position: int, generation: int = 0) -> str:
    """The idempotency key of the journaled call at ``position`` of ``run_id``.

    Derived, not generated: it is the same on every attempt, after every crash
    and on every worker, so an external system can deduplicate with it. It is
    ``uuid5(namespace, run_id + NUL + position)``, computed without building
    ``UUID`` objects (a third of the cost, and this runs on every tool call).

    ``generation`` counts the logical rewinds that voided this position
    (``Journal.generation``): a call re-executed after a rewind is a new
    intended effect (often with new arguments), so it gets a new key, or a
    bank deduplicating by key would drop it and hand back the old receipt.
    Generation 0 (a run that never rewound past here) keeps the original
    derivation, so existing journals and keys are unchanged.
    """
    return _uuid5_text(run_prefix(run_id), position, generation)


def scoped_hash(scope: str, input_hash: str | None) -> str:
    """The input hash of a call made in ``scope`` (``Execution.scope``): the
    scope and the call's own hash together, so a sibling call that is not
    made again after a crash (its task finished) is never taken for one
    that is (``_allocate`` matches a sibling's record by kind, name and hash)."""
    return hashlib.blake2b(f"{scope}\x00{input_hash or ''}".encode(), digest_size=8).hexdigest()


def run_prefix(run_id: str) -> Any:
    """The SHA-1 state of the operation ids of ``run_id`` up to the position
    (namespace, run id, NUL): an ``Execution`` hashes it once per claim and
    copies it for each call, instead of hashing the namespace and the run id
    again on every tool call (``Execution.operation_id``)."""
    return hashlib.sha1(_OPERATION_NS + f"{run_id}\x00".encode())


def _uuid5_text(prefix: Any, position: int, generation: int) -> str:
    """The uuid5 text of ``prefix`` (``run_prefix``) followed by the position
    (and the generation, when not 0): the derivation ``operation_id`` documents."""
    h = prefix.copy()
    h.update((f"{position}" if not generation else f"{position}\x00{generation}").encode())
    raw = bytearray(h.digest()[:16])
    raw[6] = (raw[6] & 0x0F) | 0x50  # version 5
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    text = raw.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


#: Failures of the database itself (not of the workflow): the execution is
#: abandoned, never recorded as the run's failure; the lease expires and the
#: run is taken over, replaying what was recorded.
INFRASTRUCTURE_ERRORS: tuple[type[BaseException], ...] = (StoreError, OSError)


def error_detail(exc: BaseException, **extra: Any) -> dict[str, Any]:
    """A recorded error. Its message is user text that may quote a revealed
    secret (an HTTP error echoing its ``Authorization`` header): masked."""
    detail: dict[str, Any] = {"type": type(exc).__qualname__, "message": redaction.redact(str(exc))}
    detail.update(extra)
    return detail


@dataclass(slots=True)
class Call:
    """A journaled call in progress: where it is and what replay knows of it."""

    position: int
    kind: str
    name: str
    input_hash: str | None
    recorded: HistoryEvent | None
    attempt: int = 1
    started_at: float = field(default_factory=time.time)


class Execution:
    """The cursor over a run's journal, and the only writer for the claim.

    Several tasks or threads of one run may make journaled calls at once
    (``asyncio.gather``, ``asyncio.to_thread``, a thread pool): position
    allocation, history appends and the journal are guarded by one lock, so
    no two calls share a position or a ``seq``. Calls in flight are counted
    (``enter``/``leave``, by the drivers of ``engine.drive``) so that the end
    of the execution can wait for them: the claim is never given up (suspended,
    released, finished) while a sibling's step body or tool may still run and
    record, since the next execution would run or reconcile it a second time.
    """

    def __init__(self, runtime: Runtime, claim: Claim, worker: str, *, is_async: bool = False) -> None:
        self.runtime = runtime
        self.is_async = is_async
        self.store = runtime.store
        self.run = claim.run
        self.run_id = claim.run.run_id
        self.epoch = claim.run.epoch
        self.worker = worker
        self.journal = Journal(claim.history)
        self.budget = Budget.from_dict(claim.run.budget)
        self.seq = claim.next_seq
        #: one past the highest position handed out
        self.position = 0
        #: the lowest position not handed out yet, and those above it that are
        #: (handed out out of order to a concurrent call that matched their record)
        self._lowest = 0
        self._taken: set[int] = set()
        self._lock = threading.RLock()
        self._settled = threading.Condition(self._lock)
        #: journaled calls whose driver is running (user code may be executing)
        self._in_flight = 0
        self._stragglers: set[concurrent.futures.Future[Any]] = set()
        #: set when the main flow has stopped: no new journaled call may start
        self._ending = False
        #: set once every call in flight has settled: nothing may be appended
        self._closed = False
        #: where the workflow's own code runs; any other thread or task is a sibling
        self.main_thread = threading.get_ident()
        self.main_task: asyncio.Task[Any] | None = None
        #: set from other threads (heartbeat, drain, cancel); checked at each boundary
        self.stop_reason: str | None = None
        #: the suspension this execution began (its first): raised again by the
        #: workflow returning, and by every later journaled call of the flow (thread,
        #: task) it was made in, so workflow code that swallowed it (a bare
        #: ``except:``) cannot go on past the wait. A sibling flow (a thread or task
        #: of the workflow) goes on as before until the workflow joins it.
        self.suspension: Suspend | None = None
        self._suspended: dict[tuple[int, int | None], Suspend] = {}
        #: memory writes buffered by step and tool bodies (``op.memory``), by
        #: position: (attempt, writes); committed with that call's outcome
        self.memory_buffers: dict[int, tuple[int, list[MemoryWrite]]] = {}
        #: the run's workspace on this worker (``engine.workspace.RunWorkspace``),
        #: once the run uses one; ``workspace_checked``: its journal was looked at
        self.workspace: Any = None
        self.workspace_checked = False
        #: the SHA-1 state of this run's operation ids before the position
        #: (``run_prefix``), hashed at the first call that needs an id
        self._op_prefix: Any = None
        #: where a call is made, when not by its order alone: a function that
        #: names the caller's scope (``None``: the run's own order). A call
        #: inside a scope is matched to its record by scope and arguments, not
        #: by position (``scoped_hash``): ``cairn.lgdurable`` names a LangGraph
        #: task, whose finished siblings are never run again after a crash.
        self.scope: Callable[[], str | None] | None = None

    def operation_id(self, position: int) -> str:
        """``operation_id(run_id, position, generation)`` of this run, from
        the run's hashed prefix (the same key, in about two thirds of the time)."""
        prefix = self._op_prefix
        if prefix is None:
            prefix = self._op_prefix = run_prefix(self.run_id)
        return _uuid5_text(prefix, position, self.journal.generation(position))

    # -- history -------------------------------------------------------------

    def entry(self, event: EventType, **fields: Any) -> HistoryEvent:
        return HistoryEvent(
            run_id=self.run_id, seq=self.seq, event=event, at=time.time(), epoch=self.epoch,
            worker=self.worker, **fields,
        )

    def start_child(
        self, call: Call, definition: WorkflowDef, arguments: Any, child_id: str, *, queue: str,
        priority: int,
    ) -> None:
        """Record the start of child run ``child_id`` as the outcome of
        ``call`` and create the child, in one fenced transaction (so a crash
        leaves both or neither, and replay never starts a second child)."""
        payloads = self.runtime.payloads
        input_payload, _ = payloads.dump(arguments)
        result_payload, _ = payloads.dump(child_id)
        event = self.entry(
            EventType.STEP_COMPLETED, position=call.position, step_kind="child", name=definition.name,
            input_hash=call.input_hash, attempt=1, started_at=call.started_at, payload=result_payload,
        )
        run = self.run
        try:  # the child pins its own workflow's bundle (stored once per process)
            bundle = self.runtime.registry.child_bundle(definition, self.store)
        except INFRASTRUCTURE_ERRORS as exc:
            raise Abandon(f"cannot store the bundle of child run {child_id}: {exc}") from exc
        parent = inherited(self)  # a child has its parent's rights, no more, no fewer
        child = NewRun(
            run_id=child_id, workflow=definition.name, workflow_version=definition.version,
            tenant=run.tenant, thread_id=run.thread_id, input=input_payload, parent_run_id=self.run_id,
            queue=queue, priority=priority, bundle=bundle,
            started_role=parent.role, started_token=parent.token,
            subject=self.store.run_subject(self.run_id),  # whose data the parent's is, the child's is
            started_by={"actor": f"run:{self.run_id}", "auth": "parent-run", "tenant": run.tenant},
        )
        self._commit_entries(f"the start of child run {child_id}", (event,), lambda entries: (
            self.store.start_child(self.run_id, self.epoch, entries[0], child)))

    def child_failed(self, call: Call, child: RunRecord) -> NoReturn:
        """Record that the child run awaited by ``call`` ended without a
        result, and raise ``ChildFailed`` (replay raises it again from the record)."""
        message = (child.error or {}).get("message", child.status.value)
        self.append(self.entry(
            EventType.STEP_FAILED, position=call.position, step_kind="wait", name=child.run_id,
            attempt=1, started_at=call.started_at,
            detail={"error": {"type": "ChildFailed", "status": child.status.value, "message": message}},
        ))
        raise ChildFailed(child.run_id, child.status.value, message)

    def append(self, event: HistoryEvent, *, barrier: bool = False) -> None:
        """Append one entry, fenced; ``barrier`` makes it (and all before it)
        durable on stable storage before returning (the effect barrier).

        The entry takes the next ``seq`` under the lock (an entry built by
        another thread in between is renumbered), so concurrent calls of one
        run never collide on a ``seq`` (the store would take that for a
        second writer and report the lease lost)."""
        self._commit_entries(event.event, (event,), lambda entries: (
            self.store.append(self.run_id, self.epoch, entries, barrier=barrier)))

    # -- the commit path: how entries reach the run's history -----------------------

    def _commit(self, what: str, write: Callable[[int], tuple[Sequence[HistoryEvent], R]], *,
                ending: bool = False) -> R:
        """The one way this execution writes to its run's history (the
        step's outcome has a fast path beside it, ``record_outcome``).

        Under the lock, so that the entries take the next ``seq`` and no
        other call of the run writes in between: refused with ``Ended``
        once the execution is closed (``ending``: a write that ends the
        claim, made after ``close``); ``write(seq)`` makes the one store
        call, fenced on the claim's epoch, for entries numbered from ``seq``,
        and returns the entries it committed (none: nothing was written)
        and its result. A failure of the database abandons the execution
        (``INFRASTRUCTURE_ERRORS``); the counter advances and the journal
        takes the entries only once they are durable, so a failed write
        leaves no gap. ``what`` names the write in both errors."""
        with self._lock:
            if self._closed and not ending:
                raise Ended(f"run {self.run_id}: the execution has ended; {what} not recorded")
            try:
                entries, result = write(self.seq)
            except INFRASTRUCTURE_ERRORS as exc:
                raise Abandon(f"cannot record {what} of run {self.run_id}: {exc}") from exc
            self.seq += len(entries)
            for entry in entries:
                self.journal.record(entry)
            return result

    def _commit_entries(self, what: str, entries: tuple[HistoryEvent, ...],
                        write: Callable[[tuple[HistoryEvent, ...]], R], *, ending: bool = False,
                        unless: Callable[[R], bool] | None = None) -> R:
        """``_commit`` of ``entries`` built beforehand (by ``entry``, maybe on
        another thread meanwhile): renumbered from the next ``seq`` and
        handed to ``write``, the store call; ``unless(result)``: the store
        did not write them (``expire_approval``: a decision came first)."""
        def numbered(seq: int) -> tuple[tuple[HistoryEvent, ...], R]:
            stamped = tuple(e if e.seq == seq + i else dataclasses.replace(e, seq=seq + i)
                            for i, e in enumerate(entries))
            result = write(stamped)
            return (() if unless is not None and unless(result) else stamped), result
        return self._commit(what, numbered, ending=ending)

    # -- calls in flight -------------------------------------------------------------

    def enter(self) -> None:
        """A driver starts a journaled call (see ``engine.drive``); refused
        with ``Ended`` once the execution is ending."""
        if _TRANSACTING.get() is self:  # before the lock, which the body's transaction holds
            raise TransactionMisuse("a journaled call started in a thread of a transactional step's body: "
                                    "it cannot run inside the step's own transaction")
        with self._lock:
            if self._ending:
                raise Ended(f"run {self.run_id}: the execution has ended; no new call may start")
            self._in_flight += 1

    def leave(self) -> None:
        with self._lock:
            self._in_flight -= 1
            if self._in_flight == 0 and self._ending:  # only an ending execution waits
                self._settled.notify_all()

    def straggle(self, future: concurrent.futures.Future[Any]) -> None:
        """A call that timed out goes on in its thread (``future``): it stays
        in flight until it returns, even if the execution is ending."""
        with self._lock:
            self._in_flight += 1
            self._stragglers.add(future)

        def done(_: concurrent.futures.Future[Any]) -> None:
            with self._lock:
                self._stragglers.discard(future)
            self.leave()

        future.add_done_callback(done)

    def straggling(self) -> bool:
        """Whether a call that timed out may still be running (and its effect
        still land): no effect of this run may be reconciled until it returns."""
        with self._lock:
            return bool(self._stragglers)

    def end(self) -> None:
        """The main flow stopped: refuse new journaled calls from now on."""
        with self._lock:
            self._ending = True

    def settled(self) -> bool:
        """``True`` once no journaled call is in flight (after ``end``, it stays so)."""
        with self._lock:
            return self._in_flight == 0

    def wait_settled(self) -> None:
        """Block until every journaled call in flight in another thread has
        finished and recorded its outcome (``end`` first, or it may never come)."""
        with self._lock:
            self._ending = True
            while self._in_flight:
                self._settled.wait(1.0)

    def close(self) -> None:
        """Nothing may be appended any more: only the end of the claim follows."""
        with self._lock:
            self._ending = True
            self._closed = True

    # -- journaled calls -------------------------------------------------------

    def begin(self, kind: str, name: str, input_hash: str | None = None) -> Call:
        """Claim the next position and compare it with the journal.

        Raises ``NonDeterminismError`` if the journal recorded a different
        call there, and ``Suspend`` if a retry of this call is not yet due,
        or if this execution has begun to suspend (``suspension``: code that
        swallowed it goes no further). The position is taken now, under the
        lock, in the order the calls are made (see ``_allocate`` for calls
        of concurrent siblings).
        """
        if self._suspended:
            suspended = self._suspended.get(_flow())
            if suspended is not None:  # this flow is suspending: nothing runs past its wait
                raise suspended
        if _TRANSACTING.get() is self:  # before the lock, which the body's transaction holds
            raise TransactionMisuse(f"{kind} {name!r} called inside a transactional step's body: a "
                                    "journaled call cannot run inside the step's own transaction")
        if self.scope is not None:
            where = self.scope()
            if where is not None:
                input_hash = scoped_hash(where, input_hash)
        with self._lock:
            if self._ending:
                raise Ended(f"run {self.run_id}: the execution has ended; no new call may start")
            position = self._lowest
            if position >= self.journal.end and not self._taken:
                # Past the journal's end, nothing handed out of order: a new
                # call, first attempt, as ``_allocate`` and ``_begin_at``
                # would decide (the live path of every step, kept short).
                self._lowest = position + 1
                if position >= self.position:
                    self.position = position + 1
                if self.stop_reason is not None:
                    self.checkpoint()
                return self._new_call(position, kind, name, input_hash)
            position = self._allocate(kind, name, input_hash)
            return self._begin_at(position, kind, name, input_hash)

    def restore_point(self, kind: str) -> HistoryEvent | None:
        """Resume past the latest recorded outcome of ``kind`` (a graph's
        checkpoint): the journal before it is not replayed call by call, the
        next call takes the position after it. ``None``: there is none, the
        run starts from the top as usual.

        Sound only for an outcome that stands for everything before it (a
        graph's super-step commits after all its nodes' calls settled): the
        caller rebuilds its state from the entry, and every call after it is
        checked against the journal as always (``begin``), so non-determinism
        past the restore point is still caught; a dry replay
        (``engine.replaycheck``) takes the same path. Taken before any other
        journaled call of the execution."""
        with self._lock:
            if self.position or self._taken:
                raise RuntimeError(f"run {self.run_id}: a restore point is taken before any journaled call")
            found: HistoryEvent | None = None
            for position, entry in self.journal.outcomes.items():
                if entry.step_kind == kind and entry.event is EventType.STEP_COMPLETED and (
                        found is None or position > (found.position or 0)):
                    found = entry
            if found is None or found.position is None:
                return None
            self._lowest = self.position = found.position + 1
            return found

    def record_restore_point(self, call: Call, payload: Payload) -> None:
        """Record ``payload`` as the outcome of ``call``, a restore point
        (``restore_point``), through the fenced commit path: a stale holder's
        is refused like any of its writes, so one run's chain never forks."""
        event = self._outcome_entry(call, payload, None)
        self._commit_entries(f"{call.kind} {call.name!r}", (event,), lambda entries: (
            self.store.append(self.run_id, self.epoch, entries, barrier=False)))

    def suspending(self, signal: Suspend) -> None:
        """``signal`` is being raised in this execution's current flow (see ``suspension``)."""
        with self._lock:
            if self.suspension is None:
                self.suspension = signal
            self._suspended.setdefault(_flow(), signal)

    def _new_call(self, position: int, kind: str, name: str, input_hash: str | None) -> Call:
        """A call past the journal's end: nothing recorded, first attempt.
        (A dry replay, ``engine.replaycheck``, stops here instead.)"""
        return Call(position, kind, name, input_hash, None)

    def _allocate(self, kind: str, name: str, input_hash: str | None) -> int:
        """The position of the next call: the lowest one not handed out yet.

        Calls made from sibling tasks or threads (``gather``, ``to_thread``)
        start in an order the scheduler decides, which may differ between the
        first execution and a replay. So a sibling's call whose lowest free
        position records a *different* call takes the free recorded position
        of the very same call (kind, name and arguments) if there is one, or
        else the lowest free position with no record. The workflow's own flow
        keeps the strict rule: a different call is a ``NonDeterminismError``.
        """
        position = self._lowest
        recorded = self._recorded_at(position)
        if recorded is not None and not _same(recorded, kind, name, input_hash) and self._is_sibling():
            position = self._match_elsewhere(position, kind, name, input_hash)
        if position == self._lowest:
            self._lowest += 1
            while self._lowest in self._taken:
                self._taken.discard(self._lowest)
                self._lowest += 1
        else:
            self._taken.add(position)
        self.position = max(self.position, position + 1)
        return position

    def peek(self) -> HistoryEvent | None:
        """What the journal records at the position the next call would
        take (``None``: nothing, the live end). For calls that decide by it
        whether to take a position at all (``ctx.patched``)."""
        with self._lock:
            return self._recorded_at(self._lowest)

    def _recorded_at(self, position: int) -> HistoryEvent | None:
        journal = self.journal
        return (journal.outcomes.get(position) or journal.intents.get(position)
                or journal.retries.get(position))

    def _match_elsewhere(self, lowest: int, kind: str, name: str, input_hash: str | None) -> int:
        journal = self.journal
        recorded = sorted(set(journal.outcomes) | set(journal.intents) | set(journal.retries))
        for position in recorded:
            if position > lowest and position not in self._taken:
                entry = self._recorded_at(position)
                if entry is not None and _same(entry, kind, name, input_hash):
                    return position
        free = lowest
        while free in self._taken or self._recorded_at(free) is not None:
            free += 1
        return free

    def _is_sibling(self) -> bool:
        if threading.get_ident() != self.main_thread:
            return True
        if self.main_task is None:
            return False
        try:
            return asyncio.current_task() is not self.main_task
        except RuntimeError:  # no running loop in this thread
            return False

    def _begin_at(self, position: int, kind: str, name: str, input_hash: str | None) -> Call:
        recorded = self.journal.outcomes.get(position)
        if recorded is None:
            intent = self.journal.intents.get(position)
            if intent is not None:
                # A side effect was (maybe) sent from here: replay must ask for
                # the very same call, or reconciling it would be meaningless.
                self._check(position, intent, kind, name, input_hash)
            recorded_retry = self.journal.retries.get(position)
            if recorded_retry is not None:
                self._check(position, recorded_retry, kind, name, input_hash)
                due = float((recorded_retry.detail or {}).get("next_at", 0.0))
                if due > time.time():
                    raise Suspend("retry", wake_at=due)
            self.checkpoint()
            attempt = self.journal.attempts_before(position) + 1
            return Call(position, kind, name, input_hash, None, attempt)
        self._check(position, recorded, kind, name, input_hash)
        return Call(position, kind, name, input_hash, recorded, recorded.attempt or 1)

    def _check(
        self, position: int, recorded: HistoryEvent, kind: str, name: str, input_hash: str | None
    ) -> None:
        same_call = recorded.step_kind == kind and recorded.name == name
        same_input = (
            not self.runtime.check_inputs
            or input_hash is None
            or recorded.input_hash is None
            or recorded.input_hash == input_hash
        )
        if not (same_call and same_input):
            raise NonDeterminismError(
                self.run_id,
                position,
                recorded=_describe(recorded.step_kind, recorded.name, recorded.input_hash),
                requested=_describe(kind, name, input_hash),
            )

    def checkpoint(self) -> None:
        """A step boundary: stop here if the worker or an operator asked to."""
        reason = self.stop_reason
        if reason is None:
            return
        if reason == "draining":
            raise Release("worker is draining")
        raise Abandon(reason)

    def replay(self, call: Call, result_type: Any) -> Any:
        """The recorded outcome of ``call``: its value, or its recorded failure."""
        recorded = call.recorded
        assert recorded is not None
        if recorded.event is EventType.STEP_FAILED:
            error = (recorded.detail or {}).get("error", {})
            if call.kind == "wait":
                raise ChildFailed(call.name, error.get("status", "failed"), error.get("message", ""))
            raise StepFailed(call.name, error.get("type", "Error"), error.get("message", ""), call.attempt)
        if recorded.payload is None:
            return None
        try:
            raw = self.runtime.payloads.raw(recorded.payload, what=self._what(call))
        except INFRASTRUCTURE_ERRORS as exc:
            where = f"position {call.position} of run {self.run_id}"
            raise Abandon(f"cannot load the result at {where}: {exc}") from exc
        try:
            return values.decode(raw, result_type, what=lambda: self._what(call))
        except IncompatiblePayload as exc:  # parks the run as incompatible (the executor)
            raise exc.at(call.position) from None
        except PayloadError as exc:  # it was recorded, so the code's type changed: deployable, park it
            raise IncompatiblePayload(schemas.type_name(result_type), None, None, str(exc),
                                      call.position) from None

    def complete_call(
        self, call: Call, value: Any, result_type: Any, detail: dict[str, Any] | None = None,
        policy: RetryPolicy | None = None,
    ) -> Any:
        """Record ``value`` as the outcome of ``call`` and return it *as replay
        will see it* (decoded from the recorded bytes), so the first run and
        every replay observe the very same value. A value that cannot make
        that round trip is never recorded: it is the call's failure, retried
        by ``policy`` (none: not retried)."""
        try:
            payload, decoded = self.prepare(call, value, result_type)
        except PayloadError as exc:
            self.fail_by_policy(call, exc, policy or NO_RETRY)
        self.record_outcome(call, payload, detail)
        return decoded

    def prepare(self, call: Call, value: Any, result_type: Any) -> tuple[Payload, Any]:
        """The payload that records ``value`` as the outcome of ``call``, and
        the value replay will decode from it; ``PayloadError`` (naming the
        call) if it cannot be encoded or does not decode back into
        ``result_type``. Checked before anything is stored."""
        try:
            raw = values.encode(value, result_type)
            decoded = values.decode(raw, result_type, what="it back")
        except PayloadError as exc:  # its type kept: a SecretLeak stays one
            raise type(exc)(f"the {self._what(call)} cannot be recorded: {exc}") from None
        try:
            return self.runtime.payloads.wrap(raw), decoded
        except PayloadError as exc:  # it holds a revealed secret (``SecretLeak``)
            raise type(exc)(f"the {self._what(call)} cannot be recorded: {exc}") from None
        except INFRASTRUCTURE_ERRORS as exc:  # an artifact could not be stored
            where = f"position {call.position} of run {self.run_id}"
            raise Abandon(f"cannot store the result at {where}: {exc}") from exc

    def record_outcome(
        self, call: Call, payload: Payload | None, detail: dict[str, Any] | None = None
    ) -> None:
        """Record ``payload`` as the outcome of ``call``, with the memory its
        body wrote (``memory``), if any.

        The fast path of ``_commit``, its steps written out: this runs once
        per journaled call, and building the entry positionally under the
        lock (so it has the next ``seq`` already) with no closure in between
        costs a fifth less CPU per step than ``entry`` and ``_commit_entries``
        (49 against 62 µs, a 500-step chain on SQLite)."""
        with self._lock:
            if self._closed:
                raise Ended(f"run {self.run_id}: the execution has ended; step.completed not recorded")
            event = HistoryEvent(
                self.run_id, self.seq, EventType.STEP_COMPLETED, time.time(), self.epoch, self.worker,
                call.position, call.kind, call.name, call.input_hash, call.attempt, call.started_at, payload,
                detail,
            )
            buffered = self.memory_buffers.pop(call.position, None) if self.memory_buffers else None
            if buffered is not None and buffered[0] == call.attempt and buffered[1]:
                self._commit_memory(event, call, buffered[1])  # the body wrote memory: it commits with this
                return
            try:
                self.store.append(self.run_id, self.epoch, (event,), barrier=False)
            except INFRASTRUCTURE_ERRORS as exc:
                raise Abandon(f"cannot record step.completed of run {self.run_id}: {exc}") from exc
            self.seq += 1
            self.journal.record(event)

    def drop_memory(self, position: int) -> None:
        """Forget the memory writes buffered at ``position``: its body raised
        (a failed attempt, or one run again after a credential refresh), and
        only the writes of a body whose outcome is recorded may land."""
        self.memory_buffers.pop(position, None)

    def record_memory(self, call: Call, payload: Payload | None, writes: Sequence[MemoryWrite]) -> None:
        """Record the outcome of ``call`` with ``writes`` in one transaction
        (a workflow's ``ctx.memory`` write is its own journaled call)."""
        self._commit_memory(self._outcome_entry(call, payload, None), call, writes)

    def _commit_memory(self, event: HistoryEvent, call: Call, writes: Sequence[MemoryWrite]) -> None:
        def write(entries: tuple[HistoryEvent, ...]) -> None:
            origin = Provenance(self.run_id, call.position, self.operation_id(call.position))
            self.store.append_memory(self.run_id, self.epoch, entries, writes, origin)

        self._commit_entries(event.event, (event,), write)

    def transact(self, call: Call, body: Callable[[Tx], tuple[Payload, Any]]) -> Any:
        """Run ``body`` (a transactional step's body and the encoding of its
        result: the payload to record and the value replay will see) inside
        one store transaction fenced on this claim, record that payload as
        the outcome of ``call`` in the same transaction, and return the
        value (``engine.transactions``). Holding the lock keeps the entry's
        ``seq`` the next one; no journaled call may start in the body."""
        def write(seq: int) -> tuple[tuple[HistoryEvent], Any]:
            def in_transaction(handle: Tx) -> tuple[tuple[HistoryEvent], tuple[HistoryEvent, Any]]:
                payload, decoded = body(handle)
                event = self._outcome_entry(call, payload, None)  # under the lock: numbered ``seq``
                return (event,), (event, decoded)

            token = _TRANSACTING.set(self)
            try:
                event, decoded = self.store.transact(self.run_id, self.epoch, in_transaction)
            finally:
                _TRANSACTING.reset(token)
            return (event,), decoded

        return self._commit(f"{call.kind} {call.name!r}", write)

    # -- deliveries (signals, decisions): what the run's mailbox holds ---------------

    def next_delivery(self, key: str) -> Delivery | None:
        """The message for wait key ``key`` that the next consuming call
        takes: the oldest one no live journal entry has consumed. A message
        consumed by an entry that a retry or a rewind voided is available
        again (the re-executed code reads its inputs again), in its place.
        One row read: the journal knows the freed ones (``Journal.freed``),
        the store finds the oldest untaken one by its index."""
        freed = self.journal.first_freed(key)
        try:
            untaken = self.store.delivery(self.run_id, key)
            if freed is None or (untaken is not None and untaken.seq < freed):
                return untaken
            return self.store.delivery(self.run_id, key, freed) or untaken
        except INFRASTRUCTURE_ERRORS as exc:
            raise Abandon(f"cannot read the mailbox of run {self.run_id}: {exc}") from exc

    def take_delivery(
        self, call: Call, message: Delivery, payload: Payload | None, detail: dict[str, Any] | None = None,
        *, error: dict[str, Any] | None = None,
    ) -> None:
        """Record ``payload`` (what ``message`` carried, as the caller's type
        decoded it) as the outcome of ``call`` and consume ``message``, in one
        fenced transaction: a crash leaves both or neither, so a message is
        consumed exactly once and replay returns what the first execution
        read. The entry's detail names the message (``delivery``: its seq).
        With ``error`` the outcome is that failure instead (``step.failed``,
        ``detail["error"]``): a message that does not fit what the call
        expects is consumed and its rejection recorded, so it cannot block
        the messages behind it."""
        recorded = {"delivery": message.seq, "key": message.key, "sender": message.sender,
                    "sent_at": message.sent_at}
        if detail:
            recorded.update(detail)
        if error is not None:
            recorded["error"] = error
        event = self.entry(
            EventType.STEP_FAILED if error is not None else EventType.STEP_COMPLETED,
            position=call.position, step_kind=call.kind, name=call.name,
            input_hash=call.input_hash, attempt=call.attempt, started_at=call.started_at,
            payload=None if error is not None else payload, detail=recorded,
        )
        self._commit_entries(f"the taking of message {message.seq}", (event,), lambda entries: (
            self.store.take_delivery(self.run_id, self.epoch, entries[0], message.seq,
                                     released=message.taken_position)))

    # -- approvals: requests this run makes (``engine.approvals``) --------------------

    def request_approval(self, call: Call, payload: Payload, request: ApprovalRequest) -> None:
        """Record ``payload`` (the request, details included) as the outcome
        of ``call`` and store the pending request, in one fenced transaction:
        a crash leaves both or neither, so replay finds the request it made."""
        event = self._outcome_entry(call, payload, {"request_id": request.request_id})
        self._commit_entries(f"approval request {request.request_id}", (event,), lambda entries: (
            self.store.request_approval(self.run_id, self.epoch, entries[0], request)))

    def expire_approval(self, call: Call, payload: Payload, request_id: str) -> bool:
        """Record ``payload`` (an expired decision) as the outcome of
        ``call`` if request ``request_id`` is still undecided, marking it
        expired in the same fenced transaction; ``False`` (nothing written)
        if a decision came first: it is in the mailbox."""
        event = self._outcome_entry(call, payload, {"request_id": request_id, "decision": "expired"})
        return self._commit_entries(
            f"the expiry of approval request {request_id}", (event,),
            lambda entries: self.store.expire_approval(self.run_id, self.epoch, entries[0], request_id),
            unless=lambda expired: not expired)

    def _outcome_entry(
        self, call: Call, payload: Payload | None, detail: dict[str, Any] | None
    ) -> HistoryEvent:
        return self.entry(
            EventType.STEP_COMPLETED, position=call.position, step_kind=call.kind, name=call.name,
            input_hash=call.input_hash, attempt=call.attempt, started_at=call.started_at, payload=payload,
            detail=detail,
        )

    def fail_by_policy(self, call: Call, exc: BaseException, policy: RetryPolicy) -> NoReturn:
        """Classify a failed attempt with ``policy`` (``TerminalError`` is never
        retried) and record it: a retry after the policy's backoff, or the end."""
        retryable = policy.retryable(exc)
        delay = policy.delay(call.attempt, exc) if retryable and call.attempt < policy.max_attempts else None
        self.fail_call(call, exc, retryable, delay)

    def fail_call(
        self, call: Call, exc: BaseException, retryable: bool, retry_delay: float | None
    ) -> NoReturn:
        """Record a failed attempt; raise ``Suspend`` until the retry is due,
        or ``StepFailed`` if this was the last attempt."""
        self.drop_memory(call.position)  # a failed attempt's memory writes never land
        category = "retryable" if retryable else "terminal"
        error = error_detail(exc, retryable=retryable, **{"class": category})
        if retry_delay is not None:
            next_at = time.time() + retry_delay
            self.append(self.entry(
                EventType.STEP_RETRIED, position=call.position, step_kind=call.kind, name=call.name,
                input_hash=call.input_hash, attempt=call.attempt, started_at=call.started_at,
                detail={"error": error, "next_at": next_at},
            ))
            raise Suspend("retry", wake_at=next_at)
        self.append(self.entry(
            EventType.STEP_FAILED, position=call.position, step_kind=call.kind, name=call.name,
            input_hash=call.input_hash, attempt=call.attempt, started_at=call.started_at,
            detail={"error": error},
        ))
        raise StepFailed(call.name, error["type"], error["message"], call.attempt) from exc

    def check_budget(self, *, tool_call: bool) -> None:
        """Suspend the run (reason ``budget_exceeded``) if a limit is reached."""
        budget = self.budget
        if budget is None:
            return
        exceeded = budget.exceeded(self.journal.usage, time.time() - self.run.created_at, tool_call=tool_call)
        if exceeded is not None:
            raise Suspend("budget_exceeded", detail=exceeded)

    def _what(self, call: Call) -> str:
        return f"result of {call.kind} {call.name!r} at position {call.position} of run {self.run_id!r}"

    # -- ending the claim --------------------------------------------------------

    def complete(self, value: Any, result_type: Any) -> Any:
        """Record the run's result; return it as a reader of the run will see it."""
        raw = values.encode(value, result_type)
        decoded = values.decode(raw, result_type, what=f"result of run {self.run_id!r}")  # before storing it
        event = self.entry(EventType.RUN_COMPLETED)
        payload = self.runtime.payloads.wrap(raw)
        self.store.finish_run(self.run_id, self.epoch, event, RunStatus.COMPLETED, payload, None)
        if self.workspace is not None:  # the store holds its snapshots: the directory is done with
            self.workspace.finished()
        return decoded

    def fail(self, exc: BaseException) -> None:
        error = error_detail(exc, **{"class": "terminal"})
        if isinstance(exc, StepFailed):
            error["step"] = exc.step
        event = self.entry(EventType.RUN_FAILED, detail={"error": error})
        self.store.finish_run(self.run_id, self.epoch, event, RunStatus.FAILED, None, error)
        if self.workspace is not None:
            self.workspace.finished()

    def suspend(self, signal: Suspend) -> None:
        detail: dict[str, Any] = {"reason": signal.reason, "wake_at": signal.wake_at,
                                  "waiting_on": signal.waiting_on}
        if signal.waiting_for is not None:
            detail["waiting_for"] = signal.waiting_for
        if signal.detail:
            detail.update(signal.detail)
        kinds = {RunStatus.NEEDS_ATTENTION: EventType.RUN_NEEDS_ATTENTION,
                 RunStatus.INCOMPATIBLE: EventType.RUN_INCOMPATIBLE}
        kind = kinds.get(signal.status, EventType.RUN_SUSPENDED)
        event = self.entry(kind, detail=detail)
        self.store.suspend_run(
            self.run_id, self.epoch, event, signal.wake_at, signal.waiting_on, signal.status,
            waiting_for=signal.waiting_for,
        )

    def halt(self, violation: BaseException) -> None:
        """A security failure: stop now, revoke the lease, never retry."""
        error = error_detail(violation, **{"class": "security"})
        event = self.entry(EventType.RUN_HALTED, detail={"error": error})
        self.store.halt_run(self.run_id, self.epoch, event, error)

    def rewind(self, failure: LogicalFailure) -> bool:
        """Void the journal from the latest execution of ``failure.rewind_to``
        on and give the run back, so the next claim replays up to there and
        continues. ``False`` if there is no such step or rewinds are used up."""
        targets = [pos for pos, entry in self.journal.outcomes.items()
                   if entry.name == failure.rewind_to and pos < self.position]
        if not targets or len(self.journal.rewinds) >= self.runtime.max_rewinds:
            return False
        detail = {"from_position": max(targets), "to": failure.rewind_to,
                  "reason": redaction.redact(failure.reason),
                  "rewind": len(self.journal.rewinds) + 1}
        entries = (self.entry(EventType.RUN_REWOUND, detail=detail), self.entry(EventType.RUN_RELEASED))
        # the cut, the voided approval requests and the release: one transaction, after ``close``
        self._commit_entries("the rewind", entries, lambda rewind: (
            self.store.rewind_run(self.run_id, self.epoch, *rewind)), ending=True)
        return True

    def release(self) -> None:
        self.store.release_run(self.run_id, self.epoch, self.entry(EventType.RUN_RELEASED))


def _same(recorded: HistoryEvent, kind: str, name: str, input_hash: str | None) -> bool:
    """Whether ``recorded`` is the record of exactly this call (arguments included)."""
    return recorded.step_kind == kind and recorded.name == name and recorded.input_hash == input_hash


def _describe(kind: str | None, name: str | None, input_hash: str | None) -> str:
    text = f"{kind} {name!r}"
    return f"{text} (input #{input_hash})" if input_hash else text


def current() -> Execution | None:
    """The execution running in this context, if any."""
    return CURRENT.get(None)
