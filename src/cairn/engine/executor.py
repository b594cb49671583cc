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
from dataclasses import dataclass
from typing import Any, Protocol

from cairn.engine.context import Context
from cairn.engine.execution import CURRENT, Execution
from cairn.engine.runtime import Runtime
from cairn.engine.signals import Abandon, Release, Suspend
from cairn.engine.tools import settle_end
from cairn.errors import (
    CallCancelled,
    LeaseLost,
    LogicalFailure,
    NonDeterminismError,
    PayloadError,
    RewindFailed,
    SecurityViolation,
    StoreError,
)
from cairn.store.records import Claim

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
        return _drive(runtime, execution)
    finally:
        CURRENT.reset(token)
        if watcher is not None:
            watcher.unwatch(execution)


def _drive(runtime: Runtime, execution: Execution) -> Outcome:
    try:
        return _run_to_end(runtime, execution)
    except LeaseLost as lost:
        log.warning("run %s: %s; its writes are void", execution.run_id, lost)
        return Outcome("lost", error=str(lost))
    except Abandon as abandon:
        log.warning("run %s abandoned: %s", execution.run_id, abandon)
        return Outcome("abandoned", error=str(abandon))
    except Exception as exc:  # the store failed while ending the claim
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
        settle_end(execution)  # the journal must end where the code did, every effect settled
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
