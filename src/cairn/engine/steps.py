"""Journaled steps: the unit of work whose result is recorded before the
workflow moves on, and returned from the record on replay.

The journaling logic is written once (``_start`` and ``_finish``); the sync
and async call paths differ only in whether the body is awaited.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, TypeVar

from cairn.codec import values
from cairn.engine.definitions import StepDef
from cairn.engine.execution import Call, Execution, current, operation_id
from cairn.errors import CairnError, PayloadError
from cairn.faults import fault_point

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class StepInfo:
    """Who is running: available to a step body through ``cairn.step_info()``.

    ``operation_id`` is fixed before the body runs and is identical on every
    retry, after every crash and on every worker: pass it to external systems
    as an idempotency key.
    """

    run_id: str
    tenant: str
    thread_id: str | None
    workflow: str
    step: str
    position: int
    attempt: int

    @property
    def operation_id(self) -> str:
        return operation_id(self.run_id, self.position)


STEP_INFO: contextvars.ContextVar[StepInfo] = contextvars.ContextVar("cairn_step")


def step_info() -> StepInfo:
    """Identity of the step whose body is running; error outside a step."""
    info = STEP_INFO.get(None)
    if info is None:
        raise CairnError("step_info() is only available inside a step body")
    return info


class Step(Generic[P, R]):
    """A function made into a journaled step by ``@app.step``.

    Called inside a workflow it is journaled; called anywhere else it is the
    plain function, which keeps steps easy to unit-test.
    """

    def __init__(self, definition: StepDef) -> None:
        self.definition = definition
        functools.update_wrapper(self, definition.fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        execution = current()
        if execution is None:
            result: R = self.definition.fn(*args, **kwargs)
            return result
        if self.definition.is_async:
            return self._call_async(execution, args, kwargs)  # type: ignore[return-value]
        call, info = _start(execution, self.definition, args, kwargs)
        if call.recorded is not None:
            replayed: R = execution.replay(call, self.definition.result_type)
            return replayed
        token = STEP_INFO.set(info)
        try:
            value = self.definition.fn(*args, **kwargs)
        except Exception as exc:
            _fail(execution, self.definition, call, exc)
        finally:
            STEP_INFO.reset(token)
        fault_point("step.before_record")
        finished: R = execution.complete_call(call, value, self.definition.result_type)
        return finished

    async def _call_async(self, execution: Execution, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        call, info = _start(execution, self.definition, args, kwargs)
        if call.recorded is not None:
            return execution.replay(call, self.definition.result_type)
        token = STEP_INFO.set(info)
        try:
            fn: Callable[..., Coroutine[Any, Any, Any]] = self.definition.fn
            value = await fn(*args, **kwargs)
        except Exception as exc:
            _fail(execution, self.definition, call, exc)
        finally:
            STEP_INFO.reset(token)
        fault_point("step.before_record")
        return execution.complete_call(call, value, self.definition.result_type)


def input_hash(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """Fingerprint of a call's arguments; ``None`` when they are not
    JSON-encodable (a client object, say), in which case they are not compared."""
    try:
        return values.digest(values.encode((args, kwargs) if kwargs else args))
    except PayloadError:
        return None


def _start(
    execution: Execution, definition: StepDef, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Call, StepInfo]:
    if definition.is_async and not execution.is_async:
        raise TypeError(f"async step {definition.name!r} called from a sync workflow")
    call = execution.begin("step", definition.name, input_hash(args, kwargs))
    run = execution.run
    info = StepInfo(run.run_id, run.tenant, run.thread_id, run.workflow, definition.name, call.position,
                    call.attempt)
    return call, info


def _fail(execution: Execution, definition: StepDef, call: Call, exc: Exception) -> None:
    execution.fail_by_policy(call, exc, definition.retry)
