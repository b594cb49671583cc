"""The context a workflow receives as its first argument.

Every helper here is journaled: its value is recorded the first time and
returned from the record on replay, so a workflow that takes its clock, its
randomness and its ids from the context replays deterministically. None of
them blocks: each either returns at once or suspends the run, so the same
calls work unchanged in ``async def`` workflows.
"""

from __future__ import annotations

import random as _random
import secrets
import time
import uuid as _uuid
from collections.abc import Generator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from cairn.codec import values
from cairn.engine import approvals, contextwindow, messaging, modelcalls, patches, workspace
from cairn.engine.approvals import Decision
from cairn.engine.budget import check_number
from cairn.engine.drive import run_async, run_sync
from cairn.engine.execution import Execution
from cairn.engine.memory import workflow_memory
from cairn.engine.signals import Suspend
from cairn.engine.steps import input_hash
from cairn.engine.workflow import Workflow
from cairn.errors import InvalidArgument, RunIdTaken, RunNotFound, UnknownWorkflow
from cairn.memory.api import Memory
from cairn.models.base import Message, ModelClient, ModelRequest, ModelResponse
from cairn.models.window import ContextPolicy
from cairn.retry import RetryPolicy
from cairn.store.records import RunRecord, RunStatus
from cairn.store.runids import check_id

if TYPE_CHECKING:
    from cairn.engine.definitions import WorkflowDef

R = TypeVar("R")
T = TypeVar("T")


class Context:
    """Identity of the run plus journaled helpers; one per execution."""

    def __init__(self, execution: Execution) -> None:
        self._ex = execution
        run = execution.run
        self.run_id = run.run_id
        self.tenant = run.tenant
        self.thread_id = run.thread_id
        self.workflow = run.workflow
        self.workflow_version = run.workflow_version
        self.parent_run_id = run.parent_run_id
        #: the queue this run was started in (its children default to it)
        self.queue = run.queue
        self.priority = run.priority

    @property
    def memory(self) -> Memory:
        """Run, thread and long-term memory. Every read is journaled (replay
        sees what the first execution saw); every write is a journaled call
        of its own, committed with its entry."""
        return workflow_memory(self._ex)

    # -- deterministic values ----------------------------------------------------

    @property
    def workspace(self) -> Path:
        """The run's workspace directory (``engine.workspace``), used by the
        run from now on: each step and tool body finds it exactly as the
        last one left it, on any worker, and what a body changes is
        snapshotted with its journal entry. Change it only in step and tool
        bodies: a change made by workflow code is not journaled (the next
        body's start undoes it)."""
        return workspace.attach(self._ex)

    def now(self) -> datetime:
        """The current UTC time, recorded once."""
        value: datetime = self._record("now", lambda: datetime.now(UTC), datetime)
        return value

    def uuid(self) -> _uuid.UUID:
        """A random UUID (v4), recorded once."""
        value: _uuid.UUID = self._record("uuid", _uuid.uuid4, _uuid.UUID)
        return value

    def random(self) -> float:
        """A float in [0, 1), recorded once."""
        value: float = self._record("random", _random.random, float)
        return value

    def _record(self, kind: str, produce: Any, type_: Any) -> Any:
        call = self._ex.begin(kind, kind)
        if call.recorded is not None:
            return self._ex.replay(call, type_)
        return self._ex.complete_call(call, produce(), type_)

    # -- recorded model decisions ---------------------------------------------------

    def model(
        self,
        client: ModelClient,
        messages: Sequence[Message],
        *,
        tools: Sequence[dict[str, Any]] = (),
        retry: RetryPolicy | None = None,
        context: ContextPolicy | None = None,
        **params: Any,
    ) -> ModelResponse:
        """Ask ``client`` once, and never again for this position.

        The request, the response, the model id, latency and token usage are
        journaled (each message once per run: see ``engine.modelcalls``); on
        replay or recovery the recorded response is returned, so every
        decision derived from it (tool arguments, ids) is identical after a
        crash. Token usage and cost count against the run's budget.

        ``context``: fit ``messages`` (the whole history, appended to from
        call to call) into the model's window by that policy: old tool
        outputs trimmed, older messages summarized, each compaction journaled
        (``engine.contextwindow``).
        """
        request = ModelRequest(tuple(messages), tuple(tools), params)
        if context is not None:
            return run_sync(contextwindow.ask(self._ex, client, request, retry, context, is_async=False))
        return run_sync(modelcalls.ask(self._ex, client, request, retry, is_async=False))

    async def model_async(
        self,
        client: ModelClient,
        messages: Sequence[Message],
        *,
        tools: Sequence[dict[str, Any]] = (),
        retry: RetryPolicy | None = None,
        context: ContextPolicy | None = None,
        **params: Any,
    ) -> ModelResponse:
        """``model`` for async workflows: uses ``client.acomplete`` when the
        client has one, otherwise runs ``complete`` in a thread."""
        request = ModelRequest(tuple(messages), tuple(tools), params)
        if context is not None:
            return await run_async(contextwindow.ask(self._ex, client, request, retry, context,
                                                     is_async=True))
        return await run_async(modelcalls.ask(self._ex, client, request, retry, is_async=True))

    def rewinds(self) -> list[dict[str, Any]]:
        """Why this run was sent back to an earlier step (``LogicalFailure``),
        oldest first: feed it to the step that runs again."""
        return list(self._ex.journal.rewinds)

    # -- bundles: pinned prompts and settings, patches (``engine.bundles``) ---------

    @property
    def bundle(self) -> str | None:
        """The id of the bundle this run executes on (``None``: a run older than bundles)."""
        return self._ex.run.bundle

    def prompt(self, name: str) -> str:
        """Prompt ``name`` as registered in this run's bundle (``app.prompt``):
        the text the run started with, on every replay and resume, whatever
        the process registers now."""
        prompts = self._pinned().prompts
        if name not in prompts:
            raise InvalidArgument(f"no prompt {name!r} in the bundle of run {self.run_id!r} "
                                  f"(it has: {', '.join(sorted(prompts)) or 'none'})")
        return str(prompts[name])

    def model_settings(self, name: str) -> dict[str, Any]:
        """Model settings ``name`` (``app.model_settings``) as pinned in this run's bundle."""
        models = self._pinned().models
        if name not in models:
            raise InvalidArgument(f"no model settings {name!r} in the bundle of run {self.run_id!r} "
                                  f"(it has: {', '.join(sorted(models)) or 'none'})")
        return dict(models[name])

    def _pinned(self) -> Any:
        registry = self._ex.runtime.registry
        if self._ex.run.bundle is None:  # a run older than bundles: what the process has
            return registry
        return registry.load(self._ex.run.bundle, self._ex.store)

    def patched(self, patch_id: str) -> bool:
        """``True`` on code that has the change ``patch_id`` for runs that
        reach this point now; ``False`` on replay of a run that passed it
        before (see ``cairn.engine.patches``)."""
        return patches.patched(self._ex, patch_id)

    def deprecate_patch(self, patch_id: str) -> None:
        """The patch ``patch_id`` is no longer branched on: replays of runs
        that recorded it still line up (see ``cairn.engine.patches``)."""
        patches.deprecate_patch(self._ex, patch_id)

    # -- durable timers ----------------------------------------------------------

    def sleep(self, seconds: float) -> Slept:
        """Wait ``seconds`` without holding a worker.

        The deadline is recorded; the run suspends and its worker is freed; any
        worker resumes it once the deadline has passed, even after restarts.

        The wait happens at the call (the run suspends from there), so
        ``ctx.sleep(5)`` works in any workflow; in an ``async def`` workflow
        ``await ctx.sleep(5)`` works too, and reads like ``asyncio.sleep``:
        the returned object is awaitable and completes at once.
        """
        check_number("ctx.sleep's seconds", seconds, negative=True)  # a negative wait is no wait
        call = self._ex.begin("sleep", "sleep")
        if call.recorded is not None:
            wake_at = float(self._ex.replay(call, float))
        else:
            wake_at = float(self._ex.complete_call(call, time.time() + max(0.0, seconds), float))
        if time.time() < wake_at:
            raise Suspend("sleep", wake_at=wake_at)
        return _SLEPT

    # -- signals and published events (engine/messaging.py) ------------------------

    @overload
    def wait_for_signal(self, name: str, *, timeout: float | None = None, type_: type[T]) -> T: ...

    @overload
    def wait_for_signal(self, name: str, *, timeout: float | None = None) -> Any: ...

    def wait_for_signal(self, name: str, *, timeout: float | None = None, type_: Any = Any) -> Any:
        """The data of the next signal ``name`` sent to this run, as ``type_``.

        Signals are kept in the run's mailbox in the order they arrive, each
        consumed once: one sent before this call is returned at once. With
        none there, the run suspends here (its worker is freed; nothing of
        it stays in memory) and any worker resumes it when one arrives. With
        ``timeout`` (seconds, a durable deadline recorded before the first
        wait) ``cairn.SignalTimeout`` is raised once it passes with no
        signal, even across restarts. Data that does not fit ``type_``
        raises ``cairn.InvalidSignal`` (that message is consumed: wait again
        for the next). It never blocks, so in an ``async def`` workflow call
        it as it is, or ``await ctx.wait_for_signal_async(...)``.
        """
        _check_timeout(timeout)
        return messaging.receive(self._ex, name, timeout, type_)

    async def wait_for_signal_async(self, name: str, *, timeout: float | None = None,
                                    type_: Any = Any) -> Any:
        """``wait_for_signal`` as a coroutine, for ``await`` in async workflows."""
        _check_timeout(timeout)
        return messaging.receive(self._ex, name, timeout, type_)

    def signal(self, run_id: str, name: str, data: Any = None) -> int:
        """Send signal ``name`` with ``data`` to run ``run_id`` of this tenant,
        exactly once (replay and re-execution after a crash deliver nothing
        more); returns the message's sequence number in its mailbox. A run
        that is unknown, another tenant's or finished raises
        ``cairn.SignalRefused`` (recorded: replay raises it again)."""
        return messaging.send(self._ex, run_id, name, data)

    def set_event(self, key: str, value: Any) -> None:
        """Publish ``value`` under ``key`` (journaled, one append): readers
        (``app.get_event``, another run's ``ctx.get_event``) see the latest
        value of each key while this run goes on."""
        messaging.publish(self._ex, key, value)

    def get_event(self, run_id: str, key: str, *, type_: Any = Any) -> Any:
        """What run ``run_id`` (of this tenant) published last under ``key``,
        or ``None``; read now, once, and journaled (replay returns the same
        value). It does not wait: to wait for another run, have it signal."""
        return messaging.read_event(self._ex, run_id, key, type_)

    # -- approvals (``engine.approvals``) ------------------------------------------

    @overload
    def request_approval(
        self, action: str, details: T, *, timeout: float | None = None,
        approvers: Sequence[str] | str | None = None, type_: None = None,
    ) -> Decision[T]: ...

    @overload
    def request_approval(
        self, action: str, details: Any, *, timeout: float | None = None,
        approvers: Sequence[str] | str | None = None, type_: type[T],
    ) -> Decision[T]: ...

    @overload
    def request_approval(
        self, action: str, details: Any, *, timeout: float | None = None,
        approvers: Sequence[str] | str | None = None, type_: Any,
    ) -> Decision[Any]: ...

    def request_approval(
        self,
        action: str,
        details: Any,
        *,
        timeout: float | None = None,
        approvers: Sequence[str] | str | None = None,
        type_: Any = None,
    ) -> Decision[Any]:
        """Ask people to approve, reject or edit ``action`` on ``details``,
        and wait for their decision without holding a worker.

        The request is durable (``cairn approvals`` lists it, ``cairn approve``
        / ``cairn reject`` or ``app.approve`` / ``app.reject`` decide it) and
        the run is suspended until it is decided, on any worker, after any
        restart. Returns a ``cairn.Decision``: ``approved`` (``data`` is
        ``details``), ``edited`` (``data`` is the edit, of type ``type_``,
        default ``type(details)``: an edit that does not fit is refused when
        it is made), ``rejected``, or, ``timeout`` seconds after the first
        request, ``expired`` (nothing raised: check ``decision.status``).
        ``approvers`` restricts who may decide: acting identities
        (``"cli:ada@host"``) or user names (``"ada"``: any of ada's).
        Like ``ctx.sleep``, it returns at once or suspends the run, so it
        works unchanged (without ``await``) in ``async def`` workflows.
        """
        _check_timeout(timeout)
        return approvals.request(self._ex, action, details, timeout=timeout, approvers=approvers, type_=type_)

    # -- child workflows ----------------------------------------------------------

    def start_child(
        self,
        workflow: Workflow[R] | str,
        *args: Any,
        run_id: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        **kwargs: Any,
    ) -> ChildHandle[R]:
        """Start a child workflow with its own journal; returns at once.

        The child's id is derived from this run's id and the call's position
        (``run_id=`` chooses one instead; a run that already exists under it
        and is not this run's child is refused with ``InvalidArgument``: a
        parent never adopts another run's result, nor waits on a run it does
        not own). The child's id is recorded, so replay never starts a second child. It
        inherits the tenant and thread of this run, and unless told otherwise
        its queue and priority: fan out into a queue with its own limits with
        ``queue=``. A parent waiting for its children holds no slot of its
        queue, so parent and children may share a queue of any concurrency.
        """
        definition = self._resolve(workflow)
        arguments = definition.bind(args, kwargs)
        call = self._ex.begin("child", definition.name, input_hash((), arguments))
        if call.recorded is not None:
            return ChildHandle(self._ex, str(self._ex.replay(call, str)), definition)
        if run_id is not None:
            check_id("run id", run_id)  # the rule ``NewRun`` applies, before the id is looked up
            child_id = run_id
        else:
            generation = self._ex.journal.generation(call.position)
            # a child started again after a rewind is a new child, not the old one's result
            child_id = f"{self.run_id}:{call.position}" + (f"~{generation}" if generation else "")
        queue = self.queue if queue is None else queue
        priority = self.priority if priority is None else priority
        try:  # the store refuses an id held by a run that is not this child, recording nothing
            self._ex.start_child(call, definition, arguments, child_id, queue=queue, priority=priority)
        except RunIdTaken:
            if run_id is not None:  # a chosen id names someone else's run: never adopted
                raise InvalidArgument(_not_a_child(child_id, self.run_id)) from None
            # The derived id was guessed and taken first (by another tenant, say):
            # the child takes one nobody can guess. The id is recorded with the
            # child's start, in one transaction, so replay reads it back.
            child_id = f"{child_id}~{secrets.token_hex(8)}"
            self._ex.start_child(call, definition, arguments, child_id, queue=queue, priority=priority)
        return ChildHandle(self._ex, child_id, definition)

    def child(
        self,
        workflow: Workflow[R] | str,
        *args: Any,
        run_id: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        **kwargs: Any,
    ) -> R:
        """Start a child workflow and wait for its result (durably)."""
        return self.start_child(workflow, *args, run_id=run_id, queue=queue, priority=priority,
                                **kwargs).result()

    def _resolve(self, workflow: Workflow[Any] | str) -> WorkflowDef:
        name = workflow if isinstance(workflow, str) else workflow.definition.name
        known = self._ex.runtime.workflows
        if name not in known:
            raise UnknownWorkflow(name, list(known))
        return known[name]


class Slept:
    """What ``ctx.sleep`` returns: the wait is over, and awaiting this is a
    no-op, so ``await ctx.sleep(n)`` in an async workflow is not an error
    that surfaces only once the timer has fired."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # pragma: no cover - makes this a generator that finishes at once


_SLEPT = Slept()


class ChildHandle(Generic[R]):
    """A started child workflow."""

    def __init__(self, execution: Execution, run_id: str, definition: WorkflowDef) -> None:
        self._ex = execution
        self.run_id = run_id
        self._definition = definition

    def result(self) -> R:
        """The child's result. Suspends this run (freeing its worker) until the
        child finishes; raises ``ChildFailed`` if it failed or was cancelled."""
        ex = self._ex
        call = ex.begin("wait", self.run_id)
        if call.recorded is not None:
            replayed: R = ex.replay(call, self._definition.result_type)
            return replayed
        child = ex.store.get_run(self.run_id)
        if child is None:
            raise RunNotFound(self.run_id)
        _check_owned(ex, child)  # never read the result of a run this one did not start
        if child.status is RunStatus.COMPLETED:
            ex.record_outcome(call, child.result)
            raw = ex.runtime.payloads.raw(child.result, what=f"result of child run {self.run_id!r}") \
                if child.result is not None else b"null"
            decoded: R = values.decode(raw, self._definition.result_type, what=f"child run {self.run_id!r}")
            return decoded
        if child.status.terminal:
            ex.child_failed(call, child)
        raise Suspend("child", waiting_on=self.run_id)


def _check_timeout(timeout: float | None) -> None:
    """A ``timeout=`` is recorded as a deadline: a finite number of seconds, or ``None`` (no deadline)."""
    if timeout is not None:
        check_number("timeout", timeout)


def _check_owned(ex: Execution, run: RunRecord) -> None:
    """Refuse run ``run`` as a child of ``ex``'s run unless that run started it.

    A chosen child id that names an unrelated run (another tenant's, or a
    live run that will never wake this parent) would otherwise hand its
    result to this run, or suspend it forever. The message is the same
    whoever owns the run: it says nothing about other tenants."""
    if run.parent_run_id != ex.run_id or run.tenant != ex.run.tenant:
        raise InvalidArgument(_not_a_child(run.run_id, ex.run_id))


def _not_a_child(child_id: str, parent_id: str) -> str:
    return (f"child run id {child_id!r} is taken by a run that is not a child of run {parent_id!r}: "
            "omit run_id= (a child's id is derived from its parent's) or choose an unused one")
