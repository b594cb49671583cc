"""``cairn.App``: where workflows and steps are registered and runs started.

An App owns one store connection and the registry of workflows. It can run
workflows inline in the calling process (``app.run``: the embedded mode,
zero setup) or hand them to worker processes (``app.start``).
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from typing import Any, Concatenate, ParamSpec, TypeVar, overload

from cairn.api import actors
from cairn.api.actors import acting
from cairn.api.approvals import NO_EDIT, ApprovalView
from cairn.api.audit import Audit
from cairn.api.erasure import Erasure
from cairn.api.export import export_run
from cairn.api.handles import RunHandle
from cairn.api.operator import BundleView, Operator, app_actor
from cairn.api.schedules import ScheduleView, list_views
from cairn.api.tokens import Tokens
from cairn.api.travel import TimeTravel
from cairn.api.views import operation_json
from cairn.api.workflow import Workflow
from cairn.api.wsimport import start_from_git
from cairn.codec import upcasters, values
from cairn.codec.payloads import DEFAULT_INLINE_LIMIT, PayloadCodec
from cairn.codec.upcasters import Upcaster
from cairn.engine import replaycheck
from cairn.engine.access import ToolAccess
from cairn.engine.approvals import ApprovalPolicy
from cairn.engine.budget import Budget
from cairn.engine.bundles import Served, tool_fingerprint
from cairn.engine.definitions import StepDef, WorkflowDef
from cairn.engine.executor import Outcome
from cairn.engine.replaycheck import ReplayReport
from cairn.engine.runtime import Runtime
from cairn.engine.schedules import DEFAULT_GRACE, InvalidSchedule, Schedule
from cairn.engine.startedwith import NOBODY, StartedWith
from cairn.engine.steps import Step
from cairn.engine.tools import Effect, Reconciler, Tool, ToolDef
from cairn.engine.transactions import Transaction
from cairn.engine.transactions import build as build_transaction
from cairn.errors import InvalidArgument, MigrationRefused, PayloadError, RunNotFound, UnknownWorkflow
from cairn.graph import runner as graph_runner
from cairn.graph.diff import Change
from cairn.graph.errors import GraphError
from cairn.graph.graph import Graph
from cairn.graph.reader import Checkpoint, Readers, graph_of
from cairn.graph.travel import Lineage
from cairn.ids import new_run_id
from cairn.memory.embedders import Embedder
from cairn.memory.policy import MemoryPolicy
from cairn.retry import NO_RETRY, RetryPolicy
from cairn.security import redaction
from cairn.security.keyring import Keyring
from cairn.security.secrets import SecretProvider, Secrets
from cairn.store import lifecycle, open_store, resolve_url, with_keyring
from cairn.store.admission import QueueLimits, QueueShare, QueueStats, Rate
from cairn.store.contract import Notifier, Store
from cairn.store.records import (
    Claim,
    Delivery,
    Durability,
    HistoryEvent,
    NewRun,
    RunFilter,
    RunRecord,
    RunStatus,
    UsageTotals,
    check_names,
    check_subject,
)
from cairn.store.transactions import Tx
from cairn.worker.inline import InlineDriver
from cairn.worker.worker import Worker, WorkerSettings
from cairn.workspace.local import Workspaces

P = ParamSpec("P")
R = TypeVar("R")
Q = ParamSpec("Q")
T = TypeVar("T")


def _memory_policy(memory: MemoryPolicy | None, embedder: Embedder | None) -> MemoryPolicy:
    """The app's memory policy: ``memory``, with ``embedder`` as its embedder."""
    policy = memory if memory is not None else MemoryPolicy()
    if embedder is None:
        return policy
    if policy.embedder is not None and policy.embedder is not embedder:
        raise InvalidArgument("App(embedder=...) and App(memory=MemoryPolicy(embedder=...)) name two "
                              "embedders; give one")
    return replace(policy, embedder=embedder)


class App:
    """Registry of workflows and steps bound to one store.

    ``db`` is a URL (``sqlite:///path.db``, ``memory://``) defaulting to
    ``$CAIRN_DB`` and then ``./.cairn/cairn.db``. ``durability`` is
    ``"process"`` (survive any process crash; the default) or ``"power"``
    (fsync every commit). ``create=False`` refuses to create a database
    that does not exist (for commands that only inspect or operate on runs).

    ``secrets`` resolves the ``cairn.Secret`` references steps, tools and
    model clients use: a ``cairn.Secrets`` resolver, one provider, or a
    mapping of provider names to providers (default: environment variables
    named ``CAIRN_SECRET_*``). See ``cairn.security.secrets``.

    ``memory`` (a ``cairn.MemoryPolicy``) sets the retention of the memory
    tiers and the embedder of semantic search; ``embedder`` (a
    ``cairn.memory.embedders.Embedder``) is short for the policy's: it turns
    long-term memory items into vectors, and ``cairn worker`` then also runs
    the embedding worker (``cairn.memory.indexer``).
    """

    def __init__(
        self,
        db: str | None = None,
        *,
        durability: Durability | str = Durability.PROCESS,
        store: Store | None = None,
        lease_seconds: float = 30.0,
        max_recoveries: int = 5,
        inline_limit: int = DEFAULT_INLINE_LIMIT,
        check_inputs: bool = True,
        create: bool = True,
        secrets: Secrets | SecretProvider | Mapping[str, SecretProvider] | None = None,
        memory: MemoryPolicy | None = None,
        embedder: Embedder | None = None,
        keyring: Keyring | None = None,
        workspaces: str | os.PathLike[str] | None = None,
    ) -> None:
        policy = _memory_policy(memory, embedder)  # refused before any database is opened
        #: where this app's data lives (``None`` when given a ``store`` object)
        self.db_url = None if store is not None else resolve_url(db)
        #: ``keyring`` (or ``$CAIRN_KEYRING``) seals every run's data at rest (``cairn.store.sealed``)
        self.store = (with_keyring(store, keyring) if store is not None
                      else open_store(db, durability, create=create, keyring=keyring))
        self.runtime = Runtime(
            store=self.store,
            payloads=PayloadCodec(self.store, inline_limit),
            max_recoveries=max_recoveries,
            check_inputs=check_inputs,
            secrets=Secrets.coerce(secrets),
            memory=policy,
            # runs' workspace directories on this worker (ctx.workspace): ``workspaces``, else
            # $CAIRN_WORKSPACES, else ./.cairn/workspaces
            workspaces=Workspaces(workspaces),
        )
        redaction.protect_loggers()  # Cairn's log lines never show a revealed secret
        self.lease_seconds = lease_seconds
        self._inline_id = f"inline-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._inline_driver: InlineDriver | None = None
        self._inline_lock = threading.Lock()
        #: graph runs' checkpoints, read incrementally (``app.checkpoints``, ``app.graph_state``)
        self.graph_readers = Readers(self.store, self.runtime.payloads)
        #: replay, fork, diff and the states of graph runs (``app.graph_replay``, ...)
        self.travel = TimeTravel(self.runtime, self.graph_readers, self._new_run)
        #: performs every operator action (cancel, kill, retry, ...) as this process
        self.operator = Operator(self.store, self.runtime.payloads, app_actor(), memory=self.runtime.memory)

    @property
    def secrets(self) -> Secrets:
        """The resolver of this app's secrets (``app.secrets.add(name, provider)``)."""
        return self.runtime.secrets

    @secrets.setter
    def secrets(self, value: Secrets | SecretProvider | Mapping[str, SecretProvider] | None) -> None:
        self.runtime.secrets = Secrets.coerce(value)

    # -- registration ---------------------------------------------------------------

    @overload
    def workflow(self, fn: Callable[..., R], /) -> Workflow[R]: ...

    @overload
    def workflow(
        self, *, name: str | None = None, version: str = "1"
    ) -> Callable[[Callable[..., T]], Workflow[T]]: ...

    def workflow(
        self, fn: Callable[..., Any] | None = None, *, name: str | None = None, version: str = "1"
    ) -> Any:
        """Register a workflow: a sync or async function taking a ``Context`` first."""

        def register(f: Callable[..., Any]) -> Workflow[Any]:
            definition = WorkflowDef.build(f, name, version)
            # several versions of one name side by side (bundles): the same
            # name and version twice with other code is refused
            registry = self.runtime.registry
            registry.add_workflow(definition)
            newest = registry.newest(definition.name)
            assert newest is not None
            self.runtime.workflows[definition.name] = newest
            return Workflow(definition)

        return register(fn) if fn is not None else register

    def graph(self, name: str, graph: Graph, *, version: str = "1", max_steps: int = 10_000) -> Workflow[Any]:
        """Register ``graph`` as workflow ``name``: started, claimed,
        recovered and pinned to its bundle like any workflow (``app.run(w,
        state)``, ``app.start(w, state)``; the result is the final state).
        The graph is checked now (``InvalidGraph``: nothing registered);
        a run fails after ``max_steps`` super-steps without reaching END."""
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise InvalidArgument(f"max_steps must be a positive integer, not {max_steps!r}")
        if not isinstance(graph, Graph):
            raise InvalidArgument(f"app.graph takes a cairn.Graph, not {type(graph).__name__}")
        definition = graph_runner.workflow(name, version, graph.compile(), max_steps)
        registry = self.runtime.registry
        registry.add_workflow(definition)
        newest = registry.newest(definition.name)
        assert newest is not None
        self.runtime.workflows[definition.name] = newest
        return Workflow(definition)

    def langgraph(self, graph: Any, *, name: str, version: str = "1",
                  interrupts: str = "approval") -> Workflow[Any]:
        """Register a compiled LangGraph graph (``StateGraph(...).compile()``,
        without a checkpointer) as workflow ``name``: started, claimed and
        recovered like any workflow, its checkpoints in this store
        (``cairn.lgdurable``). Its ``interrupt()`` calls are approval
        requests of the run (``interrupts="approval"``: those of one
        super-step asked together) or, with ``interrupts="signal"``,
        published as event ``interrupts`` and answered by signal ``resume``.
        The run's input is the graph's input; its result the final state.
        Needs the ``langgraph`` extra."""
        from cairn import lgdurable  # the extra is imported only by an app that uses it

        compiled = lgdurable.check(graph, name, version, interrupts)
        registry = self.runtime.registry
        existing = registry.newest(name)
        if existing is not None and lgdurable.graph_of(existing.fn) is None:
            raise InvalidArgument(f"workflow {name!r} is already registered (not a LangGraph graph): give "
                                  "the graph another name=")
        if (name, version) in registry.versions:
            raise InvalidArgument(f"LangGraph workflow {name!r} version {version!r} is already registered: "
                                  "give the new graph a new version= (or another name=)")
        definition = lgdurable.workflow(compiled, name, version, interrupts)
        registry.add_workflow(definition)
        newest = registry.newest(definition.name)
        assert newest is not None
        self.runtime.workflows[definition.name] = newest
        return Workflow(definition)

    def checkpoints(self, run_id: str, *, before: int | None = None, limit: int = 50) -> list[Checkpoint]:
        """The checkpoints of graph run ``run_id``, newest first: those of
        super-steps below ``before`` (``None``: from the latest), at most
        ``limit``. Read without the graph's code; a replayed or forked run
        lists its own (from the step it was forked at: ``app.lineage``)."""
        return self.travel.checkpoints(run_id, before, limit)

    def graph_state(self, run_id: str, step: int | None = None) -> Any:
        """The state of graph run ``run_id`` after super-step ``step`` (0:
        the input; ``None``: the latest), as the graph's state type (a
        replayed or forked run's states before its fork are its origin's)."""
        return self.travel.state(run_id, step)

    def graph_state_json(self, run_id: str, step: int | None = None) -> tuple[int, dict[str, Any]]:
        """The super-step (``None``: the latest) and the state after it as
        plain JSON values, read without the graph's code (the CLI, the HTTP API)."""
        return self.travel.state_json(run_id, step)

    def graph_replay(self, origin: str, step: int, /, *, run_id: str | None = None,
                     started_role: str | None = None, started_token: str | None = None,
                     started_by: Mapping[str, Any] | None = None) -> RunHandle[Any]:
        """A new run of ``origin``'s graph (its newest version registered
        here) that starts from the state after super-step ``step`` and runs
        again every super-step after it: no node, tool, model call or
        approval of ``origin`` after ``step`` is reused. Its lineage is
        recorded (``app.lineage``). Idempotent on ``run_id``, as ``start``.
        ``started_role``, ``started_token``, ``started_by``: who replays it,
        as for ``start``: the new run acts with those rights, not with the
        origin's (``None``: none)."""
        return self._forked(self.travel.fork(origin, step, None, run_id, edited=False,
                                             started=StartedWith(started_role, started_token),
                                             started_by=started_by))

    def graph_fork(self, origin: str, step: int, /, *, update: Mapping[str, Any] | Any = None,
                   run_id: str | None = None, started_role: str | None = None,
                   started_token: str | None = None,
                   started_by: Mapping[str, Any] | None = None) -> RunHandle[Any]:
        """``graph_replay`` from the state after super-step ``step`` with
        ``update``'s fields set (each replaced, as an interrupt's edit does,
        and validated as its field's type: ``InvalidArgument`` naming the
        field, and no run is created)."""
        return self._forked(self.travel.fork(origin, step, update, run_id, edited=True,
                                             started=StartedWith(started_role, started_token),
                                             started_by=started_by))

    def _forked(self, made: tuple[str, bool]) -> RunHandle[Any]:
        return RunHandle(self, made[0], created=made[1])

    def lineage(self, run_id: str) -> Lineage | None:
        """Where run ``run_id`` was replayed or forked from (``None``: neither)."""
        return self.travel.lineage(run_id)

    def graph_diff(self, run_id: str, step_a: int, step_b: int, *,
                   other_run: str | None = None) -> list[Change]:
        """What changed, field by field (``cairn.graph.diff``), from the
        state after super-step ``step_a`` of ``run_id`` to the state after
        ``step_b`` of ``other_run`` (default: the same run)."""
        return self.travel.diff(run_id, step_a, step_b, other_run)

    def graph_divergence(self, run_a: str, run_b: str) -> int | None:
        """The first super-step at which the states of two graph runs
        differ; ``None`` if they never do."""
        return self.travel.divergence(run_a, run_b)

    @overload
    def step(self, fn: Callable[P, R], /) -> Step[P, R]: ...

    @overload
    def step(
        self, *, name: str | None = None, retry: RetryPolicy | None = None
    ) -> Callable[[Callable[Q, T]], Step[Q, T]]: ...

    def step(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        retry: RetryPolicy | None = None,
    ) -> Any:
        """Make a function a journaled step (sync or async). Without ``retry``
        a failing step is not retried: retrying side effects must be a choice."""

        def register(f: Callable[..., Any]) -> Step[..., Any]:
            return Step(StepDef.build(f, name, retry or NO_RETRY))

        return register(fn) if fn is not None else register

    @overload
    def transaction(self, fn: Callable[Concatenate[Tx, P], R], /) -> Transaction[P, R]: ...

    @overload
    def transaction(
        self, *, name: str | None = None, retry: RetryPolicy | None = None
    ) -> Callable[[Callable[Concatenate[Tx, Q], T]], Transaction[Q, T]]: ...

    def transaction(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        retry: RetryPolicy | None = None,
    ) -> Any:
        """Make a function a transactional step: it takes a ``cairn.Tx`` on
        the store's own database first, and its statements commit in the
        same transaction as the step's journal record (docs/design.md,
        "Transactional steps"). Sync bodies only; not retried without ``retry``."""

        def register(f: Callable[..., Any]) -> Transaction[..., Any]:
            return Transaction(build_transaction(f, name, retry or NO_RETRY))

        return register(fn) if fn is not None else register

    def tool(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        effect: Effect | str,
        name: str | None = None,
        reconcile: Reconciler | None = None,
        timeout: float | None = None,
        schema: Any = None,
        retry: RetryPolicy | None = None,
        reconcile_retry: RetryPolicy | None = None,
        approval: ApprovalPolicy | None = None,
        approvers: list[str] | tuple[str, ...] | str | None = None,
        approval_timeout: float | None = None,
        access: ToolAccess | None = None,
    ) -> Any:
        """Make a function a tool with a declared ``effect`` (``"read"``,
        ``"idempotent"`` or ``"write"``): see ``cairn.engine.tools``. A tool
        whose first parameter is annotated ``cairn.Operation`` receives it
        (operation id, identity, attempt). ``schema`` validates the result;
        ``reconcile(op)`` settles uncertain ``write`` effects after a crash.

        ``approval=True`` (or a policy: a function of the bound arguments,
        by name, returning whether this call needs approval) makes it a
        protected tool: before its intent, the run asks for approval of the
        exact arguments (``approvers``, ``approval_timeout`` as in
        ``ctx.request_approval``) and executes exactly the approved or edited
        ones; a rejection raises ``cairn.ApprovalRejected`` in the workflow
        (``cairn.ApprovalExpired`` on timeout) and the tool does not run.

        ``access=cairn.ToolAccess(tenants=..., workflows=...)``: only those may
        call it; any other call is refused (``cairn.ToolRefused``) and the
        refusal recorded in the run's journal (``engine.access``)."""

        def register(f: Callable[..., Any]) -> Tool[..., Any]:
            definition = ToolDef.build(f, name=name, effect=effect, reconcile=reconcile, timeout=timeout,
                                       schema=schema, retry=retry, reconcile_retry=reconcile_retry,
                                       approval=approval, approvers=approvers,
                                       approval_timeout=approval_timeout, access=access)
            self.runtime.registry.add_tool(tool_fingerprint(  # part of every bundle of this app
                definition.name, definition.effect.value, str(definition.call_signature),
                definition.result_type, None if access is None else access.pinned()))
            return Tool(definition)

        return register(fn) if fn is not None else register

    # -- schedules (engine/schedules.py, worker/scheduler.py) ---------------------------

    def schedule(
        self,
        cron: str,
        workflow: Workflow[Any] | str | None = None,
        *,
        name: str | None = None,
        tenant: str = "default",
        timezone: str = "UTC",
        kwargs: Mapping[str, Any] | None = None,
        tick_arg: str | None = None,
        missed: str = "once",
        grace: float = DEFAULT_GRACE,
        queue: str = "default",
        priority: int = 0,
        role: str | None = None,
    ) -> Any:
        """Start ``workflow`` on the cron timetable ``cron`` (5 fields, or 6
        with seconds first), read in ``timezone`` (an IANA name): one run per
        tick, for ``tenant``, fired by the workers (``cairn worker``) however
        many run, exactly once per tick across crashes and restarts.

        The run of a tick has the id ``schedule:<tenant>:<name>:<UTC time>``
        and the arguments ``kwargs``, plus the tick's time as a UTC
        ``datetime`` in parameter ``tick_arg`` if given. ``name`` (default:
        the workflow's name) is unique per tenant. Ticks more than ``grace``
        seconds old when a worker first sees them were missed (no worker
        ran): ``missed="once"`` starts one catch-up run for the latest of
        them, ``"skip"`` none, ``"all"`` one each. Without ``workflow``, a
        decorator for a workflow (``@app.schedule(...)`` over
        ``@app.workflow``). Bad input raises ``InvalidSchedule`` here.
        Returns the ``Schedule`` (the decorator returns the workflow).
        """
        def declare(target: Workflow[Any] | str) -> Schedule:
            label = (target if isinstance(target, str) else target.definition.name) if name is None else name
            try:
                definition = self.definition(target)
            except UnknownWorkflow as exc:
                raise InvalidSchedule(f"schedule {label!r}: {exc}") from None
            declared = Schedule.declare(cron, definition, name=name, tenant=tenant, timezone=timezone,
                                        kwargs=kwargs, tick_arg=tick_arg, missed=missed, grace=grace,
                                        queue=queue, priority=priority, role=role)
            if declared.key in self.runtime.schedules:
                raise InvalidSchedule(f"schedule {declared.name!r} of tenant {tenant!r} is already declared "
                                      f"(give another name=)")
            self.runtime.schedules[declared.key] = declared
            return declared

        if workflow is not None:
            return declare(workflow)

        def decorator(target: Workflow[T]) -> Workflow[T]:
            if not isinstance(target, Workflow):
                raise InvalidSchedule("@app.schedule(...) decorates a workflow: put it above @app.workflow")
            declare(target)
            return target

        return decorator

    def schedules(self, *, declared: bool = True) -> list[ScheduleView]:
        """Every schedule a worker registered in the database and (unless
        ``declared=False``: a bare App that only inspects) every one this app
        declares: definition, last tick fired and the run it started, next
        tick (see ``cairn.api.schedules``)."""
        return list_views(self.store.list_schedules(), self.runtime.schedules if declared else None,
                          self.store.clock())

    # -- bundles: prompts and model settings pinned per run ------------------------

    def prompt(self, name: str, text: str) -> str:
        """Register prompt ``name``. It becomes part of the bundle of every
        workflow of this app (``cairn.engine.bundles``): a run reads it with
        ``ctx.prompt(name)`` from the bundle it started on, on every replay
        and resume, whatever this process registers later. Returns ``name``."""
        if not name or not isinstance(text, str):
            raise InvalidArgument("a prompt needs a non-empty name and a text")
        self.runtime.registry.add_prompt(name, text)
        return name

    def model_settings(self, name: str, **settings: Any) -> str:
        """Register model settings ``name`` (a model id, parameters: JSON
        values), pinned in bundles like prompts; a run reads them with
        ``ctx.model_settings(name)``. Returns ``name``."""
        if not name:
            raise InvalidArgument("model settings need a non-empty name")
        self.runtime.registry.add_model(name, values.decode(values.encode(settings), what="model settings"))
        return name

    def upcaster(self, type_: type, *, from_version: int) -> Callable[[Upcaster], Upcaster]:
        """Register an upcaster: a function from the JSON object of a version
        ``from_version`` payload of ``type_`` to the version ``from_version + 1``
        one (``type_`` declares its version as ``__cairn_version__ = N``).
        Decoding an older payload runs the chain (``cairn.codec.upcasters``)."""

        def register(fn: Upcaster) -> Upcaster:
            upcasters.register(type_, from_version, fn)
            return fn

        return register

    def bundles(self) -> list[BundleView]:
        """Every stored bundle with its runs per status (``cairn bundles``)."""
        return self.operator.bundles()

    def target_bundle(self, run: RunRecord, bundle: str | None = None) -> Served:
        """The bundle ``run`` would execute on after a migration: ``bundle``
        (which this app's code must serve), else the bundle of the newest
        version of its workflow registered here."""
        registry = self.runtime.registry
        if bundle is None:
            newest = registry.newest(run.workflow)
            if newest is None:
                raise UnknownWorkflow(run.workflow, list(self.runtime.workflows))
            local = registry.bundle_for(newest, self.store)
            served = registry.served(local.bundle_id)
            assert served is not None
            return served
        served = registry.served(bundle, self.store)
        if served is None:
            why = registry.why_not(bundle)
            raise InvalidArgument(f"bundle {bundle!r} is not served by this app's code: {why}")
        if served.bundle.workflow != run.workflow:
            raise InvalidArgument(f"bundle {bundle!r} is of workflow {served.bundle.workflow!r}, not of run "
                                  f"{run.run_id!r}'s workflow {run.workflow!r}")
        return served

    def replay_check(self, run_id: str, *, bundle: str | None = None) -> ReplayReport:
        """Replay run ``run_id``'s journal against this app's code for
        ``bundle`` (default: the newest version of its workflow), in a dry
        run: nothing is written, executed or asked of a model. Reports the
        first divergence, or that the code is compatible."""
        run = self.get_run(run_id)
        return self._check(run, self.target_bundle(run, bundle), self.store.history(run_id))

    def _check(self, run: RunRecord, target: Served, history: list[HistoryEvent]) -> ReplayReport:
        pinned = replace(run, bundle=target.bundle.bundle_id, workflow_version=target.bundle.version)
        return replaycheck.check(self.runtime, target.definition, pinned, history)

    def migrate(self, run_id: str, to: str | None = None, *, force: bool = False, reason: str | None = None,
                operator: Operator | None = None) -> tuple[ReplayReport, RunRecord]:
        """Move run ``run_id`` to bundle ``to`` (default: the newest version
        of its workflow here) if the replay check passes; ``force=True`` with
        a ``reason`` (a security fix: ``"CVE-..."``) moves it anyway. The
        journal stays; ``run.migrated`` records both bundles, the check, the
        reason and the actor. Raises ``MigrationRefused`` for a divergence."""
        if force and not (reason or "").strip():
            raise InvalidArgument("a forced migration needs a reason (--reason 'CVE-...')")
        run = self.get_run(run_id)
        target = self.target_bundle(run, to)
        # its state first (the store checks again, atomically with the move)
        lifecycle.migrate(run, run_id, target.bundle.record(), {}, 0.0)
        history = self.store.history(run_id)  # the journal checked is the journal the move commits on
        report = self._check(run, target, history)
        if not report.compatible and not force:
            raise MigrationRefused(f"not migrated: {report.describe()} (--force --reason R overrides)")
        detail: dict[str, Any] = {"check": report.describe(), "compatible": report.compatible,
                                  "forced": force}
        if reason:
            detail["reason"] = reason
        record = target.bundle.record()
        by = (operator or self.operator).actor
        with acting(self.store, by, "", "bundle", record.bundle_id, "bundle.put",
                    {"for": "migrate", "run_id": run_id}):
            self.store.put_bundles([record])
        change = (operator or self.operator).migrate(run_id, record, detail,
                                                     checked_seq=history[-1].seq if history else 0)
        return report, change.run

    def export_run(self, run_id: str) -> dict[str, Any]:
        """Run ``run_id``'s journal as a JSON document (``cairn.api.export``)."""
        run = self.get_run(run_id)
        bundle = None if run.bundle is None else self.runtime.registry.load(run.bundle, self.store)
        return export_run(self.runtime.payloads, run, self.store.history(run_id), bundle)

    def definition(self, workflow: Workflow[Any] | str, version: str | None = None) -> WorkflowDef:
        """The registered workflow: the given version, else the newest
        (a ``Workflow`` object names its own version unless ``version`` is given)."""
        if not isinstance(workflow, str) and version is None:
            version = workflow.definition.version
        name = workflow if isinstance(workflow, str) else workflow.definition.name
        found = self.runtime.workflows.get(name) if version is None \
            else self.runtime.registry.version(name, version)
        if found is None:
            if version is not None and name in self.runtime.workflows:
                raise UnknownWorkflow(f"{name} version {version}", list(self.runtime.workflows))
            raise UnknownWorkflow(name, list(self.runtime.workflows))
        return found

    # -- starting runs ---------------------------------------------------------------------

    def start(
        self,
        workflow: Workflow[R] | str,
        *args: Any,
        run_id: str | None = None,
        thread_id: str | None = None,
        tenant: str = "default",
        queue: str = "default",
        priority: int = 0,
        budget: Budget | None = None,
        version: str | None = None,
        started_role: str | None = None,
        started_token: str | None = None,
        started_by: Mapping[str, Any] | None = None,
        workspace_from: str | os.PathLike[str] | None = None,
        workspace_ref: str = "HEAD",
        subject: str | None = None,
        **kwargs: Any,
    ) -> RunHandle[R]:
        """Create a run for a worker to execute. Idempotent on ``run_id``:
        starting an existing id returns a handle on that run, unchanged.
        A workflow given by name starts its newest version, or ``version``;
        the run records its bundle and executes only on that bundle's code.
        ``started_role`` (and ``started_token``, a token's id): the rights
        it is started with, which tools restricted by role check
        (``cairn.ToolAccess(role=...)``) wherever it runs; ``None``: none.
        ``workspace_from``: a local git repository whose tree at
        ``workspace_ref`` is the run's starting workspace (``api.wsimport``;
        a bad repository or ref is refused before anything is stored).
        ``subject``: whose data the run holds (a user id, a customer id):
        its values are sealed with that subject's own key, its children and
        memory writes inherit it, and ``cairn erase --subject`` erases it."""
        definition = self.definition(workflow, version)
        arguments = _bind(definition, args, kwargs)
        new = self._new_run(definition, arguments, run_id, thread_id, tenant, queue, priority, budget,
                            StartedWith(started_role, started_token), started_by, subject)
        return self._create(new, workspace_from, workspace_ref)

    def _create(self, new: NewRun, workspace_from: str | os.PathLike[str] | None, workspace_ref: str
                ) -> RunHandle[Any]:
        if workspace_from is not None:
            created = start_from_git(self.store, new, workspace_from, workspace_ref, self.lease_seconds)
        else:
            _, created = self.store.create_run(new)
        return RunHandle(self, new.run_id, created=created)

    def start_json(
        self,
        workflow: str,
        data: Any,
        *,
        run_id: str | None = None,
        thread_id: str | None = None,
        tenant: str = "default",
        queue: str = "default",
        priority: int = 0,
        budget: Budget | None = None,
        version: str | None = None,
        started_role: str | None = None,
        started_token: str | None = None,
        started_by: Mapping[str, Any] | None = None,
        workspace_from: str | os.PathLike[str] | None = None,
        workspace_ref: str = "HEAD",
        subject: str | None = None,
    ) -> RunHandle[Any]:
        """Start ``workflow`` with inputs given as JSON values (the CLI's
        ``--input``): an object names parameters, an array lists them, any
        other value is the only argument. Validated against the annotations.
        ``started_role``, ``started_token``, ``workspace_from``, ``workspace_ref``, ``subject``: as
        for ``start``."""
        definition = self.definition(workflow, version)
        try:
            arguments = definition.inputs_from_json(data)
        except TypeError as exc:
            raise PayloadError(f"input does not fit workflow {workflow!r}: {exc}") from None
        new = self._new_run(definition, arguments, run_id, thread_id, tenant, queue, priority, budget,
                            StartedWith(started_role, started_token), started_by, subject)
        return self._create(new, workspace_from, workspace_ref)

    def run(
        self,
        workflow: Workflow[R] | str,
        *args: Any,
        run_id: str | None = None,
        thread_id: str | None = None,
        tenant: str = "default",
        budget: Budget | None = None,
        started_role: str | None = None,
        started_token: str | None = None,
        started_by: Mapping[str, Any] | None = None,
        subject: str | None = None,
        **kwargs: Any,
    ) -> R:
        """Start a run and execute it here, in this thread, to the end.

        The embedded mode: the run is durable exactly as with a worker (kill
        this process and any worker finishes it), but nothing else needs to be
        running. Timers are waited out here; children run here too. Starting an
        existing ``run_id`` resumes or awaits that run.
        """
        definition = self.definition(workflow)
        arguments = _bind(definition, args, kwargs)
        new = self._new_run(definition, arguments, run_id, thread_id, tenant, "default", 0, budget,
                            StartedWith(started_role, started_token), started_by, subject)
        claim = self.store.create_claimed_run(new, self._inline_id, self.lease_seconds)
        result: R = self._drive(new.run_id, claim)
        return result

    def resume(self, run_id: str) -> Any:
        """Execute an existing run here until it ends (see ``run``)."""
        if self.store.get_run(run_id) is None:
            raise RunNotFound(run_id)
        return self._drive(run_id, None)

    def _new_run(
        self,
        definition: WorkflowDef,
        arguments: dict[str, Any],
        run_id: str | None,
        thread_id: str | None,
        tenant: str,
        queue: str,
        priority: int,
        budget: Budget | None = None,
        started: StartedWith = NOBODY,
        started_by: Mapping[str, Any] | None = None,
        subject: str | None = None,
    ) -> NewRun:
        NewRun.check_started(started.role, started.token)  # before anything is stored
        check_subject(subject)
        given = {} if run_id is None else {"run_id": run_id}  # '' is a mistake, not "make one up"
        check_names(tenant=tenant, queue=queue, **given)  # before the input may be stored as an artifact
        me = self.operator.actor
        context = actors.context(me, tenant) if started_by is None else \
            actors.checked(started_by, tenant, actors.auth_of(me))
        raw = values.encode(arguments)
        definition.convert(values.decode(raw, what="the input"))  # as a worker will: refuse what it cannot
        graph = graph_of(definition.fn)
        if graph is not None:  # as its first super-step will
            try:
                graph.schema.initial(values.decode(raw, what="the input").get("state"))
            except GraphError as exc:
                raise PayloadError(f"input 'state' of workflow {definition.name!r}: {exc}") from None
        payload = self.runtime.payloads.wrap(raw)
        # recorded in the starting tenant's log: a tenant's role may append to its own only
        with acting(self.store, str(context["actor"]), tenant, "bundle", "", "bundle.publish",
                    {"workflow": definition.name, "version": definition.version}, auth=str(context["auth"])):
            bundle = self.runtime.registry.bundle_for(definition, self.store).bundle_id  # stored if new
        return NewRun(
            run_id=run_id or new_run_id(), workflow=definition.name, workflow_version=definition.version,
            tenant=tenant, thread_id=thread_id, input=payload, queue=queue, priority=priority,
            budget=budget.to_dict() if budget is not None else None,
            bundle=bundle, started_by=context,
            started_role=started.role, started_token=started.token, subject=subject,
        )

    def _drive(self, run_id: str, claim: Claim | None) -> Any:
        """Execute ``run_id`` here until it ends (``cairn.worker.inline``)."""
        outcome = self._inline().drive(run_id, claim)
        if outcome is not None:
            return self.handle(run_id).final(outcome.result)
        return RunHandle[Any](self, run_id).result()

    def _inline(self) -> InlineDriver:
        with self._inline_lock:
            if self._inline_driver is None:
                self._inline_driver = InlineDriver(self.runtime, self._inline_id, self.lease_seconds)
            return self._inline_driver

    # -- inspecting and operating on runs ---------------------------------------------

    def handle(self, run_id: str) -> RunHandle[Any]:
        return RunHandle(self, run_id)

    def get_run(self, run_id: str) -> RunRecord:
        record = self.store.get_run(run_id)
        if record is None:
            raise RunNotFound(run_id)
        return record

    def list_runs(
        self,
        *,
        status: RunStatus | str | None = None,
        tenant: str | None = None,
        workflow: str | None = None,
        thread_id: str | None = None,
        limit: int = 100,
    ) -> list[RunRecord]:
        statuses = (RunStatus(status),) if status is not None else None
        return self.store.list_runs(RunFilter(statuses, tenant, workflow, thread_id, None, limit))

    def history(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[HistoryEvent]:
        self.get_run(run_id)
        return self.store.history(run_id, after_seq, limit)

    def history_at(self, run_id: str, seqs: Collection[int]) -> list[HistoryEvent]:
        """The entries of ``run_id`` at ``seqs``: what a page's model calls
        need to be rebuilt (``cairn.api.views.model_calls_of``)."""
        self.get_run(run_id)
        return self.store.history_at(run_id, seqs)

    def model_calls(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[HistoryEvent]:
        """A page of the recorded model call entries of ``run_id``, read in
        the database without the entries between them."""
        self.get_run(run_id)
        return self.store.model_calls(run_id, after_seq, limit)

    def usage(self, run_id: str) -> UsageTotals:
        """What ``run_id`` has spent (tokens, cost, tool calls) and its last
        ``seq``, summed by the store: its history stays in the database."""
        return self.store.run_usage(run_id)

    def cancel(self, run_id: str, reason: str = "cancelled by operator") -> RunRecord:
        """Cancel a run and its children. A worker executing it is fenced out
        and stops at its next step boundary."""
        return self.operator.cancel(run_id, reason).run

    def retry(self, run_id: str) -> RunRecord:
        """Resume a failed or quarantined run from its last good step."""
        return self.operator.retry(run_id).run

    # -- signals and published events ------------------------------------------------

    def signal(self, run_id: str, name: str, data: Any = None, *, dedupe: str | None = None) -> Delivery:
        """Send signal ``name`` with ``data`` to run ``run_id``: it is kept in
        the run's mailbox until ``ctx.wait_for_signal(name)`` takes it (one
        waiting now is woken at once). Durable when this returns. Refused
        with ``RunNotFound`` for an unknown run and ``InvalidRunState`` for a
        finished one; ``dedupe`` (an idempotency key) makes a repeated send
        deliver once. The sender recorded is this process (``app:<pid>``)."""
        return self.operator.signal(run_id, name, data, dedupe=dedupe).delivery

    def get_event(self, run_id: str, key: str, *, timeout: float = 0.0, type_: Any = Any,
                  default: Any = None) -> Any:
        """The latest value run ``run_id`` published under ``key``
        (``ctx.set_event``), waiting up to ``timeout`` seconds for a first
        one; ``default`` if none came by then, or the run finished without
        publishing it. ``RunNotFound`` for an unknown run."""
        found = self.operator.get_event(run_id, key, timeout=timeout, type_=type_)
        return default if found is None else found.value

    # -- exactly-once effects: operators ---------------------------------------------

    def operations(self, run_id: str) -> list[dict[str, Any]]:
        """Side-effecting tool calls of a run and where each stands:
        ``done``, ``failed``, ``uncertain`` (intent without result) or
        ``pending`` (retry or reconciliation scheduled). The typed views are
        ``app.operator.operations(run_id)`` (see ``cairn.api.ledger``);
        each is the shape ``cairn ops --json`` and the HTTP API show."""
        return [operation_json(view) for view in self.operator.operations(run_id).operations]

    def resolve_operation(self, run_id: str, position: int, *, done: bool, result: Any = None) -> RunRecord:
        """Settle the uncertain operation at ``position`` of a run that needs
        attention: ``done=True`` records ``result`` as the tool's result (it
        is not executed again); ``done=False`` executes it again with the same
        operation id. The run then continues on any worker."""
        return self.operator.resolve(run_id, position, done=done, result=result).run

    # -- approvals -----------------------------------------------------------------------

    def approvals(
        self, *, tenant: str | None = None, run_id: str | None = None, pending: bool = True
    ) -> list[ApprovalView]:
        """Approval requests awaiting a decision (``pending=False``: every
        one, decided, expired and voided included), oldest first, across runs."""
        return self.operator.approvals(tenant=tenant, run_id=run_id, pending=pending)

    def approve(
        self, run_id: str, request_id: str, *, comment: str | None = None, edit: Any = NO_EDIT,
        by: str | None = None,
    ) -> ApprovalView:
        """Approve an approval request, as requested or with ``edit`` (which
        must fit the request's type: ``cairn.InvalidEdit`` otherwise, and
        nothing is stored). ``by`` is the decider's identity (default: this
        process, ``app:<pid>``), checked against the request's approvers and
        recorded with the decision. A request is decided once
        (``cairn.ApprovalClosed``); a finished run takes no decision."""
        return self._deciding(by).approve(run_id, request_id, comment=comment, edit=edit)

    def reject(
        self, run_id: str, request_id: str, *, comment: str | None = None, by: str | None = None
    ) -> ApprovalView:
        """Reject an approval request (see ``approve``)."""
        return self._deciding(by).reject(run_id, request_id, comment=comment)

    def _deciding(self, by: str | None) -> Operator:
        if by is not None and (not isinstance(by, str) or not by):
            raise InvalidArgument("by= names who decides: a non-empty identity such as 'http:ada'")
        return self.operator if by is None else self.operator.acting_as(by)

    def kill(self, run_id: str | None = None, *, tenant: str | None = None,
             reason: str = "killed by operator") -> list[RunRecord]:
        """The kill switch: stop a run (and its children) or every run of a
        tenant at the next boundary. Leases are revoked (fenced), so no
        further step result or side-effect intent of theirs is accepted."""
        return self.operator.kill(run_id, tenant=tenant, reason=reason)

    def revive(self, run_id: str) -> RunRecord:
        """Resume a killed or halted run where it stopped (``cairn resume --force``)."""
        return self.operator.revive(run_id).run

    def set_budget(self, run_id: str, budget: Budget) -> RunRecord:
        """Replace a run's budget; a run suspended for its budget continues."""
        return self.operator.set_budget(run_id, budget).run

    def set_queue(
        self,
        name: str,
        *,
        concurrency: int | None = None,
        tenant_concurrency: int | None = None,
        rate: Rate | str | None = None,
        tenant_rate: Rate | str | None = None,
    ) -> QueueLimits:
        """Set the limits of queue ``name`` for every worker, on every
        machine, from their next claim on; replaces any earlier limits (no
        limits at all: the queue becomes unlimited).

        ``concurrency`` caps the queue's running runs, ``tenant_concurrency``
        each tenant's. ``rate`` / ``tenant_rate`` are token buckets, given as
        ``Rate`` or as text such as ``"100/min"`` or ``"5/30s"``: that many
        claims per period sustained, in bursts of up to that many. Tenants
        share a queue fairly whatever its limits: see ``cairn.store.admission``.
        """

        def parsed(value: Rate | str | None) -> Rate | None:
            return Rate.parse(value) if isinstance(value, str) else value

        limits = QueueLimits(name, concurrency, tenant_concurrency, parsed(rate), parsed(tenant_rate))
        return self.operator.set_queue(limits)

    def set_queue_share(
        self, name: str, tenant: str, *, concurrency: int | None = None, rate: Rate | str | None = None
    ) -> QueueShare:
        """Replace ``tenant``'s own share of queue ``name``: at most
        ``concurrency`` of its runs running, at most ``rate`` claims of them
        (``Rate`` or text such as ``"10/min"``); ``None``: no cap of that
        kind, neither: no share. On top of the queue's limits: a share only
        ever holds that tenant back further, and a rate above the queue's
        per-tenant rate is refused (``InvalidArgument``)."""
        parsed = Rate.parse(rate) if isinstance(rate, str) else rate
        return self.operator.set_queue_share(QueueShare(name, tenant, concurrency, parsed))

    def queues(self) -> list[QueueStats]:
        """Every queue with limits or live runs: its limits, how many of its
        runs are running and how many could be claimed now."""
        return self.operator.queues()

    def erase(self, *, tenant: str = "default", subject: str | None = None, thread: str | None = None,
              dry_run: bool = False) -> Erasure:
        """Erase a subject's, a thread's or (neither given) a tenant's runs and
        memory, crypto-shredding its keys; see ``Operator.erase``."""
        return self.operator.erase(tenant=tenant, subject=subject, thread=thread, dry_run=dry_run)

    def prune(
        self,
        older_than_seconds: float,
        *,
        statuses: Collection[RunStatus | str] | None = None,
        batch_size: int = 1000,
        dry_run: bool = False,
    ) -> int:
        """Delete finished runs last changed more than ``older_than_seconds``
        ago, with their histories and the artifacts only they referenced;
        return how many runs were deleted (with ``dry_run``: would be).

        ``statuses`` defaults to completed, failed and cancelled; quarantined,
        killed and halted runs wait for an operator and go only when named.
        Runs go in whole trees (a child only with its parent, never while any
        run of its tree is live or recent), ``batch_size`` runs per
        transaction, until none is left. See ``Store.prune_runs``.
        """
        return self.operator.prune(older_than_seconds, statuses=statuses, batch_size=batch_size,
                                   dry_run=dry_run)

    @property
    def audit(self) -> Audit:
        """The audit log: verify the chains, checkpoint them to an anchor, list who did what."""
        return Audit(self.store)

    # -- the HTTP API (cairn.server): tokens, change feeds ---------------------------------

    @property
    def tokens(self) -> Tokens:
        """Mints, checks and revokes the bearer tokens of ``cairn serve``."""
        return Tokens(self.store, self.operator.actor)

    def runs_changed(
        self, tenant: str, after: tuple[float, str] = (0.0, ""), *, settle: float = 0.0, limit: int = 100
    ) -> list[RunRecord]:
        """The tenant's runs whose last change ``(updated_at, run_id)`` is
        after the cursor ``after``, oldest first; changes younger than
        ``settle`` seconds (by the store's clock) are left for a later call,
        so a transaction that stamped its change before a later one committed
        is not skipped by a reader paging by that cursor."""
        until = self.store.clock() - settle if settle > 0 else float("inf")
        return self.store.runs_changed(tenant, after, until, limit)

    def listen_for_changes(self, callback: Callable[[], None]) -> Callable[[], None] | None:
        """Call ``callback`` (on another thread) when the store says runs may
        have changed (``Notifier``: PostgreSQL's ``LISTEN``); returns the
        function that stops listening, or ``None`` for a store that cannot
        notify (the caller then polls)."""
        if isinstance(self.store, Notifier):
            return self.store.listen(callback)
        return None

    def worker(
        self,
        *,
        concurrency: int = 4,
        worker_id: str | None = None,
        poll_interval: float = 0.1,
        queues: tuple[str, ...] | None = None,
        lease_seconds: float | None = None,
        on_outcome: Callable[[Claim, Outcome], None] | None = None,
        schedules: bool = True,
        retention: bool = True,
    ) -> Worker:
        """A worker serving every workflow registered on this app.
        ``on_outcome`` is called after each claim ends (for logging).
        ``schedules=False``: this worker fires none of the app's schedules.
        ``retention=False``: it runs no retention controller (``cairn.worker.retention``;
        a worker on a tenant's PostgreSQL role cannot delete anyway)."""
        lease = self.lease_seconds if lease_seconds is None else lease_seconds
        settings = WorkerSettings(concurrency, lease, poll_interval, queues, schedules, retention)
        return Worker(self.runtime, settings, worker_id, on_outcome)

    def close(self) -> None:
        if self._inline_driver is not None:
            self._inline_driver.close()
        self.store.close()

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _bind(definition: WorkflowDef, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    try:
        return definition.bind(args, kwargs)
    except TypeError as exc:
        raise PayloadError(f"arguments do not fit workflow {definition.name!r}: {exc}") from None
