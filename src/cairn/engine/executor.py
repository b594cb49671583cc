"""Drive one claimed run from the top of its workflow function to the end of
the claim.

The function always runs from the top: journaled calls before the journal's
end return recorded outcomes, the first unrecorded one executes for real.
Whatever way the code stops (result, exception, suspension, lost lease) is
turned here into exactly one final write for the claim.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, replace
from typing import Any, ParamSpec, Protocol, TypeVar

from cairn.engine.context import Context
from cairn.engine.credentials import access_of
from cairn.engine.definitions import WorkflowDef
from cairn.engine.execution import CURRENT, Execution
from cairn.engine.journal import Journal
from cairn.engine.observe import Observer
from cairn.engine.runtime import Runtime
from cairn.engine.signals import Abandon, Release, Suspend
from cairn.engine.tools import settle_end
from cairn.errors import (
    CallCancelled,
    IncompatiblePayload,
    LeaseLost,
    LogicalFailure,
    NonDeterminismError,
    PayloadError,
    RewindFailed,
    SecurityViolation,
    StoreError,
    WorkspaceError,
)
from cairn.security import redaction
from cairn.security import secrets as security
from cairn.store.records import Claim, EventType, HistoryEvent, RunStatus

log = logging.getLogger("cairn.executor")

P = ParamSpec("P")
T = TypeVar("T")


class _ReportingJournal(Journal):
    """A journal that reports each live entry taken into it.

    Every committed entry of an execution reaches its journal (its one
    commit path, ``Execution._commit``, and the step's fast path beside it):
    hooking the journal rather than each write path means a write path added
    later is observed without anyone remembering to."""

    report: Callable[[HistoryEvent], None] | None = None

    def record(self, event: HistoryEvent) -> None:
        super().record(event)
        if self.report is not None:
            self.report(event)


class ObservedExecution(Execution):
    """An ``Execution`` that reports every entry it appends to its observer
    (``engine.observe``), built instead of a plain one when there is one.

    The claim's history is taken in before reporting starts, so only what
    this execution commits is reported. Terminal writes (``complete``,
    ``fail``, ``suspend``...) end the claim and reach the observer as the
    ``Outcome``."""

    def __init__(self, observer: Observer, runtime: Runtime, claim: Claim, worker: str, *,
                 is_async: bool = False) -> None:
        super().__init__(runtime, claim, worker, is_async=is_async)
        self.observer = observer
        self.claim = claim
        #: what the observer keeps of this claim while it executes
        self.observed: Any = None
        journal = _ReportingJournal(claim.history)
        journal.report = self._report
        self.journal = journal

    def _report(self, event: HistoryEvent) -> None:
        try:
            self.observer.recorded(self, event)
        except Exception:  # telemetry never breaks a run
            log.exception("run %s: the observer failed on %s", self.run_id, event.event)



@dataclass(frozen=True, slots=True)
class Outcome:
    """How a claim ended: ``completed``, ``failed``, ``suspended``, ``released``,
    ``lost`` (fenced out) or ``abandoned`` (store failure; lease will expire)."""

    status: str
    result: Any = None  # a completed run's result, decoded as replay would see it
    wake_at: float | None = None
    waiting_on: str | None = None
    error: str | None = None
    waiting_for: str | None = None  # the wait key of a run suspended for a delivery


class Watcher(Protocol):
    """Keeps an execution's lease alive while it runs (``LeaseKeeper``)."""

    def watch(self, execution: Execution) -> None: ...

    def unwatch(self, execution: Execution) -> None: ...


def execute(
    runtime: Runtime, claim: Claim, worker: str, watcher: Watcher | None = None,
    loops: EventLoops | None = None,
) -> Outcome:
    """Run ``claim`` until its claim ends; never raises for workflow errors.
    An async workflow runs on this thread's loop of ``loops`` (default: ``INLINE_LOOPS``)."""
    definition = runtime.registry.definition_for(claim.run, runtime.store)
    if definition is None and claim.run.bundle is None:  # a run older than bundles
        definition = runtime.workflows.get(claim.run.workflow)
    if definition is None:  # a bundle this process does not serve (claims filter it: a race)
        return _refuse(runtime, claim, worker)
    observer = runtime.observer  # once per claim: an unobserved step pays nothing
    if observer is None:
        execution = Execution(runtime, claim, worker, is_async=definition.is_async)
    else:
        execution = ObservedExecution(observer, runtime, claim, worker, is_async=definition.is_async)
        _observe(observer.claimed, execution)
    if watcher is not None:
        watcher.watch(execution)
    token = CURRENT.set(execution)
    # code below the engine that resolves a ``cairn.Secret`` itself (a model
    # client's api_key) finds this run's resolver and identity here
    secrets_token = security.bind(runtime.secrets, access_of(execution))
    revealed_token = redaction.open_scope()  # what it records is searched for what it revealed
    try:
        outcome = _drive(runtime, execution, loops or INLINE_LOOPS, definition)
        if outcome.status == "abandoned":
            wake_at = give_back(execution, store_failures(claim.history))
            if wake_at is not None:
                outcome = replace(outcome, wake_at=wake_at)
        if outcome.error is not None:  # workers log it
            outcome = replace(outcome, error=redaction.redact(outcome.error))
        if observer is not None:
            _observe(observer.ended, execution, outcome)
        return outcome
    finally:
        redaction.close_scope(revealed_token)
        security.unbind(secrets_token)
        CURRENT.reset(token)
        if watcher is not None:
            watcher.unwatch(execution)


def _observe(hook: Callable[..., None], *args: Any) -> None:
    try:
        hook(*args)
    except Exception:  # telemetry never breaks a run
        log.exception("the observer failed")


#: ``Execution.stop_reason`` of an execution giving its run back after a
#: store failure (``LeaseKeeper.giving_back`` looks for it; another reason
#: set meanwhile, such as a drain, stops it).
GIVING_BACK = "giving the run back after a store failure"
#: Seconds between attempts to give a run back, doubling up to the cap.
GIVE_BACK_FIRST, GIVE_BACK_CAP = 0.0, 2.0
#: The ``reason`` of the suspension that parks a run given back after a
#: store failure, and how long it parks: doubling with each such failure
#: since the run last recorded a step, up to the cap.
STORE_FAILURE = "store failure"
PARK_FIRST, PARK_CAP = 0.25, 5.0


def store_failures(history: Sequence[HistoryEvent]) -> int:
    """Store-failure suspensions since the run last recorded a step's outcome."""
    count = 0
    for event in history:
        if event.event in (EventType.STEP_COMPLETED, EventType.STEP_FAILED):
            count = 0
        elif event.event is EventType.RUN_SUSPENDED and (event.detail or {}).get("reason") == STORE_FAILURE:
            count += 1
    return count


def give_back(
    execution: Execution, failures: int = 0, sleep: Callable[[float], Any] = time.sleep
) -> float | None:
    """Give back a run whose execution the store failed (disk full, database
    down) as soon as the store answers again: parked (``suspended``, reason
    ``store failure``) until the time returned, ``None`` if it could not.

    A store outage is not the run's fault: left alone, its lease would
    expire and the takeover would count as a crash of its worker, so an
    outage longer than a few leases quarantined healthy runs. The execution
    stays watched meanwhile, so its lease is renewed as soon as renewals
    succeed again (its worker renews before it claims meanwhile) and no one
    takes it over first. The run is parked rather
    than released, for longer after each store failure that recorded
    nothing (``failures`` of them already): a store that takes small writes
    but not a step's record (a nearly full disk) must not have the step
    executed again and again in a loop. It stops trying when the run is no
    longer its (``LeaseLost``) or the worker drains (the lease then expires
    as for any worker that goes away)."""
    if execution.stop_reason is None:
        execution.stop_reason = GIVING_BACK
    delay = GIVE_BACK_FIRST
    park = min(PARK_FIRST * 2.0 ** failures, PARK_CAP)
    while True:
        wake_at = time.time() + park
        try:
            execution.suspend(Suspend(STORE_FAILURE, wake_at))
        except LeaseLost:
            return None
        except (StoreError, OSError) as exc:
            if execution.stop_reason not in (GIVING_BACK, None) or "closed" in str(exc):
                return None  # draining or lost meanwhile, or the store was closed: nothing to wait for
            log.warning("run %s: cannot give the run back yet (%s); again in %.1fs",
                        execution.run_id, exc, delay)
            sleep(delay)  # at once the first time: a dropped pooled connection fails only once
            delay = min(max(delay * 2, 0.1), GIVE_BACK_CAP)
            continue
        log.info("run %s given back after a store failure; it continues from its journal in %.1fs",
                 execution.run_id, park)
        return wake_at


def _refuse(runtime: Runtime, claim: Claim, worker: str) -> Outcome:
    """Give back a run whose bundle this process does not serve: it waits
    for a worker that does (``cairn show`` says which)."""
    run = claim.run
    why = runtime.registry.why_not(run.bundle or "")
    event = HistoryEvent(run_id=run.run_id, seq=claim.next_seq, event=EventType.RUN_RELEASED, at=time.time(),
                         epoch=run.epoch, worker=worker,
                         detail={"reason": f"not serving bundle {run.bundle}", "why": why})
    try:
        runtime.store.release_run(run.run_id, run.epoch, event)
    except LeaseLost:
        return Outcome("lost", error="lease lost")
    log.warning("run %s: not serving its bundle %s (%s); given back", run.run_id, run.bundle, why)
    return Outcome("refused", error=f"not serving bundle {run.bundle}: {why}")


def _drive(runtime: Runtime, execution: Execution, loops: EventLoops, definition: WorkflowDef) -> Outcome:
    try:
        return _run_to_end(runtime, execution, loops, definition)
    except LeaseLost as lost:
        log.warning("run %s: %s; its writes are void", execution.run_id, lost)
        return Outcome("lost", error=str(lost))
    except Abandon as abandon:
        log.warning("run %s abandoned: %s", execution.run_id, abandon)
        return Outcome("abandoned", error=str(abandon))
    except (StoreError, OSError) as exc:  # the store failed while ending the claim
        log.warning("run %s abandoned: the store failed: %s", execution.run_id, exc)
        return Outcome("abandoned", error=str(exc))
    except Exception as exc:
        log.exception("run %s abandoned: the store failed", execution.run_id)
        return Outcome("abandoned", error=str(exc))


class EventLoops:
    """One event loop per thread, reused by the executions that thread runs
    (a loop per run would drop pooled connections, such as a model client's
    ``httpx.AsyncClient``, at the end of every run), and closed by ``close``
    when the threads are done (a worker's, when it drains)."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self._loops: list[asyncio.AbstractEventLoop] = []

    def get(self) -> asyncio.AbstractEventLoop:
        loop: asyncio.AbstractEventLoop | None = getattr(self._local, "loop", None)
        if loop is None or loop.is_closed():
            loop = asyncio.new_event_loop()
            self._local.loop = loop
            with self._lock:
                self._loops.append(loop)
        return loop

    def close(self) -> None:
        """Close every loop handed out; the threads that ran them must have
        finished with them (a running loop is left alone)."""
        with self._lock:
            loops, self._loops = self._loops, []
        for loop in loops:
            if loop.is_closed() or loop.is_running():
                continue
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()


#: the loops of threads that execute runs inline (``app.run``): they live as long as their threads
INLINE_LOOPS = EventLoops()


class _RunThreads(concurrent.futures.ThreadPoolExecutor):
    """The default executor of one execution: ``asyncio.to_thread`` and
    ``run_in_executor(None, ...)`` threads of that run, joined at its end."""

    used = False

    def submit(
        self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> concurrent.futures.Future[T]:
        self.used = True
        return super().submit(fn, *args, **kwargs)


def _run_async(
    execution: Execution, main: Coroutine[Any, Any, Any], loop: asyncio.AbstractEventLoop
) -> Any:
    """Run an async workflow on ``loop`` and leave nothing of it behind.

    Whichever way ``main`` ends, the tasks it started (``gather`` siblings,
    a forgotten ``create_task``) may still be running; left on the loop they
    would go on under the next run's execution, with a claim that is no
    longer theirs (a payment sent twice: once by the leftover task, once by
    the next execution that found its intent unsettled). So, before the claim
    ends: no new journaled call may start, the calls in flight finish and are
    recorded, every other task is cancelled, and the run's own ``to_thread``
    threads are joined.
    """
    threads = _RunThreads(thread_name_prefix=f"cairn-run-{execution.run_id}")
    loop.set_default_executor(threads)
    try:
        task = loop.create_task(main)
        execution.main_task = task
        try:
            return loop.run_until_complete(task)
        finally:
            execution.end()
            loop.run_until_complete(_settled(execution))
            execution.close()
            _cancel_rest(loop)
            if threads.used:
                loop.run_until_complete(_joined(threads))
    finally:
        threads.shutdown(wait=True)


async def _joined(threads: concurrent.futures.ThreadPoolExecutor) -> None:
    """Wait for the run's threads with the loop still turning (a thread may
    be waiting on a coroutine it handed to the loop)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def finished() -> None:
        if not done.done():
            done.set_result(None)

    def join() -> None:
        threads.shutdown(wait=True)
        loop.call_soon_threadsafe(finished)

    threading.Thread(target=join, name="cairn-join", daemon=True).start()
    await done


async def _settled(execution: Execution) -> None:
    """Keep the loop turning until no journaled call of the run is in flight
    (in a task of this loop, or a thread)."""
    delay = 0.0005
    while not execution.settled():
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.02)


def _cancel_rest(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            log.debug("a leftover task of the run ended with %r", task.exception())


def _run_to_end(
    runtime: Runtime, execution: Execution, loops: EventLoops, definition: WorkflowDef
) -> Outcome:
    try:
        if execution.import_unfinished:
            raise WorkspaceError(
                f"run {execution.run_id} was started from a git repository (workspace_from) whose import "
                "never finished (the importing process stopped before recording the tree): it does not run "
                "on a missing workspace; start it again under a new run id")
        raw = runtime.payloads.load(execution.run.input, Any, what=f"input of run {execution.run_id!r}")
        args, kwargs = definition.call_args(definition.recorded(raw))
        ctx = Context(execution)
        if definition.is_async:
            result = _run_async(execution, definition.fn(ctx, *args, **kwargs), loops.get())
        else:
            try:
                result = definition.fn(ctx, *args, **kwargs)
            finally:
                execution.wait_settled()
                execution.close()
        if execution.suspension is not None:  # the code swallowed it (a bare except) and returned
            raise execution.suspension
        settle_end(execution)  # the journal must end where the code did, every effect settled
    except Suspend as signal:
        execution.suspend(signal)
        return Outcome("suspended", wake_at=signal.wake_at, waiting_on=signal.waiting_on,
                       waiting_for=signal.waiting_for)
    except Release:
        execution.release()
        return Outcome("released")
    except SecurityViolation as violation:  # stop now, revoke the lease, never retry
        execution.halt(violation)
        return Outcome("halted", error=str(violation))
    except LogicalFailure as failure:
        if execution.rewind(failure):
            return Outcome("released", error=str(failure))
        impossible = RewindFailed(
            f"{failure.reason}: no earlier {failure.rewind_to!r} to return to, or the run already "
            f"rewound {runtime.max_rewinds} times"
        )
        execution.fail(impossible)
        return Outcome("failed", error=str(impossible))
    except IncompatiblePayload as exc:  # no path to the type's current version: park, never retry
        detail = {"why": str(exc), "type": exc.type_name, "found_version": exc.found,
                  "current_version": exc.current, "position": exc.position}
        execution.suspend(Suspend("incompatible", status=RunStatus.INCOMPATIBLE, detail=detail))
        return Outcome("incompatible", error=str(exc))
    except NonDeterminismError as exc:  # a BaseException, so that no workflow code swallows it
        execution.fail(exc)
        return Outcome("failed", error=f"{type(exc).__qualname__}: {exc}")
    except asyncio.CancelledError:  # nothing here cancels the workflow: its own code raised it
        cancelled = CallCancelled(
            f"workflow {definition.name!r} raised CancelledError, but nothing cancelled it")
        execution.fail(cancelled)
        return Outcome("failed", error=f"CallCancelled: {cancelled}")
    except StoreError as exc:  # the database failed, not the workflow
        raise Abandon(f"store failure inside run {execution.run_id}: {exc}") from exc
    except Exception as exc:  # the workflow failed: record it, keep the journal
        execution.fail(exc)
        return Outcome("failed", error=f"{type(exc).__qualname__}: {exc}")
    try:
        value = execution.complete(result, definition.result_type)
    except PayloadError as exc:  # the result cannot be encoded: fail the run clearly
        execution.fail(exc)
        return Outcome("failed", error=f"{type(exc).__qualname__}: {exc}")
    return Outcome("completed", result=value)
