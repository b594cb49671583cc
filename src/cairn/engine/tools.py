"""Tools: journaled calls that touch the outside world, exactly once.

A tool declares its *effect*:

* ``read`` — changes nothing outside; after a crash it simply runs again.
* ``idempotent`` — safe to repeat with the same key; after a crash it is sent
  again with the same ``operation_id``.
* ``write`` — must happen at most once. Before it runs, its *intent*
  (operation id, tool, arguments) is committed behind an effect barrier
  (durable on stable storage even in the fast durability mode). After a crash
  between intent and result the effect is *uncertain*: the tool's
  ``reconcile`` function asks the outside world what happened
  (``Done(result)`` / ``NotFound()`` / ``Unknown()``); without one the run
  waits in ``needs_attention`` for an operator. Never a blind resend.

The ``operation_id`` is derived from (run id, position, and the number of
logical rewinds that voided that position), so it is fixed before the first
attempt and identical on every retry, crash and worker, and a call re-run
after a rewind (a new intended effect) gets a new one.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import enum
import functools
import inspect
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, NoReturn, ParamSpec, TypeVar

import msgspec

from cairn import faults
from cairn.codec import values
from cairn.engine import approvals, credentials, workspace
from cairn.engine.access import ToolAccess, refuse
from cairn.engine.approvals import ApprovalPolicy
from cairn.engine.credentials import SecretParams
from cairn.engine.definitions import hints_of
from cairn.engine.drive import Invoke, Protocol, run_async, run_sync
from cairn.engine.execution import CURRENT, Execution, current, operation_id
from cairn.engine.memory import step_memory
from cairn.engine.signals import Suspend
from cairn.engine.steps import STEP_INFO, _abandoned, _captured, input_hash, journaled
from cairn.errors import (
    EffectNotApplied,
    NonDeterminismError,
    PayloadError,
    SecretError,
    ToolResultInvalid,
    ToolTimeout,
)
from cairn.faults import fault_point
from cairn.memory.api import Memory
from cairn.retry import NO_RETRY, RetryPolicy, TerminalError
from cairn.security import redaction
from cairn.security.secrets import Secret
from cairn.store.records import EventType, HistoryEvent, RunStatus

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class Effect(enum.StrEnum):
    READ = "read"
    IDEMPOTENT = "idempotent"
    WRITE = "write"


@dataclass(frozen=True, slots=True)
class Operation:
    """One tool call's identity, handed to the tool and to its reconciler.

    ``operation_id`` is the idempotency key to send to the outside world.
    ``arguments`` are the call's arguments as recorded in the intent (plain
    JSON values), which is what a reconciler sees after a crash.
    """

    operation_id: str
    tool: str
    effect: Effect
    run_id: str
    tenant: str
    thread_id: str | None
    position: int
    attempt: int
    arguments: dict[str, Any] = field(default_factory=dict)

    @property
    def memory(self) -> Memory:
        """Memory for this tool body: writes commit with the tool's result
        entry (so exactly once per recorded call); reads see what is committed."""
        return step_memory(current(), self.position, self.attempt)

    @property
    def workspace(self) -> Path:
        """The run's workspace directory (``engine.workspace``): exactly the
        latest snapshot when the body started; what the body leaves in it is
        its recorded effect, snapshotted with the tool's result entry."""
        return workspace.attach(CURRENT.get(None), self.position)


#: ``Operation``'s fields in order, set by ``_operation_of`` (checked below).
_OPERATION_FIELDS = ("operation_id", "tool", "effect", "run_id", "tenant", "thread_id", "position", "attempt",
                     "arguments")
if tuple(f.name for f in dataclasses.fields(Operation)) != _OPERATION_FIELDS:  # pragma: no cover
    raise RuntimeError("tools._OPERATION_FIELDS no longer lists Operation's fields")
(_set_operation_id, _set_tool, _set_effect, _set_run_id, _set_tenant, _set_thread_id, _set_position,
 _set_attempt, _set_arguments) = (Operation.__dict__[name].__set__ for name in _OPERATION_FIELDS)
_new_object = object.__new__


def _operation_of(
    operation_id: str, tool: str, effect: Effect, run_id: str, tenant: str, thread_id: str | None,
    position: int, attempt: int, arguments: dict[str, Any],
) -> Operation:
    """``Operation(...)`` with these fields, built by setting its slots
    directly: the frozen dataclass's ``__init__`` goes through
    ``object.__setattr__`` once per field, which cost about as much as
    computing the operation id (the engine builds one per side-effecting
    call; the instance is the same frozen object either way)."""
    op: Operation = _new_object(Operation)
    _set_operation_id(op, operation_id)
    _set_tool(op, tool)
    _set_effect(op, effect)
    _set_run_id(op, run_id)
    _set_tenant(op, tenant)
    _set_thread_id(op, thread_id)
    _set_position(op, position)
    _set_attempt(op, attempt)
    _set_arguments(op, arguments)
    return op


@dataclass(frozen=True, slots=True)
class Done(Generic[T]):
    """Reconciliation found the effect applied; ``result`` is recorded as the
    tool's result without executing it again."""

    result: T


@dataclass(frozen=True, slots=True)
class NotFound:
    """Reconciliation found no trace of the effect: execute it (same key)."""


@dataclass(frozen=True, slots=True)
class Unknown:
    """The outside world cannot tell yet: ask again after a backoff (the
    tool's ``reconcile_retry``); after its ``max_attempts`` answers the run
    goes to ``needs_attention``. A reconciler that raises or times out counts
    as ``Unknown``; one that answers anything else is a programming error and
    goes to ``needs_attention`` at once."""

    reason: str = ""


Reconciliation = Done[Any] | NotFound | Unknown
Reconciler = Callable[[Operation], Reconciliation | Awaitable[Reconciliation]]

#: Backoff between reconciliation attempts that answer ``Unknown``, and how
#: many such answers (about an hour of them) before an operator is asked.
RECONCILE_RETRY = RetryPolicy(max_attempts=20, initial_delay=1.0, backoff=2.0, max_delay=300.0)

#: How long a reconciler may take when its tool sets no ``timeout`` (a
#: reconciler that hangs must not hold the run, and its worker, forever).
RECONCILE_TIMEOUT = 60.0

#: Operation id -> a timed-out sync call of it still running in a thread of
#: this process. While it runs the operation is in flight: it is neither
#: reconciled (a lookup would answer "not found" for an effect about to land)
#: nor sent again, so one operation never has two attempts in flight.
_IN_FLIGHT: dict[str, concurrent.futures.Future[Any]] = {}
_IN_FLIGHT_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class ToolDef:
    name: str
    fn: Callable[..., Any]
    is_async: bool
    effect: Effect
    reconcile: Reconciler | None
    timeout: float | None
    schema: Any
    result_type: Any
    retry: RetryPolicy
    wants_operation: bool
    reconcile_retry: RetryPolicy
    #: the signature callers use (without the injected ``Operation``), computed once
    call_signature: inspect.Signature
    #: parameters annotated ``SecretValue``: resolved from references just before the body runs
    secrets: SecretParams | None = None
    #: the names of ``call_signature``'s parameters when a call passing each of
    #: them positionally binds them in that order (``_bind``'s fast path); ``None``
    #: when a parameter is keyword-only or variadic (``Signature.bind`` decides)
    positional: tuple[str, ...] | None = None

    # -- protected tools (``engine.approvals``): approval before the intent --------------
    #: ``True``, or a policy of the bound arguments; ``None``: never asks
    approval: ApprovalPolicy | None = None
    approvers: tuple[str, ...] | None = None
    approval_timeout: float | None = None
    #: the type the arguments are approved (and edited) as
    arguments_type: Any = None
    #: who may call it (``engine.access``); ``None``: anyone
    access: ToolAccess | None = None
    #: the body bounds its own wait by ``timeout`` (an MCP call: the session
    #: stops waiting and cancels the request itself), so the driver calls it
    #: inline rather than on a thread per call, which cost more than the
    #: call's own journaling; ``timeout`` still bounds the reconciler
    timed_by_body: bool = False

    @property
    def as_step(self) -> bool:
        """A read tool asking for nothing a step does not have (no
        ``Operation``, approval, timeout or result schema): nothing to
        protect, so it is journaled by the step's protocol (``steps.journaled``)."""
        return (self.effect is Effect.READ and not self.wants_operation and self.approval is None
                and self.timeout is None and self.schema is None)

    @classmethod
    def build(
        cls,
        fn: Callable[..., Any],
        *,
        name: str | None,
        effect: Effect | str,
        reconcile: Reconciler | None,
        timeout: float | None,
        schema: Any,
        retry: RetryPolicy | None,
        reconcile_retry: RetryPolicy | None,
        approval: ApprovalPolicy | None = None,
        approvers: tuple[str, ...] | list[str] | str | None = None,
        approval_timeout: float | None = None,
        access: ToolAccess | None = None,
        timed_by_body: bool = False,
    ) -> ToolDef:
        kind = Effect(effect)
        if access is not None and not isinstance(access, ToolAccess):
            raise TypeError(f"tool {name or fn.__name__!r}: access= is a cairn.ToolAccess, not {access!r}")
        if reconcile is not None and kind is not Effect.WRITE:
            raise ValueError("reconcile= is only meaningful for effect='write' tools")
        is_async = inspect.iscoroutinefunction(fn)
        if reconcile is not None and not is_async and _is_async_callable(reconcile):
            # it would fail only after an uncertain outcome, the worst moment to find out
            raise TypeError(f"tool {name or fn.__name__!r} is sync but its reconcile function is async: "
                            "make both sync or both async")
        hints = hints_of(fn)
        signature = inspect.signature(fn)
        params = list(signature.parameters.values())
        wants_operation = bool(params) and hints.get(params[0].name) is Operation
        result_type = schema if schema is not None else hints.get("return", Any)
        values.decoder_for(result_type)
        call_signature = signature.replace(parameters=params[1:] if wants_operation else params)
        protected = _protection(name or fn.__name__, call_signature, hints, approval, approvers,
                                approval_timeout)
        return cls(
            name=name or fn.__name__, fn=fn, is_async=is_async, effect=kind,
            reconcile=reconcile, timeout=timeout, schema=schema, result_type=result_type,
            retry=retry or NO_RETRY, wants_operation=wants_operation,
            reconcile_retry=reconcile_retry or RECONCILE_RETRY,
            call_signature=call_signature, secrets=SecretParams.of(call_signature, hints),
            positional=_positional_names(call_signature), access=access, timed_by_body=timed_by_body,
            **protected,
        )


def _protection(
    name: str, call_signature: inspect.Signature, hints: dict[str, Any], approval: ApprovalPolicy | None,
    approvers: tuple[str, ...] | list[str] | str | None, approval_timeout: float | None,
) -> dict[str, Any]:
    """The ``ToolDef`` fields of a protected tool (``approval=``), checked at registration."""
    if approval is None or approval is False:
        if approvers is not None or approval_timeout is not None:
            raise ValueError(f"tool {name!r}: approvers= and approval_timeout= need approval=")
        return {}
    if approval is not True and not callable(approval):
        raise TypeError(f"tool {name!r}: approval= is True or a function of the arguments, not {approval!r}")
    chosen = (approvers,) if isinstance(approvers, str) else (None if approvers is None else tuple(approvers))
    if chosen is not None and (not chosen or not all(isinstance(a, str) and a for a in chosen)):
        raise ValueError(f"tool {name!r}: approvers= names one or more identities or user names")
    if approval_timeout is not None and not approval_timeout >= 0:
        raise ValueError(f"tool {name!r}: approval_timeout= is a number of seconds >= 0")
    return {"approval": approval, "approvers": chosen, "approval_timeout": approval_timeout,
            "arguments_type": approvals.arguments_type(name, call_signature, hints)}


def _positional_names(signature: inspect.Signature) -> tuple[str, ...] | None:
    """The parameter names a fully positional call binds, in order, when
    every parameter can be passed positionally and none is variadic."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = signature.parameters.values()
    return tuple(p.name for p in params) if all(p.kind in kinds for p in params) else None


def bind(d: ToolDef, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments of a call of ``d`` by name, as ``Signature.bind`` gives
    them (``TypeError`` if they do not fit). A call passing every parameter
    positionally and nothing else (the common case) is zipped with the names,
    which is what ``bind`` returns for it in a tenth of the time."""
    names = d.positional
    if names is not None and not kwargs and len(args) == len(names):
        return dict(zip(names, args, strict=True))
    return dict(d.call_signature.bind(*args, **kwargs).arguments)


def _is_async_callable(fn: Callable[..., Any]) -> bool:
    """``async def`` functions, and objects whose ``__call__`` is one."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    method = None if inspect.isroutine(target) else type(target).__dict__.get("__call__")
    return inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(method)


class Tool(Generic[P, R]):
    """A function made into a journaled tool by ``@app.tool``.

    Called inside a workflow it goes through the operation ledger; called
    anywhere else it is the plain function (with a throwaway ``Operation`` if
    it asks for one), which keeps tools easy to unit-test.
    """

    def __init__(self, definition: ToolDef) -> None:
        self.definition = definition
        functools.update_wrapper(self, definition.fn)
        self._what = f"tool {definition.name!r}"
        # sync only: an async tool takes its position at the call, before it
        # is awaited (``_ToolCall``), which a protocol started by the driver would not
        self._as_step = definition.as_step and not definition.is_async

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        execution = CURRENT.get(None)  # ``current()``, inlined: once per call
        if execution is None:
            return self._detached(args, kwargs)  # type: ignore[no-any-return]
        access = self.definition.access
        if access is not None:
            refusal = access.refusal_in(execution)
            if refusal is not None:
                refuse(execution, self.definition.name, f"tool {self.definition.name!r} refused: {refusal}")
        # The position is taken now, at the call (not when an async tool is
        # awaited), so tools started together keep their call order.
        protocol = (journaled(execution, self.definition, args, kwargs, self._what, "tool") if self._as_step
                    else _ToolCall(execution, self.definition, args, kwargs, self._what).protocol())
        if self.definition.is_async:
            return run_async(protocol)  # type: ignore[return-value]
        return run_sync(protocol)  # type: ignore[no-any-return]

    def _detached(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        d = self.definition
        if not d.wants_operation:
            return d.fn(*args, **kwargs)
        op = Operation(operation_id(f"detached-{time.time_ns()}", 0), d.name, d.effect, "", "default",
                       None, 0, 1)
        return d.fn(op, *args, **kwargs)


class _ToolCall:
    """One call of a tool inside a run: the ledger protocol, written once for
    the sync and async paths (``protocol`` yields the body and the reconciler
    to the driver, which calls them, awaiting them if async).

    A sync tool with a ``timeout`` runs in a thread that cannot be stopped
    (its effect is uncertain on timeout); an async one is cancelled by
    ``asyncio.wait_for``. A sync tool whose reconciler is async is a
    programming error, raised by ``run_sync`` and never journaled."""

    __slots__ = ("args", "call", "d", "encoded_arguments", "ex", "failure", "kwargs", "operation", "outcome",
                 "refreshes", "what")

    def __init__(
        self, ex: Execution, d: ToolDef, args: tuple[Any, ...], kwargs: dict[str, Any], what: str
    ) -> None:
        if d.is_async and not ex.is_async:
            raise TypeError(f"async tool {d.name!r} called from a sync workflow")
        self.ex = ex
        self.d = d
        self.what = what
        if d.approval is not None:  # a protected tool: approved first, then exactly what was approved runs
            approved = approvals.guard(ex, d, args, kwargs)
            if approved is not None:
                args, kwargs = (), approved
        self.args = args
        self.kwargs = kwargs
        if d.secrets is not None:
            d.secrets.check(args, kwargs, what)
        self.call = ex.begin("tool", d.name, input_hash(args, kwargs, what))
        self.operation: Operation | None = None
        self.encoded_arguments: bytes | None = None
        self.outcome: Any = None
        #: the exception of this execution's own attempt, when it left the effect
        #: uncertain: if reconciliation then finds nothing, the attempt failed
        #: and the tool's retry policy decides (durable backoff, bounded attempts)
        self.failure: Exception | None = None
        #: how often this attempt's secrets were refreshed after an expired credential
        self.refreshes = 0

    @property
    def op(self) -> Operation:
        """The operation of a side-effecting call (always built for those)."""
        assert self.operation is not None
        return self.operation

    # -- the protocol (driven by ``run_sync`` or ``run_async``) ------------------------

    def protocol(self) -> Protocol[Any]:
        """Replay, reconcile, or execute (then record) this call. Each
        ``yield`` hands the tool body or the reconciler to the driver."""
        plan = self._plan()
        while True:
            if plan is _RECORDED:
                return self.outcome
            if plan is _RECONCILE:
                assert self.d.reconcile is not None
                if self.ex.straggling():  # an attempt that timed out may still land: ask once it has
                    raise Suspend("reconcile", wake_at=time.time())
                self._wait_in_flight()
                timeout = self.d.timeout if self.d.timeout is not None else RECONCILE_TIMEOUT
                try:
                    answer = yield Invoke(self.d.reconcile, (self.op,), None, timeout,
                                          f"reconcile of tool {self.d.name!r}", effect=False)
                except Exception as exc:  # a failing reconciler knows nothing: try again later
                    answer = Unknown(f"reconcile raised {type(exc).__qualname__}: {exc}")
                plan = self._reconciled(answer)
                continue
            # _EXECUTE (first attempt, or reconciliation found nothing: same key)
            token = STEP_INFO.set((self.ex.run, self.d.name, self.call.position, self.call.attempt,
                                   self.ex.journal.generation(self.call.position)))
            used: tuple[Secret, ...] = ()
            try:
                if self.d.secrets is None:  # ``_body_call`` without secrets, inlined
                    body_args, body_kwargs = self._body_args(), self.kwargs
                else:
                    body_args, body_kwargs, used = self._body_call()
            except SecretError as exc:  # the body never ran: a definite failure, whatever the effect
                STEP_INFO.reset(token)
                self.ex.fail_by_policy(self.call, exc, self.d.retry)
            try:
                if self.ex.workspace is not None or not self.ex.workspace_checked:
                    ws = workspace.current(self.ex)
                    if ws is not None:  # the directory is the latest snapshot before the body runs
                        ws.enter(self.call.position)
                value = yield Invoke(self.d.fn, body_args, body_kwargs,
                                     None if self.d.timed_by_body else self.d.timeout, self.what)
                captured = _captured(self.ex, self.call.position)
            except Exception as exc:
                self.ex.drop_memory(self.call.position)  # the body failed: its writes never land
                _abandoned(self.ex, self.call.position)
                failure = self._refresh(exc, used)
                if failure is not None:
                    plan = self._failed(failure)
                continue  # refreshed: the same attempt again, same operation id
            except BaseException:
                _abandoned(self.ex, self.call.position)
                raise
            finally:
                STEP_INFO.reset(token)
            if captured is None:
                return self._succeeded(value)
            snapshot = captured[workspace.DETAIL_KEY]
            try:
                outcome = self._succeeded(value, snapshot)
            except BaseException:
                _abandoned(self.ex, self.call.position)
                raise
            self.ex.workspace.recorded(snapshot)
            return outcome

    # -- the ledger protocol -------------------------------------------------------

    def _plan(self) -> object:
        """Decide what this call does: return a recorded outcome, reconcile an
        uncertain effect, or execute (after a durable intent if it writes)."""
        ex, call, d = self.ex, self.call, self.d
        if call.recorded is not None:
            self.outcome = ex.replay(call, d.result_type)
            return _RECORDED
        if ex.budget is not None:
            ex.check_budget(tool_call=True)
        if d.effect is Effect.READ:  # nothing to protect: no intent, and no Operation unless asked for
            self.operation = self._operation() if d.wants_operation else None
            return _EXECUTE
        if call.position >= ex.journal.end:
            # past the journal's end: nothing recorded here (no intent, no
            # reconciliation), so nothing is uncertain: the live path of every
            # side-effecting call, without the lookups that would say so
            self.operation = self._operation(recorded=False)
            self._wait_in_flight()
            self._intent()
            return _EXECUTE
        self.operation = self._operation()
        self._wait_in_flight()
        uncertain = ex.journal.uncertain(call.position)
        if uncertain is None:
            self._intent()
            return _EXECUTE
        if d.effect is Effect.IDEMPOTENT:
            return _EXECUTE  # same operation id: the outside world deduplicates
        if d.reconcile is None:
            self._needs_attention("no reconcile function: an operator must say whether it happened")
        if uncertain.event is EventType.OP_RECONCILED:
            due = float((uncertain.detail or {}).get("next_at") or 0.0)
            if due > time.time():
                raise Suspend("reconcile", wake_at=due)
        return _RECONCILE

    def _operation(self, *, recorded: bool = True) -> Operation:
        """The call's ``Operation``; ``recorded=False`` when the journal
        holds nothing at its position (so no recorded intent to read)."""
        ex, call, d = self.ex, self.call, self.d
        intent = ex.journal.intents.get(call.position) if recorded else None
        if (intent is not None and intent.payload is not None
                and ex.journal.uncertain(call.position) is not None):
            # after a crash the reconciler sees what the intent recorded
            loaded = ex.runtime.payloads.load(intent.payload, dict[str, Any], what="recorded intent")
            arguments: dict[str, Any] = loaded
        else:
            arguments = self._arguments(as_json=d.effect is not Effect.READ)
        run = ex.run
        return _operation_of(ex.operation_id(call.position), d.name, d.effect, ex.run_id, run.tenant,
                             run.thread_id, call.position, call.attempt, arguments)

    def _arguments(self, *, as_json: bool) -> dict[str, Any]:
        """The call's arguments by name; ``as_json`` gives them as plain JSON
        values, exactly as the intent records them and a reconciler sees them."""
        try:
            arguments = bind(self.d, self.args, self.kwargs)
            if not as_json:
                return arguments
            self.encoded_arguments = values.encode(arguments)
            plain: dict[str, Any] = msgspec.json.decode(self.encoded_arguments)
            return plain
        except (TypeError, PayloadError):
            return {}

    def _intent(self) -> None:
        """Commit the intent behind the effect barrier, then (and only then)
        may the tool touch the outside world."""
        op, ex, call = self.op, self.ex, self.call
        payloads = ex.runtime.payloads
        encoded = self.encoded_arguments
        payload = payloads.wrap(encoded) if encoded is not None else payloads.dump(op.arguments)[0]
        # built positionally, in field order (as ``record_outcome`` does): keyword arguments through
        # ``entry`` cost twice as much, on every side-effecting call
        ex.append(HistoryEvent(
            ex.run_id, ex.seq, EventType.OP_INTENT, time.time(), ex.epoch, ex.worker, op.position, "tool",
            op.tool, call.input_hash, call.attempt, None, payload,
            {"operation_id": op.operation_id, "effect": op.effect._value_},
        ), barrier=True)
        if faults.ARMED:
            fault_point("tool.after_intent")

    def _reconciled(self, answer: object) -> object:
        op, call, ex = self.op, self.call, self.ex
        base = {"operation_id": op.operation_id}
        if isinstance(answer, Done):
            self.outcome = self._record(self._validated(answer.result), {**base, "reconciled": "done"})
            return _RECORDED
        if isinstance(answer, NotFound):
            ex.append(ex.entry(EventType.OP_RECONCILED, position=op.position, step_kind="tool", name=op.tool,
                               attempt=call.attempt,
                               detail={**base, "outcome": "not_found", "tries": self._tries()}))
            failure, self.failure = self.failure, None
            if failure is not None:
                # our own attempt raised and the world has no trace of it: a
                # definite failure, so the retry policy decides (never a hot loop)
                ex.fail_by_policy(call, failure, self.d.retry)
            return _EXECUTE  # after a crash: the intent was never sent, send it (same key)
        if not isinstance(answer, Unknown):
            shown = repr(answer)[:200]
            self._needs_attention(f"reconcile returned {shown}, not Done(...), NotFound() or Unknown(...)")
        tries = self._tries() + 1
        next_at = time.time() + self.d.reconcile_retry.delay(tries)
        ex.append(ex.entry(EventType.OP_RECONCILED, position=op.position, step_kind="tool", name=op.tool,
                           attempt=call.attempt,
                           detail={**base, "outcome": "unknown", "reason": redaction.redact(answer.reason),
                                   "tries": tries, "next_at": next_at}))
        if tries >= self.d.reconcile_retry.max_attempts:
            self._needs_attention(f"reconcile could not tell after {tries} tries: {answer.reason}")
        raise Suspend("reconcile", wake_at=next_at)

    def _tries(self) -> int:
        """How many reconciliations of this attempt answered ``Unknown`` (kept
        across re-executions after ``NotFound``, so the bound holds for a tool
        that keeps failing; a new intent, after a retry, starts again at 0)."""
        state = self.ex.journal.op_state.get(self.call.position)
        if state is None or state.event is not EventType.OP_RECONCILED:
            return 0
        return int((state.detail or {}).get("tries", 0))

    def _wait_in_flight(self) -> None:
        """Suspend while a timed-out attempt of this operation still runs in
        this process: it may land any moment, so it is neither looked up nor
        sent again until it has ended."""
        if not _IN_FLIGHT:  # nothing timed out in this process (read under the GIL: a dict's size)
            return
        op_id = self.op.operation_id
        with _IN_FLIGHT_LOCK:
            pending = _IN_FLIGHT.get(op_id)
        if pending is not None and not pending.done():
            raise Suspend("in_flight", wake_at=time.time() + self.d.reconcile_retry.delay(1))

    def _track_in_flight(self, exc: Exception) -> None:
        if not isinstance(exc, ToolTimeout) or exc.pending is None or self.operation is None:
            return
        pending, op_id = exc.pending, self.operation.operation_id
        with _IN_FLIGHT_LOCK:
            _IN_FLIGHT[op_id] = pending

        def forget(done: concurrent.futures.Future[Any]) -> None:
            with _IN_FLIGHT_LOCK:
                if _IN_FLIGHT.get(op_id) is done:
                    del _IN_FLIGHT[op_id]

        pending.add_done_callback(forget)

    def _needs_attention(self, why: str) -> NoReturn:
        op = self.op
        detail = {"position": op.position, "operation_id": op.operation_id, "tool": op.tool,
                  "arguments": op.arguments, "why": redaction.redact(why)}
        raise Suspend("needs_attention", status=RunStatus.NEEDS_ATTENTION, detail=detail)

    # -- executing the body ------------------------------------------------------------

    def _body_args(self) -> tuple[Any, ...]:
        return (self.operation, *self.args) if self.d.wants_operation else self.args

    def _body_call(self) -> tuple[tuple[Any, ...], dict[str, Any], tuple[Secret, ...]]:
        """The body's arguments, its secrets resolved for this attempt
        (``engine.credentials``), and the references resolved."""
        params = self.d.secrets
        if params is None:
            return self._body_args(), self.kwargs, ()
        args, kwargs, used = params.resolve(self.ex, self.args, self.kwargs, self.what)
        return ((self.operation, *args) if self.d.wants_operation else args), kwargs, used

    def _refresh(self, exc: Exception, used: tuple[Secret, ...]) -> Exception | None:
        """``None`` once the secrets of an attempt refused for an expired
        credential are refreshed (run it again); else the failure to classify.
        A ``write`` tool is sent again only after ``CredentialExpired``, which
        says the request was refused before anything changed."""
        write = self.d.effect is Effect.WRITE
        if not credentials.should_refresh(self.ex, exc, used, self.refreshes, write=write):
            return exc
        try:
            credentials.refresh(self.ex, exc, used, self.refreshes, self.what)
        except EffectNotApplied as failed:  # the refresh failed: a definite failure of the attempt
            return failed
        self.refreshes += 1
        return None

    def _detail(self) -> dict[str, Any] | None:
        return {"operation_id": self.operation.operation_id} if self.operation is not None else None

    def _succeeded(self, value: Any, snapshot: str | None = None) -> Any:
        if faults.ARMED:
            fault_point("tool.after_effect")
        op = self.operation
        detail = {"operation_id": op.operation_id} if op is not None else None
        if snapshot is not None:  # the workspace as the body left it (engine.workspace)
            detail = {**(detail or {}), workspace.DETAIL_KEY: snapshot}
        outcome = self._record(self._validated(value) if self.d.schema is not None else value, detail)
        if faults.ARMED:
            fault_point("tool.after_record")
        return outcome

    def _record(self, result: Any, detail: dict[str, Any] | None) -> Any:
        """Record the call's result. One that cannot be recorded (it does not
        encode, or not back into the tool's type) is not a failure of a
        ``write`` tool: its effect happened, so an operator must settle it."""
        try:
            payload, outcome = self.ex.prepare(self.call, result, self.d.result_type)
        except PayloadError as exc:
            if self.d.effect is Effect.WRITE:
                self._needs_attention(f"the effect happened but its result cannot be recorded: {exc}")
            self.ex.fail_by_policy(self.call, exc, self.d.retry)
        self.ex.record_outcome(self.call, payload, detail)
        return outcome

    def _validated(self, value: Any) -> Any:
        if self.d.schema is None:
            return value
        try:
            return msgspec.convert(msgspec.to_builtins(value, enc_hook=values.enc_hook), self.d.schema,
                                   dec_hook=values.dec_hook)
        except (msgspec.ValidationError, TypeError, NotImplementedError, ValueError) as exc:
            error = ToolResultInvalid(self.d.name, str(exc))
            self.ex.fail_call(self.call, error, retryable=False, retry_delay=None)

    def _failed(self, exc: Exception) -> object:
        """Classify a failed attempt. Definite failures follow the retry
        policy; an exception from a ``write`` tool that does not prove the
        effect absent leaves it uncertain: reconcile, or ask an operator."""
        d, ex, call = self.d, self.ex, self.call
        if d.effect is not Effect.READ:
            self._track_in_flight(exc)
        definite = d.effect is not Effect.WRITE or isinstance(exc, (EffectNotApplied, TerminalError))
        if not definite:
            if d.reconcile is None:
                self._needs_attention(f"the call raised {type(exc).__qualname__}: {exc}")
            self.failure = exc
            return _RECONCILE
        ex.fail_by_policy(call, exc, d.retry)


_RECORDED = object()
_RECONCILE = object()
_EXECUTE = object()


def settle_end(ex: Execution) -> None:
    """Check, when the workflow function has returned, that its journal ends
    where its code did, before the run may complete.

    An unresolved side effect anywhere (a write cancelled by its caller's
    ``wait_for``, or one whose call the new code no longer makes) may or may
    not have happened: the run waits in ``needs_attention`` for an operator,
    never completes over it. An outcome recorded after the point where the
    code finished means the code changed under its journal (a removed call):
    ``NonDeterminismError``, so the run fails instead of completing silently.
    """
    journal = ex.journal
    uncertain = sorted(p for p in journal.op_state if journal.uncertain(p) is not None)
    if uncertain:
        position = uncertain[0]
        state = journal.op_state[position]
        intent = journal.intents.get(position)
        arguments: Any = {}
        if intent is not None and intent.payload is not None:
            try:
                arguments = ex.runtime.payloads.load(intent.payload, dict[str, Any], what="recorded intent")
            except PayloadError:
                arguments = {}
        detail = {
            "position": position, "tool": state.name, "arguments": arguments,
            "operation_id": (intent.detail or {}).get("operation_id") if intent is not None else None,
            "why": "the workflow ended with this side effect unresolved (its call was cancelled, or the "
                   "code no longer makes it): an operator must say whether it happened",
        }
        raise Suspend("needs_attention", status=RunStatus.NEEDS_ATTENTION, detail=detail)
    beyond = sorted(p for p in journal.outcomes if p >= ex.position)
    if beyond:
        recorded = journal.outcomes[beyond[0]]
        raise NonDeterminismError(
            ex.run_id, beyond[0], recorded=f"{recorded.step_kind} {recorded.name!r}",
            requested=f"nothing (the workflow ended after {ex.position} journaled call(s))",
        )


__all__ = ["Done", "Effect", "NotFound", "Operation", "Tool", "ToolDef", "Unknown"]
