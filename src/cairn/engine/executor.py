"""Drive one claimed run from the top of its workflow function to the end of
the claim.

The function always runs from the top: journaled calls before the journal's
end return recorded outcomes, the first unrecorded one executes for real.
Whatever way the code stops (result, exception, suspension, lost lease) is
turned here into exactly one final write for the claim.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from cairn.engine.context import Context
from cairn.engine.execution import CURRENT, Execution
from cairn.engine.runtime import Runtime
from cairn.engine.signals import Abandon, Release, Suspend
from cairn.errors import LeaseLost, LogicalFailure, PayloadError, RewindFailed, SecurityViolation, StoreError
from cairn.store.records import Claim, EventType, HistoryEvent

log = logging.getLogger("cairn.executor")


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a claim ended: ``completed``, ``failed``, ``suspended``, ``released``,
    ``lost`` (fenced out) or ``abandoned`` (store failure; lease will expire)."""

    status: str
    result: Any = None  # a completed run's result, decoded as replay would see it
    wake_at: float | None = None
    waiting_on: str | None = None
    error: str | None = None


_loops = threading.local()


def _thread_loop() -> asyncio.AbstractEventLoop:
    """One event loop per worker thread, reused across runs (creating a loop
    per run would cost more than the steps it drives)."""
    loop: asyncio.AbstractEventLoop | None = getattr(_loops, "loop", None)
    if loop is None or loop.is_closed():
        loop = asyncio.new_event_loop()
        _loops.loop = loop
    return loop


class Watcher(Protocol):
    """Keeps an execution's lease alive while it runs (``LeaseKeeper``)."""

    def watch(self, execution: Execution) -> None: ...

    def unwatch(self, execution: Execution) -> None: ...


def execute(runtime: Runtime, claim: Claim, worker: str, watcher: Watcher | None = None) -> Outcome:
    """Run ``claim`` until its claim ends; never raises for workflow errors."""
    definition = runtime.workflows[claim.run.workflow]
    execution = Execution(runtime, claim, worker, is_async=definition.is_async)
    if watcher is not None:
        watcher.watch(execution)
    token = CURRENT.set(execution)
    try:
        outcome = _drive(runtime, execution)
        if outcome.status == "abandoned":
            wake_at = give_back(execution, store_failures(claim.history))
            if wake_at is not None:
                outcome = replace(outcome, wake_at=wake_at)
        return outcome
    finally:
        CURRENT.reset(token)
        if watcher is not None:
            watcher.unwatch(execution)


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


def _drive(runtime: Runtime, execution: Execution) -> Outcome:
    try:
        return _run_to_end(runtime, execution)
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


def _run_to_end(runtime: Runtime, execution: Execution) -> Outcome:
    definition = runtime.workflows[execution.run.workflow]
    try:
        raw = runtime.payloads.load(execution.run.input, Any, what=f"input of run {execution.run_id!r}")
        args, kwargs = definition.call_args(definition.convert(raw))
        ctx = Context(execution)
        if definition.is_async:
            result = _thread_loop().run_until_complete(definition.fn(ctx, *args, **kwargs))
        else:
            result = definition.fn(ctx, *args, **kwargs)
    except Suspend as signal:
        execution.suspend(signal)
        return Outcome("suspended", wake_at=signal.wake_at, waiting_on=signal.waiting_on)
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
