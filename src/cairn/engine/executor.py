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
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, ParamSpec, Protocol, TypeVar

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

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a claim ended: ``completed``, ``failed``, ``suspended``, ``released``,
    ``lost`` (fenced out) or ``abandoned`` (store failure; lease will expire)."""

    status: str
    result: Any = None  # a completed run's result, decoded as replay would see it
    wake_at: float | None = None
    waiting_on: str | None = None
    error: str | None = None


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
    definition = runtime.workflows[claim.run.workflow]
    execution = Execution(runtime, claim, worker, is_async=definition.is_async)
    if watcher is not None:
        watcher.watch(execution)
    token = CURRENT.set(execution)
    try:
        return _drive(runtime, execution, loops or INLINE_LOOPS)
    finally:
        CURRENT.reset(token)
        if watcher is not None:
            watcher.unwatch(execution)


def _drive(runtime: Runtime, execution: Execution, loops: EventLoops) -> Outcome:
    try:
        return _run_to_end(runtime, execution, loops)
    except LeaseLost as lost:
        log.warning("run %s: %s; its writes are void", execution.run_id, lost)
        return Outcome("lost", error=str(lost))
    except Abandon as abandon:
        log.warning("run %s abandoned: %s", execution.run_id, abandon)
        return Outcome("abandoned", error=str(abandon))
    except Exception as exc:  # the store failed while ending the claim
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


def _run_to_end(runtime: Runtime, execution: Execution, loops: EventLoops) -> Outcome:
    definition = runtime.workflows[execution.run.workflow]
    try:
        raw = runtime.payloads.load(execution.run.input, Any, what=f"input of run {execution.run_id!r}")
        args, kwargs = definition.call_args(definition.convert(raw))
        ctx = Context(execution)
        if definition.is_async:
            result = _run_async(execution, definition.fn(ctx, *args, **kwargs), loops.get())
        else:
            try:
                result = definition.fn(ctx, *args, **kwargs)
            finally:
                execution.wait_settled()
                execution.close()
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
