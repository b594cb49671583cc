"""Journaled steps: the unit of work whose result is recorded before the
workflow moves on, and returned from the record on replay.

The journaling logic is one protocol (``journaled``, see ``engine.drive``);
a sync step runs it with ``run_sync``, an ``async def`` step with ``run_async``.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, ParamSpec, TypeVar

from cairn import faults
from cairn.codec import values
from cairn.engine import credentials, workspace
from cairn.engine.credentials import SecretParams
from cairn.engine.definitions import StepDef
from cairn.engine.drive import Invoke, Protocol, run_async, run_sync
from cairn.engine.execution import CURRENT, Execution, operation_id
from cairn.engine.memory import step_memory
from cairn.errors import CairnError, PayloadError, SecretLeak
from cairn.faults import fault_point
from cairn.memory.api import Memory
from cairn.retry import RetryPolicy
from cairn.store.records import RunRecord

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
    #: logical rewinds that voided this position (part of the operation id)
    generation: int = 0

    @property
    def operation_id(self) -> str:
        return operation_id(self.run_id, self.position, self.generation)

    @property
    def memory(self) -> Memory:
        """Memory for this step body: its writes are buffered and commit
        with the step's journal entry (none if the attempt fails or the
        worker dies first); reads see what is committed."""
        return step_memory(CURRENT.get(None), self.position, self.attempt)

    @property
    def workspace(self) -> Path:
        """The run's workspace directory (``engine.workspace``): exactly the
        latest snapshot when the body started; what the body leaves in it is
        snapshotted and recorded with the step's outcome."""
        return workspace.attach(CURRENT.get(None), self.position)


#: Where the running step body is: (run, step name, position, attempt,
#: generation). A plain tuple, turned into a ``StepInfo`` only when a body
#: asks for it: a frozen dataclass per journaled call would cost more than
#: the driver.
STEP_INFO: contextvars.ContextVar[tuple[RunRecord, str, int, int, int]] = contextvars.ContextVar("cairn_step")


def step_info() -> StepInfo:
    """Identity of the step whose body is running; error outside a step."""
    where = STEP_INFO.get(None)
    if where is None:
        raise CairnError("step_info() is only available inside a step body")
    run, name, position, attempt, generation = where
    return StepInfo(run.run_id, run.tenant, run.thread_id, run.workflow, name, position, attempt, generation)


class Step(Generic[P, R]):
    """A function made into a journaled step by ``@app.step``.

    Called inside a workflow it is journaled; called anywhere else it is the
    plain function, which keeps steps easy to unit-test.
    """

    def __init__(self, definition: StepDef) -> None:
        self.definition = definition
        functools.update_wrapper(self, definition.fn)
        self._what = f"step {definition.name!r}"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        execution = CURRENT.get(None)
        if execution is None:
            result: R = self.definition.fn(*args, **kwargs)
            return result
        if self.definition.is_async and not execution.is_async:
            # checked here, at the call: a coroutine a sync workflow never
            # awaits would skip the step silently
            raise TypeError(f"async step {self.definition.name!r} called from a sync workflow: "
                            "make the step sync, or the workflow async")
        protocol = journaled(execution, self.definition, args, kwargs, self._what)
        if self.definition.is_async:
            return run_async(protocol)  # type: ignore[return-value]
        finished: R = run_sync(protocol)
        return finished


class Journaled(typing.Protocol):
    """What ``journaled`` needs of a definition: a step's, or a plain read
    tool's (``ToolDef.as_step``)."""

    @property
    def name(self) -> str: ...
    @property
    def fn(self) -> Callable[..., Any]: ...
    @property
    def retry(self) -> RetryPolicy: ...
    @property
    def result_type(self) -> Any: ...
    @property
    def secrets(self) -> SecretParams | None: ...


#: the fault point of ``journaled`` after the body, per kind (a tool's as ``_ToolCall``'s)
_FAULT_POINTS = {"step": "step.before_record", "tool": "tool.after_effect"}


def journaled(
    execution: Execution, definition: Journaled, args: tuple[Any, ...], kwargs: dict[str, Any], what: str,
    kind: str = "step",
) -> Protocol[Any]:
    """Replay the call's recorded outcome, or run its body once and record
    what it returned (or its failure, by the retry policy).

    A step's protocol, and a read tool's that asks for nothing a step has
    not (no ``Operation``, approval, timeout or result schema): such a tool
    has nothing to protect, so it is journaled exactly like a step, under
    its own kind, after the budget's check of one more tool call."""
    params = definition.secrets
    if params is not None:
        params.check(args, kwargs, what)
    call = execution.begin(kind, definition.name, input_hash(args, kwargs, what))
    if call.recorded is not None:
        return execution.replay(call, definition.result_type)
    if kind == "tool" and execution.budget is not None:
        execution.check_budget(tool_call=True)
    token = STEP_INFO.set((execution.run, definition.name, call.position, call.attempt,
                           execution.journal.generation(call.position)))
    try:
        if execution.workspace is not None or not execution.workspace_checked:
            ws = workspace.current(execution)
            if ws is not None:  # the directory is the latest snapshot before the body runs
                ws.enter(call.position)
        if params is None:
            value = yield Invoke(definition.fn, args, kwargs, None, what)
        else:
            value = yield from _with_secrets(execution, definition, params, args, kwargs, what)
        detail = _captured(execution, call.position)
    except Exception as exc:
        _abandoned(execution, call.position)
        execution.fail_by_policy(call, exc, definition.retry)
    except BaseException:
        _abandoned(execution, call.position)
        raise
    finally:
        STEP_INFO.reset(token)
    if faults.ARMED:
        fault_point(_FAULT_POINTS[kind])
    if detail is None:
        outcome = execution.complete_call(call, value, definition.result_type, policy=definition.retry)
    else:
        outcome = _complete_with_workspace(execution, call, value, definition, detail)
    if faults.ARMED and kind == "tool":
        fault_point("tool.after_record")
    return outcome


def _captured(execution: Execution, position: int) -> dict[str, Any] | None:
    """After a body returned: the detail naming its workspace snapshot (``None``: no workspace)."""
    ws = execution.workspace
    return None if ws is None else ws.capture(position)


def _abandoned(execution: Execution, position: int) -> None:
    ws = execution.workspace
    if ws is not None:
        ws.abandon(position)


def _complete_with_workspace(
    execution: Execution, call: Any, value: Any, definition: Journaled, detail: dict[str, Any]
) -> Any:
    try:
        outcome = execution.complete_call(call, value, definition.result_type, detail,
                                          policy=definition.retry)
    except BaseException:
        _abandoned(execution, call.position)
        raise
    execution.workspace.recorded(detail[workspace.DETAIL_KEY])
    return outcome


def _with_secrets(
    execution: Execution, definition: Journaled, params: SecretParams, args: tuple[Any, ...],
    kwargs: dict[str, Any], what: str,
) -> Protocol[Any]:
    """The body with its secrets resolved now (for this attempt, on this
    worker), run again at once with refreshed ones if it says they expired
    (``engine.credentials``); any other failure goes to the retry policy."""
    refreshes = 0
    while True:
        body_args, body_kwargs, used = params.resolve(execution, args, kwargs, what)
        try:
            return (yield Invoke(definition.fn, body_args, body_kwargs, None, what))
        except Exception as exc:
            execution.drop_memory(STEP_INFO.get()[2])  # the body failed: its writes never land
            if not credentials.should_refresh(execution, exc, used, refreshes, write=False):
                raise
            credentials.refresh(execution, exc, used, refreshes, what)
            refreshes += 1


def input_hash(args: tuple[Any, ...], kwargs: dict[str, Any], what: str = "the call") -> str | None:
    """Fingerprint of a call's arguments; ``None`` when they are not
    JSON-encodable (a client object, say), in which case they are not compared.
    A resolved secret among them is refused (``SecretLeak``): it would be
    recorded wherever the arguments are (a write tool's intent)."""
    try:
        data = values.encode((args, kwargs) if kwargs else args)
    except SecretLeak as leak:
        raise SecretLeak(f"the arguments of {what}: {leak}") from None
    except PayloadError:
        return None
    return hashlib.blake2b(data, digest_size=8).hexdigest()  # values.digest, without the call

