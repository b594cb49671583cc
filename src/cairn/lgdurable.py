"""Durable execution of LangGraph graphs on Cairn's workers (issue 24, part 2).

``app.langgraph(compiled, name="agent")`` registers a compiled LangGraph
graph as a Cairn workflow: started with ``app.start`` / ``cairn start`` /
``POST /api/runs``, claimed by ``cairn worker``, and resumed by another
worker from its last super-step when its worker dies, with no recovery code.

How a run executes (``LangGraphRun``):

* The graph's checkpoints live in Cairn's store, thread ``lg:<run id>`` of
  the run's tenant, through a ``CairnSaver`` fenced by the execution's lease
  epoch: it takes the thread before reading it, and once a later lease has
  taken it every write of this one is refused (``ThreadTaken`` becomes
  ``LeaseLost``), so a frozen worker never forks the thread. The graph runs
  with ``durability="sync"``: a super-step's checkpoint is durable before the
  next super-step starts.
* Each root checkpoint is also a journal entry of the run (kind
  ``langgraph``, named ``step N: <nodes that ran>``: what ``cairn show``, the
  SSE stream and the dashboard list), recorded after the checkpoint and used
  as the run's restore point: an execution resumes past the latest one, and
  LangGraph resumes from its latest checkpoint (its finished tasks of the
  unfinished super-step are not run again: their writes are stored).
* Journaled calls made inside a node (Cairn tools, steps, ``ctx.model``) are
  matched to their records by the LangGraph task that makes them and their
  order in it (``Execution.scope``), not by the run's order: a task that is
  run again after a crash replays (or reconciles) its own calls, whatever
  its finished siblings did, so each ``write`` effect happens once.
* ``interrupt()`` in a node becomes an approval request of the run (one per
  pending interrupt, all of a super-step's open together): the run suspends
  and holds no worker; once decided, the graph resumes with
  ``Command(resume=answer)``: the edit when the approver edited, the
  interrupt's value as it was when approved as asked. A rejection or an
  expiry fails the run. With ``interrupts="signal"`` the pending interrupts
  are published (event ``interrupts``) and signal ``resume`` carries the
  answer (a map by interrupt id when there are several).
* A static interrupt (``compile(interrupt_before=..., interrupt_after=...)``)
  is an approval of the run too (details: the state), asked before
  (after) the named nodes run; approved, the graph goes on; edited, the
  edit is applied as ``update_state`` would (as the node named, validated
  as the state's fields) first; rejected, the run fails. The driver, not
  LangGraph, decides where they are (``cairn.lgbreakpoints`` says why).
  With ``interrupts="signal"`` it is published and signal ``resume``
  answers it (``None``: go on; a map of fields: the edit).
* A run is finished when its latest checkpoint has no task left
  (``snapshot.tasks``), not when ``snapshot.next`` is empty: see ``_drive``.

Requires ``langgraph`` (the ``langgraph`` extra).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from cairn import faults
from cairn.codec import values
from cairn.engine import approvals
from cairn.engine import execution as executions
from cairn.engine.context import Context
from cairn.engine.definitions import WorkflowDef
from cairn.engine.execution import Execution
from cairn.errors import CairnError, InvalidArgument, LeaseLost, MissingExtra, ThreadTaken
from cairn.faults import fault_point
from cairn.store.records import ApprovalStatus

try:  # LangGraph's own modules first: without the extra, the error names this module
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.runnables import RunnableConfig
    from langchain_core.runnables.config import var_child_runnable_config
    from langgraph.checkpoint.base import ChannelVersions, Checkpoint, CheckpointMetadata
    from langgraph.graph.state import StateGraph
    from langgraph.pregel import Pregel
    from langgraph.types import Command
except ImportError as exc:  # pragma: no cover - the extra is installed in dev
    raise MissingExtra("cairn.lgdurable", "langgraph") from exc
from cairn.langgraph import CairnSaver  # after the extra's check, so its message names this module
from cairn.lgbreakpoints import Breakpoint, Breakpoints, nodes_of

#: the journal entries of a LangGraph run's root checkpoints (its restore points)
KIND = "langgraph"
#: the channel of a task's error in LangGraph's pending writes (private in LangGraph 1.x)
ERROR = "__error__"
#: a compiled graph, whatever its state, context, input and output types
Graph = Pregel[Any, Any, Any, Any]
#: how an ``interrupt()`` is answered: an approval request each, or signal ``resume``
INTERRUPT_MODES = ("approval", "signal")
#: the signal answering a run's pending interrupts (``interrupts="signal"``)
RESUME_SIGNAL = "resume"
#: the event naming a run's pending interrupts (``interrupts="signal"``)
INTERRUPTS_EVENT = "interrupts"

_log = logging.getLogger(__name__)


class InterruptRejected(CairnError):
    """An ``interrupt()`` or a static interrupt of a LangGraph run was
    rejected (or its approval expired): the run fails, and the graph is not
    resumed."""


def thread_of(run_id: str) -> str:
    """The LangGraph thread of run ``run_id`` in ``CairnSaver``."""
    return f"lg:{run_id}"


def graph_of(fn: Callable[..., Any]) -> Graph | None:
    """The compiled graph a workflow function runs, if it is a LangGraph one."""
    found = getattr(fn, "__cairn_langgraph__", None)
    return found if isinstance(found, Pregel) else None


def check(graph: Any, name: Any, version: Any, interrupts: Any = "approval") -> Graph:
    """``graph`` if it can run as a workflow; ``InvalidArgument`` (one line) if not."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"app.langgraph needs name= (a non-empty string), not {name!r}")
    if interrupts not in INTERRUPT_MODES:
        raise InvalidArgument(f"app.langgraph({name!r})'s interrupts= is 'approval' or 'signal', not "
                              f"{interrupts!r}")
    if not isinstance(version, str) or not version:
        raise InvalidArgument(f"app.langgraph's version= is a non-empty string, not {version!r}")
    if isinstance(graph, StateGraph):
        raise InvalidArgument(f"app.langgraph({name!r}) takes a compiled graph: call .compile() on the "
                              "StateGraph first (without a checkpointer)")
    if not isinstance(graph, Pregel):
        raise InvalidArgument(f"app.langgraph({name!r}) takes a compiled LangGraph graph "
                              f"(StateGraph(...).compile()), not {type(graph).__name__}")
    saver = graph.checkpointer
    if saver is not None:
        shown = "False" if saver is False else "True" if saver is True else type(saver).__name__
        raise InvalidArgument(f"graph {name!r} was compiled with checkpointer={shown}: compile it without "
                              "one (each run gets a CairnSaver fenced by its lease)")
    for node, subgraph in graph.get_subgraphs(recurse=True):
        found: Any = subgraph  # a Pregel (LangGraph types it by its protocol)
        static = [*nodes_of(found.interrupt_before_nodes), *nodes_of(found.interrupt_after_nodes)]
        if static:
            # LangGraph records a subgraph's stop in the parent task's pending
            # writes only, and a resume passes it: Cairn stops at the root's nodes
            raise InvalidArgument(f"graph {name!r}: node {node!r} runs a subgraph compiled with "
                                  f"interrupt_before/interrupt_after ({', '.join(static)}): compile the "
                                  f"parent with interrupt_before=[{node!r}] or call "
                                  "langgraph.types.interrupt() in the subgraph's node")
    return graph


def workflow(graph: Graph, name: str, version: str, interrupts: str = "approval") -> WorkflowDef:
    """The workflow definition of ``graph``: one parameter, the graph's input
    (``app.start(w, {"messages": [...]})``); its result is the final state.
    ``interrupts``: how an ``interrupt()`` is answered (``INTERRUPT_MODES``)."""
    async def run_langgraph(ctx: Context, input: Any = None) -> Any:
        return await LangGraphRun(name, graph, ctx, interrupts).run(input)

    run_langgraph.__cairn_langgraph__ = graph  # type: ignore[attr-defined]
    run_langgraph.__qualname__ = run_langgraph.__name__ = f"langgraph:{name}"
    signature = inspect.Signature([inspect.Parameter("input", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                     default=None)])
    return WorkflowDef(name=name, version=version, fn=run_langgraph, is_async=True, signature=signature,
                       param_types={"input": Any}, result_type=Any)


def run_context() -> Context:
    """The ``Context`` of the run whose LangGraph node calls this (for
    ``ctx.model``, ``ctx.memory``, ...: journaled per task like tools)."""
    execution = executions.current()
    if execution is None:
        raise InvalidArgument("cairn.lgdurable.run_context() is called inside a node of a graph run by "
                              "app.langgraph")
    return Context(execution)


class RunSaver(CairnSaver):
    """The saver of one execution: fenced by its lease; tells the run of each
    root checkpoint (the journal's restore points) and which nodes wrote."""

    def __init__(self, run: LangGraphRun) -> None:
        execution = run.execution
        super().__init__(execution.store, tenant=execution.run.tenant, lease=execution.epoch)
        self._run = run

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        saved = super().put(config, checkpoint, metadata, new_versions)
        if not config["configurable"].get("checkpoint_ns"):  # a subgraph's checkpoints are inside a task
            self._run.mark(checkpoint["id"], dict(metadata))
        return saved

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        # A Cairn control signal (a suspension, a lost lease) is not the
        # node's error: nothing is stored, and the task runs again
        kept = [(c, v) for c, v in writes
                if not (c == ERROR and isinstance(v, BaseException) and not isinstance(v, Exception))]
        if kept:
            super().put_writes(config, kept, task_id, task_path)
            if faults.ARMED and not config["configurable"].get("checkpoint_ns"):
                fault_point("langgraph.after_writes")


class NodeNotes(BaseCallbackHandler):
    """Which nodes started in each super-step (LangGraph's callbacks: a
    task's run carries its step and node in its metadata), for the names of
    the run's journal entries."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started: dict[int, list[str]] = {}

    def on_chain_start(self, serialized: Any, inputs: Any, *, metadata: dict[str, Any] | None = None,
                       **kwargs: Any) -> None:
        found = metadata or {}
        step, node, ns = (found.get("langgraph_step"), found.get("langgraph_node"),
                          found.get("langgraph_checkpoint_ns"))
        if not isinstance(step, int) or not isinstance(node, str) or not isinstance(ns, str) or "|" in ns:
            return  # not a task of the root graph
        with self._lock:
            started = self._started.setdefault(step, [])
            if node not in started and not node.startswith("__"):
                started.append(node)

    def of(self, step: Any) -> list[str]:
        with self._lock:
            return sorted(self._started.pop(step, [])) if isinstance(step, int) else []


class LangGraphRun:
    """One execution of a LangGraph run (from a claim to its end)."""

    def __init__(self, name: str, graph: Graph, ctx: Context, interrupts: str = "approval") -> None:
        execution = executions.current()
        assert execution is not None, "a LangGraph run executes inside an execution"
        self.name = name
        self.interrupts = interrupts
        self.ctx = ctx
        self.execution: Execution = execution
        self.thread = thread_of(execution.run_id)
        self.saver = RunSaver(self)
        #: the static interrupts, decided by the driver (``cairn.lgbreakpoints`` says why)
        self.breakpoints = Breakpoints(graph)
        self.graph = graph.copy(update={"checkpointer": self.saver, "interrupt_before_nodes": (),
                                        "interrupt_after_nodes": ()})
        #: a node has an async body only (LangGraph's sync API cannot run it)
        self.is_async = any(getattr(n.bound, "func", True) is None and getattr(n.bound, "afunc", None)
                            for n in graph.nodes.values())
        self.notes = NodeNotes()
        self.config: RunnableConfig = {"configurable": {"thread_id": self.thread}, "callbacks": [self.notes]}
        self._lock = threading.Lock()
        #: journaled calls made so far by each task (by checkpoint namespace) in this invocation
        self._calls: dict[str, int] = {}
        #: the root checkpoint the latest restore point names
        self._marked: str | None = None
        #: root checkpoints whose static interrupt this execution has decided (asked once each)
        self._decided: set[str] = set()

    async def run(self, given: Any) -> Any:
        restored = self.execution.restore_point(KIND)
        if restored is not None and restored.payload is not None:
            mark = values.decode(self.execution.runtime.payloads.raw(
                restored.payload, what=f"LangGraph step of run {self.execution.run_id!r}"))
            self._marked = str(mark.get("checkpoint_id")) if isinstance(mark, dict) else None
        # the graph runs in a thread of its own: every journaled call it makes
        # is a sibling's, matched to its record by scope (``Execution.scope``)
        return await asyncio.to_thread(self._drive, given)

    def _drive(self, given: Any) -> Any:
        execution = self.execution
        execution.scope = self._scope
        try:
            self.saver.hold(self.thread)  # before reading it: a stale lease's writes are refused from now
            self._catch_up()
            stalled: str | None = None
            while True:
                latest = self.saver.get_tuple(self.config)
                if latest is None:
                    command: Any = given
                else:
                    snapshot = self.graph.get_state(self.config)
                    if self.breakpoints and self._static(latest, snapshot):
                        continue  # the edit stored a checkpoint: go on from it
                    if snapshot.interrupts:
                        command, stalled = Command(resume=self._answers(snapshot)), None
                    elif snapshot.tasks:
                        # Issue 24's "resumed run ends early": the end is no
                        # task left, not an empty ``snapshot.next``. ``next``
                        # leaves out the tasks whose writes are stored (and
                        # ``values`` has their writes applied), so after a
                        # death between the last task's writes of a super-step
                        # and that super-step's checkpoint (fault points
                        # ``langgraph.after_writes``, ``put.before_commit``)
                        # the graph looked finished: the run completed with
                        # the nodes after it never run, or ``settle_end``
                        # failed it on their journaled calls. Resuming applies
                        # the stored writes, runs none of those tasks again,
                        # and goes on with the next super-step.
                        checkpoint_id = latest.checkpoint["id"]
                        if checkpoint_id == stalled:
                            raise CairnError(f"LangGraph run {execution.run_id!r}: resuming checkpoint "
                                             f"{checkpoint_id} stored no new checkpoint")
                        command, stalled = None, checkpoint_id
                    else:
                        return snapshot.values
                with self._lock:
                    self._calls.clear()  # every task of this invocation runs from its start
                self._invoke(command)
        except ThreadTaken as exc:
            raise LeaseLost(execution.run_id, execution.epoch) from exc

    def _invoke(self, command: Any) -> None:
        """One invocation of the graph, in this thread: the async API, on an
        event loop of this thread's own, when a node has only an async body."""
        stops = self.breakpoints.stops()
        if not self.is_async:
            self.graph.invoke(command, self.config, durability="sync", **stops)
            return

        async def invoke() -> None:
            await self.graph.ainvoke(command, self.config, durability="sync", **stops)

        asyncio.run(invoke())

    # -- the journal: restore points and scopes ------------------------------------------

    def _scope(self) -> str | None:
        """The LangGraph task making a journaled call, and the call's number in it."""
        config = var_child_runnable_config.get()
        conf = config.get("configurable") if config else None
        ns = conf.get("checkpoint_ns") if conf else None
        if not ns or conf is None or conf.get("thread_id") != self.thread:
            return None
        with self._lock:
            number = self._calls.get(ns, 0)
            self._calls[ns] = number + 1
        return f"{ns}#{number}"

    def mark(self, checkpoint_id: str, metadata: dict[str, Any]) -> None:
        """Record root checkpoint ``checkpoint_id`` in the run's journal: the
        restore point of the next execution (``Execution.restore_point``)."""
        if faults.ARMED:
            fault_point("langgraph.after_checkpoint")
        step = metadata.get("step")
        nodes = self.notes.of(step)
        name = f"step {step}: {', '.join(nodes)}" if nodes else f"step {step} ({metadata.get('source')})"
        execution = self.execution
        key = hashlib.blake2b(checkpoint_id.encode(), digest_size=8).hexdigest()
        call = execution.begin(KIND, name, key)
        if call.recorded is None:
            record = {"step": step, "checkpoint_id": checkpoint_id, "nodes": nodes,
                      "source": metadata.get("source")}
            execution.record_restore_point(call, execution.runtime.payloads.wrap(values.encode(record)))
        self._marked = checkpoint_id

    def _catch_up(self) -> None:
        """Record the latest root checkpoint if the last execution stored it
        but died before its journal entry: the calls it made before it are
        then behind the run's position, as on any restore point."""
        latest = self.saver.get_tuple(self.config)
        if latest is None or latest.checkpoint["id"] == self._marked:
            return
        self.mark(latest.checkpoint["id"], dict(latest.metadata or {}))

    # -- interrupts -------------------------------------------------------------------

    def _answers(self, snapshot: Any) -> Any:
        """The answer to each pending interrupt (the run suspends, holding no
        worker, until there is one): one value, or a map by interrupt id when
        several tasks of the super-step wait (LangGraph's resume map)."""
        pending = [(task.name, found) for task in snapshot.tasks for found in task.interrupts]
        answers = self._signalled(pending) if self.interrupts == "signal" else self._approved(pending)
        return next(iter(answers.values())) if len(answers) == 1 else answers

    def _approved(self, pending: list[tuple[str, Any]]) -> dict[str, Any]:
        """One approval request per interrupt, every one of them open before
        the run waits for the first decision: the super-step's parallel
        interrupts are asked together, not one after the other."""
        execution = self.execution
        asked = [(found, approvals.ask(execution, f"LangGraph {self.name}: interrupt in {node} "
                                                  f"({found.id[:8]})", found.value, timeout=None,
                                       approvers=None, type_=Any))
                 for node, found in pending]
        answers: dict[str, Any] = {}
        for found, made in asked:
            decision = approvals.decision(execution, made, Any)
            if not decision.approved:
                by = f" by {decision.decided_by}" if decision.decided_by else ""
                raise InterruptRejected(f"{made.action}: {decision.status.value}{by}")
            answers[found.id] = decision.data if decision.status is ApprovalStatus.EDITED else found.value
        return answers

    def _static(self, latest: Any, snapshot: Any) -> bool:
        """Stop at the static interrupt root checkpoint ``latest`` is, if it
        is one (``Breakpoints.at``) and this execution has not decided it:
        ask (or replay) its decision. ``True`` when an edit was applied
        (``update_state``, as the node named), which stored a new checkpoint.

        An edit's checkpoint is never a breakpoint (its source is ``update``)
        and is what the next execution resumes from once stored, so a crash
        after it neither asks again nor applies the edit twice; a crash
        before it asks again only in the journal: the decision replays."""
        checkpoint_id = latest.checkpoint["id"]
        if checkpoint_id in self._decided:
            return False
        found = self.breakpoints.at(self.graph, latest, snapshot.tasks)
        if found is None:
            return False
        state = snapshot.values
        update = self._edit_signalled(found, state) if self.interrupts == "signal" else \
            self._edit_approved(found, state)
        self._decided.add(checkpoint_id)
        if update is None:
            return False
        as_node = self.breakpoints.as_node(self.graph, latest, found)
        self.graph.update_state(self.config, update, as_node=as_node)
        return True

    def _edit_approved(self, found: Breakpoint, state: Any) -> dict[str, Any] | None:
        """An approval of the stop (details: the state); the edit, if the approver edited."""
        execution = self.execution
        kind = self.breakpoints.details_type(state)
        action = f"LangGraph {self.name}: {found.describe()} (step {found.step})"
        made = approvals.ask(execution, action, state, timeout=None, approvers=None, type_=kind)
        decision = approvals.decision(execution, made, kind)
        if not decision.approved:
            by = f" by {decision.decided_by}" if decision.decided_by else ""
            raise InterruptRejected(f"{made.action}: {decision.status.value}{by}")
        if decision.status is not ApprovalStatus.EDITED:
            return None
        return self.breakpoints.checked(decision.data)

    def _edit_signalled(self, found: Breakpoint, state: Any) -> dict[str, Any] | None:
        """The stop published (event ``interrupts``: the checkpoint's id as the
        interrupt's, the nodes, the state) and answered by signal ``resume``:
        ``None`` goes on, a map of state fields is an edit; anything else is
        logged and passed over (the run waits for the next)."""
        self.ctx.set_event(INTERRUPTS_EVENT, [{"id": found.checkpoint_id, "node": found.describe(),
                                               "before": list(found.before), "after": list(found.after),
                                               "value": state}])
        while True:
            data = self.ctx.wait_for_signal(RESUME_SIGNAL)
            if data is None:
                return None
            try:
                return self.breakpoints.checked(data)
            except InvalidArgument as exc:
                _log.warning("run %s: signal %r passed over: %s", self.execution.run_id, RESUME_SIGNAL, exc)

    def _signalled(self, pending: list[tuple[str, Any]]) -> dict[str, Any]:
        """The answers carried by signal ``resume``: the pending interrupts are
        published first (event ``interrupts``: id, node and value of each).
        With one interrupt the signal's data is its answer; with several, a
        map naming each interrupt id (a signal that does not is logged and
        passed over: the run waits for the next)."""
        ids = [found.id for _, found in pending]
        self.ctx.set_event(INTERRUPTS_EVENT, [{"id": found.id, "node": node, "value": found.value}
                                              for node, found in pending])
        while True:
            data = self.ctx.wait_for_signal(RESUME_SIGNAL)
            if len(ids) == 1:
                return {ids[0]: data}
            if isinstance(data, dict) and all(i in data for i in ids):
                return {i: data[i] for i in ids}
            _log.warning("run %s: signal %r passed over: it answers %d interrupts, so its data is a map "
                         "naming each interrupt id (%s)", self.execution.run_id, RESUME_SIGNAL, len(ids),
                         ", ".join(ids))


__all__ = ["INTERRUPTS_EVENT", "INTERRUPT_MODES", "KIND", "RESUME_SIGNAL", "InterruptRejected",
           "LangGraphRun", "RunSaver", "check", "graph_of", "run_context", "thread_of", "workflow"]
