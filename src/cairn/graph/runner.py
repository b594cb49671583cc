"""A graph run: the workflow ``app.graph`` registers, executing super-steps.

Each super-step runs its tasks side by side (async nodes as tasks of the
run's event loop, sync ones in its threads: the engine's concurrency inside
a run, so their journaled calls take positions the engine reconciles on
replay), merges their updates in task order (whatever order they finish
in), asks the routers what runs next and commits one checkpoint
(``graph.checkpoints``) through the engine's fenced commit path. A new
execution of the run starts from its latest checkpoint
(``Execution.restore_point``): super-steps that committed never run again;
the one that did not commit runs again, and its nodes' tools, steps and
model calls replay or reconcile from the journal as in any workflow.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping
from typing import Any

from cairn.engine import execution as executions
from cairn.engine import workspace
from cairn.engine.context import Context
from cairn.engine.definitions import WorkflowDef
from cairn.errors import IncompatiblePayload, PayloadError, WorkspaceConflict
from cairn.graph import checkpoints
from cairn.graph.checkpoints import KIND, Chain, Task
from cairn.graph.errors import GraphError, cut
from cairn.graph.graph import END, START, Compiled, Node, Send
from cairn.graph.reader import GraphHistory, graph_of
from cairn.graph.state import Records
from cairn.graph.travel import SEED_PARAM, Seed
from cairn.store.records import ApprovalStatus, EventType, HistoryEvent


def workflow(name: str, version: str, graph: Compiled, max_steps: int) -> WorkflowDef:
    """The workflow definition of ``graph``: one parameter, the input state;
    its result is ``{"step": n}`` (the final state is the last checkpoint's,
    read by ``App`` rather than stored a second time).

    The input is declared as plain JSON and validated as the state type by
    the runner at super-step 0 (and by ``App`` before a run is stored): a
    resumed run never reads it again, so a deploy whose state type no
    longer reads the input must not fail the run before its checkpoint is
    even looked at (a checkpoint it cannot read parks it as incompatible)."""
    async def run_graph(ctx: Context, state: Any, cairn_fork: Seed | None = None) -> dict[str, int]:
        return await GraphRun(name, graph, max_steps, ctx).run(state, cairn_fork)

    run_graph.__cairn_graph__ = graph  # type: ignore[attr-defined]
    run_graph.__qualname__ = run_graph.__name__ = f"graph:{name}"
    # ``cairn_fork``: a replay's or a fork's seed (``graph.travel``), never given by a plain start
    signature = inspect.Signature([
        inspect.Parameter("state", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter(SEED_PARAM, inspect.Parameter.KEYWORD_ONLY, default=None)])
    return WorkflowDef(name=name, version=version, fn=run_graph, is_async=True, signature=signature,
                       param_types={"state": Any, SEED_PARAM: Seed | None}, result_type=dict[str, int])


class GraphRun:
    """One execution of a graph run (from a claim to its end)."""

    def __init__(self, name: str, graph: Compiled, max_steps: int, ctx: Context) -> None:
        self.name = name
        self.graph = graph
        self.schema = graph.schema
        self.max_steps = max_steps
        self.ctx = ctx
        execution = executions.current()
        assert execution is not None, "a graph runs inside an execution"
        self.execution = execution
        #: the next checkpoint sets every field (the run resumed from an older state version's)
        self._whole = False

    async def run(self, given: Any, seed: Seed | None = None) -> dict[str, int]:
        restored = self.execution.restore_point(KIND)
        versions: dict[str, list[int]] = {}
        ran: list[str] = []
        if restored is None:
            committed = self.schema.initial(given)
            step = 0 if seed is None else seed.step  # a replay or a fork goes on from its seed's step
            tasks = self._next(((START, None),), committed) if seed is None else self._seeded(seed)
            self._commit(step, [], {}, committed, {}, tasks, versions, None)
        else:
            step, committed, tasks, versions, ran = self._restore()
        # ``committed``: the state of the latest checkpoint; ``state``: that
        # state as an interrupt's edit left it (the next checkpoint records both)
        state = self._interrupt("after", ran, committed)
        while tasks:
            if step >= self.max_steps:
                raise GraphError(f"graph {self.name!r} ran {self.max_steps} super-steps (max_steps) without "
                                 f"reaching END; next: {', '.join(sorted({t.node for t in tasks}))}")
            state = self._interrupt("before", [t.node for t in tasks], state)
            base = (workspace.latest_root(self.execution) or workspace.EMPTY_ROOT) if len(tasks) > 1 else None
            updates = await self._superstep(state, tasks, step, base)
            root = self._merged(step, base, tasks) if base is not None else None
            after = dict(state)
            added: dict[str, list[Any]] = {}
            records: Records = {}
            for task, update in zip(tasks, updates, strict=True):
                self.schema.apply(task.node, after, update, added, records)
            following = self._next(tuple((t.node, None) for t in tasks), after)
            step += 1
            ran = [t.node for t in tasks]
            tasks = self._commit(step, ran, committed, after, added if state is committed else {}, following,
                                 versions, step - 1, root, records)
            committed = after
            state = self._interrupt("after", ran, committed)
        if state is not committed:  # an edit after the last super-step: a checkpoint of its own
            step += 1
            self._commit(step, [], committed, state, {}, [], versions, step - 1)
        execution = self.execution  # the state of checkpoint ``step``, committed: for app.run, here
        execution.runtime.handed.put((execution.run_id, execution.epoch, ("graph", step)), state)
        return {"step": step}

    def _interrupt(self, when: str, nodes: list[str], state: dict[str, Any]) -> dict[str, Any]:
        """The approval asked ``when`` ("before"/"after") the nodes that
        want one, with ``state`` as its details: ``state`` again when
        approved, with the edit's fields set when edited; a rejection or an
        expiry fails the run. The request suspends the run until decided
        (no worker held); a resume replays the decision from the journal."""
        names = sorted({n for n in nodes if getattr(self.graph.nodes[n], f"interrupt_{when}")})
        if not names:
            return state
        action = f"graph {self.name}: {when} {', '.join(names)}"
        decision = self.ctx.request_approval(action, self.schema.view(state), type_=self.schema.cls)
        if not decision.approved:
            raise GraphError(f"{action}: the approval was {decision.status.value}"
                             + (f" by {decision.decided_by}" if decision.decided_by else ""))
        if decision.status is not ApprovalStatus.EDITED:
            return state
        edited = dict(state)
        for name, value in self.schema.fields_of(decision.data).items():
            field = self.schema.fields[name]
            edited[name] = field.validate(value, field.type, lambda: f"the edit {when} {', '.join(names)}")
        return edited

    def _seeded(self, seed: Seed) -> list[Task]:
        tasks = seed.tasks()
        for task in tasks:
            if task.node not in self.graph.nodes:
                raise GraphError(f"checkpoint {seed.step} of run {seed.run_id!r} runs node {task.node!r} "
                                 "next, which this graph has not")
        return tasks

    # -- checkpoints ------------------------------------------------------------------

    def _commit(self, step: int, nodes: list[str], before: Mapping[str, Any], after: Mapping[str, Any],
                added: Mapping[str, list[Any]], tasks: list[Task], versions: dict[str, list[int]],
                parent: int | None, root: str | None = None, records: Records | None = None) -> list[Task]:
        """Record the checkpoint of ``step``; return the next tasks as a
        resume will read them (a ``Send``'s arg decoded from its record).
        ``root``: the merged workspace of a parallel super-step's branches,
        recorded in the checkpoint's detail (``engine.workspace``)."""
        if self._whole:  # no checkpoint of this version reads a field from an older version's
            before, added, records, self._whole = {}, {}, None, False
            versions.clear()  # a field the state type no longer has is not carried on
        raw = checkpoints.write(self.schema, step, nodes, before, after, added, tasks, versions, parent,
                                self.execution.run_id, records)
        execution = self.execution
        call = execution.begin(KIND, checkpoints.entry_name(step))
        if call.recorded is None:
            detail = {workspace.DETAIL_KEY: root} if root is not None else None
            execution.record_restore_point(call, execution.runtime.payloads.wrap(raw), detail)
        if root is not None and execution.workspace is not None:
            execution.workspace.merged(root)
        return checkpoints.decode(raw).tasks() if any(t.send for t in tasks) else tasks

    def _restore(self) -> tuple[int, dict[str, Any], list[Task], dict[str, list[int]], list[str]]:
        """The latest checkpoint's step, state, next tasks, versions and the
        nodes that ran in it, read from the journal. A checkpoint this code
        cannot read (its state type changed, a node it names next is gone
        from the graph, a damaged row) parks the run as incompatible: a
        deploy, or a repair, may let it go on (``retry``)."""
        execution = self.execution
        run_id = execution.run_id
        entries: dict[int, HistoryEvent] = {}
        twice: list[int] = []
        for entry in execution.journal.outcomes.values():
            found = checkpoints.step_of(entry.name) if entry.step_kind == KIND else None
            if found is not None and entry.event is EventType.STEP_COMPLETED:
                if found in entries:
                    twice.append(found)
                entries[found] = entry

        def load(step: int) -> checkpoints.Record:
            what = checkpoints.what_of(run_id, step)
            if step in twice:
                raise checkpoints.damaged(what, "it is in the run's history twice")
            payload = entries[step].payload
            if payload is None:
                raise PayloadError(f"{what} has no payload")
            return checkpoints.decode(execution.runtime.payloads.raw(payload, what=what), what, step=step,
                                      run=run_id)

        chain = Chain(list(entries), load, what=lambda step: checkpoints.what_of(run_id, step))
        step = chain.latest()
        assert step is not None
        what = checkpoints.what_of(run_id, step)
        position = entries[step].position
        try:
            record = chain.record(step)
            state = chain.state(self.schema, step, what)
            tasks = record.tasks()
            for task in tasks:
                if task.node not in self.graph.nodes:
                    raise PayloadError(f"{what} runs node {task.node!r} next, which this graph has no more "
                                       f"(nodes: {', '.join(sorted(self.graph.nodes))})")
        except PayloadError as exc:  # it was recorded: the code changed (deployable) or the row is damaged
            raise IncompatiblePayload(self.schema.name, None, None, str(exc), position) from None
        except IncompatiblePayload as exc:  # no upcaster (or one that raised): the run is parked
            raise exc.at(position) if position is not None else exc from None
        self._whole = self.schema.version is not None and record.sv != self.schema.version
        ran = [n for n in record.nodes if n in self.graph.nodes]
        return step, state, tasks, {k: list(v) for k, v in record.versions.items()}, ran

    # -- a super-step -----------------------------------------------------------------

    async def _superstep(self, state: Mapping[str, Any], tasks: list[Task], step: int,
                         base: str | None) -> list[dict[str, Any]]:
        """Every task's update (validated keys), in task order. Tasks run
        side by side; all of them finish before a failure is raised (the
        first in task order), so nothing of the super-step outlives it.
        Each task of several works in a workspace directory of its own,
        made the super-step's starting snapshot ``base`` (``_merged``)."""
        if len(tasks) == 1 or base is None:  # in the workflow's own flow: no task or thread to start
            return [await self._attempts(tasks[0], state)]
        outcomes = await asyncio.gather(*(
            self._attempts(t, state, workspace.Branch(step, i, t.node, base)) for i, t in enumerate(tasks)),
            return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return outcomes  # type: ignore[return-value]

    async def _attempts(self, task: Task, state: Mapping[str, Any],
                        branch: workspace.Branch | None = None) -> dict[str, Any]:
        """Run ``task``'s node under its retry policy (attempts in this
        execution; a node whose super-step did not commit starts again)."""
        if branch is not None:  # this task's own flow (a task of ``gather``): its bodies use its directory
            workspace.BRANCH.set(branch)
        node = self.graph.nodes[task.node]
        policy = node.retry
        attempt = 1
        while True:
            try:
                returned = await self._call(node, task.arg if task.send else self.schema.view(state))
                return self.schema.update_of(node.name, returned)
            except GraphError:
                raise
            except Exception as exc:
                if not policy.retryable(exc) or attempt >= policy.max_attempts:
                    tries = f"attempt {attempt} of {policy.max_attempts}"
                    raise GraphError(f"node {node.name!r} failed ({tries}): {type(exc).__name__}: "
                                     f"{cut(str(exc))}") from exc
                await asyncio.sleep(policy.delay(attempt, exc))
                attempt += 1

    async def _call(self, node: Node, arg: Any) -> Any:
        if node.subgraph is not None:
            return self._subgraph(node, node.subgraph, arg)
        args = (arg, self.ctx) if node.takes_context else (arg,)
        if node.is_async:
            return await node.fn(*args)
        if asyncio.current_task() is self.execution.main_task:
            return node.fn(*args)  # a lone sync node: in the workflow's flow, as a sync workflow would
        return await asyncio.to_thread(node.fn, *args)

    def _subgraph(self, node: Node, workflow: Any, given: Any) -> dict[str, Any]:
        """Run graph ``workflow`` as a child run on the fields it shares with
        this state (its checkpoints are its own, under a child id derived
        from this run's) and wait for it, holding no worker; its final state
        is the update: an ``append`` field's new items, any other shared
        field that changed."""
        child = graph_of(workflow.definition.fn)
        assert child is not None
        view = given if isinstance(given, Mapping) else self.schema.fields_of(given)
        shared = {name: view[name] for name in child.schema.fields if name in view}
        handle = self.ctx.start_child(workflow, shared)
        result = handle.result()
        step = result["step"] if isinstance(result, Mapping) else None
        history = GraphHistory(self.execution.store, self.execution.runtime.payloads, handle.run_id)
        final = history.refresh().chain.state(child.schema, step, f"the final state of child run "
                                              f"{handle.run_id!r}") if isinstance(step, int) else {}
        update: dict[str, Any] = {}
        for name, value in final.items():
            field = self.schema.fields.get(name)
            if field is None:
                continue
            before = shared.get(name)
            if field.appends and isinstance(value, list) and isinstance(before, list) \
                    and value[:len(before)] == before:
                if len(value) > len(before):
                    update[name] = value[len(before):]
            elif value != before:
                update[name] = value
        return update

    def _merged(self, step: int, base: str, tasks: list[Task]) -> str | None:
        """The merge of the branches' workspaces (``None``: none used one).
        Computed from the journal, so the same whatever order the tasks
        finished in, and again the same by a worker that resumes the run. A
        conflict fails the run: the same branches would conflict again."""
        try:
            return workspace.merge_branches(self.execution, step, base, [t.node for t in tasks])
        except WorkspaceConflict as exc:
            raise GraphError(f"graph {self.name!r}, super-step {step + 1}: {exc}") from exc

    # -- routing ----------------------------------------------------------------------

    def _next(self, ran: tuple[tuple[str, Any], ...], state: Mapping[str, Any]) -> list[Task]:
        """The tasks of the next super-step: the nodes the edges and routers
        of the nodes that ran name (each once, by name), then their ``Send``s
        (in the order the routers returned them)."""
        plain: set[str] = set()
        sends: list[Task] = []
        for source in sorted({name for name, _ in ran}):
            targets: list[Any] = list(self.graph.edges.get(source, ()))
            router = self.graph.routers.get(source)
            if router is not None:
                targets += self._routed(source, router, state)
            for target in targets:
                if isinstance(target, Send):
                    self._known(source, target.node)
                    sends.append(Task(target.node, target.arg, True))
                elif target != END:
                    self._known(source, target)
                    plain.add(target)
        return [Task(name) for name in sorted(plain)] + sends

    def _routed(self, source: str, router: Any, state: Mapping[str, Any]) -> list[Any]:
        try:
            chosen = router(self.schema.view(state))
        except Exception as exc:
            raise GraphError(f"the router of {source!r} raised {type(exc).__name__}: "
                             f"{cut(str(exc))}") from None
        found = list(chosen) if isinstance(chosen, list | tuple) else [chosen]
        for target in found:
            if not isinstance(target, str | Send):
                raise GraphError(f"the router of {source!r} returned {cut(repr(target))}: a router returns "
                                 "a node name, a list of them, cairn.END or cairn.Send(node, arg)")
        return found

    def _known(self, source: str, target: str) -> None:
        if target not in self.graph.nodes:
            raise GraphError(f"the router of {source!r} named {cut(repr(target))}, which is not a node of "
                             f"graph {self.name!r} (nodes: {', '.join(sorted(self.graph.nodes))})")
