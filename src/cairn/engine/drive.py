"""One driver for sync and async journaled calls.

The journaling protocol of a step (``steps.journaled``), a tool with its
reconciler (``tools._ToolCall.protocol``) or a model call
(``modelcalls.ask``) is written once, as a generator: it decides what to do
from the journal, ``yield``s an ``Invoke`` whenever user code (a step body, a
tool, a reconciler, a model client) must run, and receives that code's result,
or has its exception thrown in at the ``yield``. It never calls user code
itself and never awaits.

Two small drivers run such a protocol: ``run_sync`` calls each requested
function, ``run_async`` calls it and awaits what it returns. That is the only
difference between the sync and the async path, so the rules of journaling,
retries and effects cannot drift apart between them (the hand-kept twins
this replaced had drifted: a reconciler that raised was handled one way in
each).

Why sans-IO and not the alternatives:

* generating the sync code from the async code (httpcore's unasync) keeps two
  copies of every rule in the tree and needs a build step and a drift check;
* an ``Outcome`` wrapper (DBOS) threads callbacks through every rule, so the
  protocol no longer reads top to bottom;
* a generator protocol is ordinary Python read top to bottom, the user code it
  runs is explicit at each ``yield``, and a new kind of journaled call is one
  generator, not two functions kept in step.

Its cost is a generator per call: about 1 µs on a slow machine, against a
journaled step's commit of tens of µs (``Invoke`` is a slotted class built
with positional arguments, and ``run_sync`` does nothing else on the common
path, to keep it there).

What the drivers decide, so that protocols need not:

* only ``Exception`` is thrown into a protocol. ``BaseException``
  (``Suspend``, ``LeaseLost``, ``LogicalFailure``, cancellation) passes by and
  closes the generator at once, so its ``finally`` blocks run and it records
  nothing after it. A ``CancelledError`` that a body raised on its own (its
  task was not cancelled) is thrown in as ``CallCancelled``: it is the call's
  failure, recorded by its policy, not a crash of the worker;
* a timeout is thrown in as ``ToolTimeout``. A sync call with a timeout runs in
  a thread (with the caller's context variables) that cannot be stopped, so
  for a ``write`` tool the effect is uncertain; an async call is cancelled by
  ``asyncio.wait_for``;
* a sync call that returns an awaitable (an async reconciler of a sync tool,
  say) is a programming error raised past the protocol, never journaled;
* a call that may outlive the workflow's own flow (an async one, or a sync
  one on another thread than the workflow's) is *in flight* for its execution
  from the moment its driver starts to its end (``Execution.enter``/``leave``),
  so the execution can wait for the calls of sibling tasks and threads before
  it gives up its claim, and refuse new ones (``Ended``) once it is ending. A
  sync call that outlived its timeout stays in flight until its thread
  returns: its effect may still land.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import inspect
from collections.abc import Awaitable, Callable, Generator
from threading import get_ident
from typing import Any, NoReturn, TypeVar

from cairn.engine.execution import CURRENT, Execution
from cairn.errors import CallCancelled, ToolTimeout

T = TypeVar("T")


class Invoke:
    """A request from a protocol to its driver: call ``fn(*args, **kwargs)``
    and send back what it returns (awaited, under ``run_async``).

    ``timeout`` bounds the call; on expiry the driver throws ``ToolTimeout``
    naming ``what``. A sync call cannot be stopped, so its thread may still
    finish later: a protocol must treat a timeout as "may have happened".

    ``effect`` says whether the call may change the outside world (a step or
    tool body). A timed-out effect stays in flight for its execution until its
    thread returns, since it may still land; a timed-out query (a reconciler)
    is abandoned: holding the claim for it would let a hung lookup hold the run.

    A plain slotted class, not a frozen dataclass, built with positional
    arguments: one is built per journaled call, and a frozen dataclass or
    keyword arguments cost several times as much.
    """

    __slots__ = ("args", "effect", "fn", "kwargs", "timeout", "what")

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        timeout: float | None = None,
        what: str = "call",
        effect: bool = True,
    ) -> None:
        self.fn = fn
        self.effect = effect
        self.args = args
        self.kwargs: dict[str, Any] = _NO_KWARGS if kwargs is None else kwargs
        self.timeout = timeout
        self.what = what


_NO_KWARGS: dict[str, Any] = {}


Protocol = Generator[Invoke, Any, T]


def run_sync(protocol: Protocol[T]) -> T:
    """Run ``protocol`` to its end, calling each requested function here.

    This is on the path of every journaled step, so it is written for speed:
    no work beyond the calls on the common path, and the protocol is closed
    explicitly only when something (``Suspend``, ``LeaseLost``, a misuse)
    escapes it, so its ``finally`` blocks run at once, not at collection.
    """
    send = protocol.send
    ex = CURRENT.get(None)
    # Only a call from another thread can still run when the workflow's own
    # thread ends the execution: only those are counted (and refused once it ends).
    counted = ex if ex is not None and get_ident() != ex.main_thread else None
    if counted is not None:
        counted.enter()
    try:
        request = next(protocol)
        while True:
            try:
                if request.timeout is None:
                    value = request.fn(*request.args, **request.kwargs)
                else:
                    value = _sync_with_timeout(request, ex)
            except Exception as exc:
                request = protocol.throw(exc)
                continue
            if type(value) not in _PLAIN and (hasattr(value, "__await__") or inspect.iscoroutine(value)):
                _misuse(request, value)
            request = send(value)
    except StopIteration as stop:
        result: T = stop.value
        return result
    except BaseException:
        protocol.close()
        raise
    finally:
        if counted is not None:
            counted.leave()


#: Result types that are never awaitable: skips the check on the hot path.
_PLAIN = frozenset({type(None), bool, int, float, str, bytes, dict, list, tuple})


async def run_async(protocol: Protocol[T]) -> T:
    """Run ``protocol`` to its end, calling each requested function and
    awaiting its result when it is awaitable (a plain function's result is
    used as it is: a sync tool or reconciler serves an async workflow)."""
    ex = CURRENT.get(None)
    if ex is not None:
        try:
            ex.enter()
        except BaseException:
            protocol.close()
            raise
    try:
        request = next(protocol)
        while True:
            try:
                if request.timeout is not None and not inspect.iscoroutinefunction(request.fn):
                    value = await _sync_bounded_async(request, ex)  # a plain function cannot be cancelled
                else:
                    value = request.fn(*request.args, **request.kwargs)
                if inspect.isawaitable(value):
                    value = await _bounded(value, request)
            except Exception as exc:
                request = protocol.throw(exc)
            except asyncio.CancelledError:
                if _cancelled_from_outside():
                    raise  # the caller (wait_for, a drain) cancelled: nothing is recorded
                # the body raised it on its own: a failure of the call, by its policy
                request = protocol.throw(CallCancelled(
                    f"{request.what} raised CancelledError, but nothing cancelled it"))
            else:
                request = protocol.send(value)
    except StopIteration as stop:
        result: T = stop.value
        return result
    except BaseException:
        protocol.close()
        raise
    finally:
        if ex is not None:
            ex.leave()


def _cancelled_from_outside() -> bool:
    """Whether the running task was asked to stop (``Task.cancel``): then
    ``CancelledError`` is the caller's, not a result of the call."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _misuse(request: Invoke, value: Any) -> NoReturn:
    """A sync call that returned an awaitable is a programming error, not a
    failure of the call: it is raised past the protocol, never journaled."""
    if inspect.iscoroutine(value):
        value.close()  # never started: no "never awaited" warning
    raise TypeError(f"{request.what} is async but was called from a sync workflow or tool: make it sync, "
                    "or make the workflow async")


async def _bounded(awaitable: Awaitable[Any], request: Invoke) -> Any:
    if request.timeout is None:
        return await awaitable
    try:
        return await asyncio.wait_for(awaitable, request.timeout)
    except TimeoutError:
        raise ToolTimeout(f"{request.what} did not return within {request.timeout}s") from None


async def _sync_bounded_async(request: Invoke, ex: Execution | None) -> Any:
    """A plain function with a timeout, under ``run_async``: run it in a
    thread (as ``run_sync`` does) and stop waiting at the timeout, so a sync
    tool or reconciler that hangs cannot hold an async run forever."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="cairn-call")
    context = contextvars.copy_context()
    try:
        future = pool.submit(context.run, request.fn, *request.args, **request.kwargs)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), request.timeout)
        except TimeoutError:
            if ex is not None and request.effect:
                ex.straggle(future)
            raise ToolTimeout(f"{request.what} did not return within {request.timeout}s", future) from None
    finally:
        pool.shutdown(wait=False)


def _sync_with_timeout(request: Invoke, ex: Execution | None) -> Any:
    """Python cannot stop a thread: on timeout the body may still finish
    later, which is why a timeout means "may have happened". The call stays
    in flight for its execution until the thread returns, so the claim is not
    given up (and the effect not reconciled by the next claim) while it may land."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="cairn-call")
    context = contextvars.copy_context()  # so the body sees step_info() and its execution
    future = pool.submit(context.run, request.fn, *request.args, **request.kwargs)
    try:
        return future.result(timeout=request.timeout)
    except concurrent.futures.TimeoutError:
        if ex is not None and request.effect:
            ex.straggle(future)
        raise ToolTimeout(f"{request.what} did not return within {request.timeout}s", future) from None
    finally:
        pool.shutdown(wait=False)


__all__ = ["Invoke", "Protocol", "run_async", "run_sync"]
