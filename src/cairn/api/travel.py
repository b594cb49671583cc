"""Time travel for ``App``: a graph run's checkpoints and states (as plain
JSON for the CLI and the HTTP API, which do not import the graph's code),
replay and fork at a checkpoint, the diff of two checkpoints and the first
super-step where two runs diverge (docs/design.md, "Time travel").

A replayed or forked run starts at its origin's super-step ``n``: its own
checkpoints are ``n`` and later, and a state before ``n`` is read from the
origin (its lineage), so that both runs share their history up to the fork.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from cairn.engine.definitions import WorkflowDef
from cairn.engine.runtime import Runtime
from cairn.engine.startedwith import StartedWith
from cairn.errors import InvalidArgument, RunNotFound
from cairn.graph import diff as diffs
from cairn.graph import travel
from cairn.graph.graph import Compiled
from cairn.graph.reader import Checkpoint, GraphHistory, Readers, graph_of
from cairn.graph.travel import Lineage
from cairn.store.records import NewRun, RunRecord

#: how ``App`` makes a new run's record: ``(definition, arguments, run_id,
#: thread_id, tenant, queue, priority, budget, started, started_by)``
NewRunOf = Callable[[WorkflowDef, dict[str, Any], str | None, str | None, str, str, int, Any, StartedWith,
                     Mapping[str, Any] | None], NewRun]


class NotAGraphRun(InvalidArgument):
    """Time travel asked of a run that has no checkpoint (not a graph run)."""


class NoCheckpoint(InvalidArgument):
    """A super-step the run has no checkpoint of."""


def check_step(step: Any, what: str = "step") -> int:
    """``step`` if it is a super-step number (a non-negative integer)."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise InvalidArgument(f"{what} must be a super-step number (a non-negative integer), not {step!r}")
    return step


class TimeTravel:
    """The time-travel readers and actions of one ``App`` (its store, its
    runtime and registry, its graph readers); ``new_run`` makes a new run's
    record as ``App.start`` does."""

    def __init__(self, runtime: Runtime, readers: Readers, new_run: NewRunOf) -> None:
        self.runtime = runtime
        self.store = runtime.store
        self.graph_readers = readers
        self.new_run = new_run

    def get_run(self, run_id: str) -> RunRecord:
        record = self.store.get_run(run_id)
        if record is None:
            raise RunNotFound(run_id)
        return record

    def lineage(self, run_id: str) -> Lineage | None:
        """Where run ``run_id`` was replayed or forked from (``None``: neither)."""
        self.get_run(run_id)
        first = self.store.history(run_id, 0, 1)
        return travel.lineage_of(first[0] if first else None)

    def history(self, run_id: str) -> GraphHistory:
        """Run ``run_id``'s own checkpoints, read without its graph's code
        (``InvalidArgument`` for a run that has none: not a graph run)."""
        record = self.get_run(run_id)
        found = self.graph_readers.of(record)
        if not found.any() and self.lineage(run_id) is None and not self._is_graph(record):
            raise NotAGraphRun(f"run {run_id!r} has no checkpoint: it is not a graph run, or it has not "
                                  "started yet")
        return found

    def checkpoints(self, run_id: str, before: int | None, limit: int) -> list[Checkpoint]:
        if before is not None:
            check_step(before, "before")
        return self.history(run_id).checkpoints(before=before, limit=limit)

    def source(self, run_id: str, step: int | None) -> tuple[GraphHistory, int]:
        """The checkpoints holding super-step ``step`` of run ``run_id`` (its
        own, or, before the step it was forked at, its origin's) and the step
        (``None``: its latest)."""
        found = self.history(run_id)
        if step is None:
            latest = found.chain.latest()
            if latest is None:
                raise NoCheckpoint(f"run {run_id!r} has no checkpoint yet")
            return found, latest
        check_step(step)
        seen = {run_id}
        current = run_id
        while step not in found.entries:
            origin = self.lineage(current)
            if origin is None or step >= origin.step or origin.run_id in seen:
                raise NoCheckpoint(f"run {run_id!r} has no checkpoint at super-step {step}"
                                      f"{self._known(found)}")
            seen.add(origin.run_id)
            current = origin.run_id
            try:
                found = self.graph_readers.of(self.get_run(current))
            except RunNotFound:
                raise NoCheckpoint(f"run {run_id!r} has no checkpoint at super-step {step}: it was forked "
                                      f"from run {current!r}, which no longer exists") from None
        return found, step

    @staticmethod
    def _known(found: GraphHistory) -> str:
        steps = found.chain.steps
        return f" (its checkpoints: {steps[0]} to {steps[-1]})" if steps else " (it has none yet)"

    def state_json(self, run_id: str, step: int | None) -> tuple[int, dict[str, Any]]:
        """The super-step and the state after it, as plain JSON values."""
        found, at = self.source(run_id, step)
        return at, found.chain.state(None, at, f"checkpoint {at} of run {found.run_id!r}")

    def state(self, run_id: str, step: int | None) -> Any:
        """The state after super-step ``step`` as the graph's state type."""
        graph = self._graph(self.get_run(run_id))
        found, at = self.source(run_id, step)
        return found.state(graph, at)

    def _is_graph(self, record: RunRecord) -> bool:
        """Whether this process registers ``record``'s workflow as a graph
        (a graph run that failed before its first checkpoint has none)."""
        try:
            self._graph(record)
        except InvalidArgument:
            return False
        return True

    def _graph(self, record: RunRecord) -> Compiled:
        definition = self.runtime.registry.definition_for(record, self.store) \
            or self.runtime.workflows.get(record.workflow)
        graph = graph_of(definition.fn) if definition is not None else None
        if graph is None:
            raise InvalidArgument(f"run {record.run_id!r} is not a run of a graph registered here")
        return graph

    def fork(self, origin_id: str, step: int, update: Any, run_id: str | None, *, edited: bool,
             started: StartedWith, started_by: Mapping[str, Any] | None) -> tuple[str, bool]:
        """A new run of the graph of run ``origin_id`` (its newest version
        registered here: a fixed node runs fixed), starting from the state
        after super-step ``step`` with ``update``'s fields set, then running the
        tasks that checkpoint named. Checked before anything is stored: the
        step, the graph's code, the update.

        The new run is a start like any other: it acts with the role of
        whoever replays or forks (``started``, ``started_by``), never with
        the origin's. Inheriting the origin's would let an operator run an
        admin's run again, from a state of its choosing, with the admin's
        rights; starting it with none would break a fork made by the very
        token that could start the run."""
        record = self.get_run(origin_id)
        found, at = self.source(origin_id, check_step(step))
        definition = self.runtime.workflows.get(record.workflow)
        graph = graph_of(definition.fn) if definition is not None else None
        if definition is None or graph is None:
            raise InvalidArgument(f"cannot {'fork' if edited else 'replay'} run {origin_id!r}: its graph "
                                  f"{record.workflow!r} is not registered in this process (app.graph(...); "
                                  "on the command line, --app module:app)")
        base = found.chain.state(graph.schema, at, f"checkpoint {at} of run {found.run_id!r}")
        start = travel.edited(graph.schema, base, update)
        seed = travel.seed_of(origin_id, found.chain.record(at))
        arguments = {"state": graph.schema.view(start), travel.SEED_PARAM: seed}
        new = self.new_run(definition, arguments, run_id, None, record.tenant, record.queue, record.priority,
                           None, started, started_by)
        new = replace(new, budget=record.budget, origin=travel.origin(origin_id, at, edited))
        _, created = self.store.create_run(new)
        return new.run_id, created

    def diff(self, run_id: str, step_a: int, step_b: int, other_run: str | None) -> list[diffs.Change]:
        """What changed from super-step ``step_a`` of ``run_id`` to ``step_b``
        of ``other_run`` (default: the same run), field by field. Two
        checkpoints of one chain whose versions give a field the same last
        change and base hold the same value of it: such a field is equal
        without being read."""
        found_a, at_a = self.source(run_id, check_step(step_a, "step_a"))
        found_b, at_b = self.source(other_run or run_id, check_step(step_b, "step_b"))
        only: set[str] | None = None
        if found_a is found_b:
            va, vb = found_a.chain.record(at_a).versions, found_b.chain.record(at_b).versions
            only = {name for name in va.keys() | vb.keys() if va.get(name) != vb.get(name)}
        a = found_a.chain.state(None, at_a, f"checkpoint {at_a} of run {found_a.run_id!r}", only)
        b = found_b.chain.state(None, at_b, f"checkpoint {at_b} of run {found_b.run_id!r}", only)
        return diffs.diff(a, b)

    def divergence(self, run_a: str, run_b: str) -> int | None:
        """The first super-step at which the states of two graph runs differ
        (``diff.equal``), ``None`` if they never do; a run that ends while the
        other goes on diverges at the step after its last (``first_divergence``'s
        rule). Steps both runs read from one checkpoint (a fork and its origin
        before the fork) are not decoded, nor are steps whose checkpoints made
        the same change to states equal until then."""
        steps_a, steps_b = self._steps(run_a), self._steps(run_b)
        equal_so_far = True
        for position in range(max(len(steps_a), len(steps_b))):
            if position >= len(steps_a) or position >= len(steps_b):
                return position
            (step_a, hist_a), (step_b, hist_b) = steps_a[position], steps_b[position]
            if step_a != step_b:
                return position
            if hist_a.run_id == hist_b.run_id:  # one checkpoint (a fork's origin before the fork)
                continue
            if equal_so_far and travel.same_delta(hist_a.chain.record(step_a), hist_b.chain.record(step_b)):
                continue
            a = hist_a.chain.state(None, step_a, f"checkpoint {step_a} of run {hist_a.run_id!r}")
            b = hist_b.chain.state(None, step_b, f"checkpoint {step_b} of run {hist_b.run_id!r}")
            if not diffs.equal(a, b):
                return position
        return None

    def _steps(self, run_id: str) -> list[tuple[int, GraphHistory]]:
        """Every super-step of ``run_id`` in order, with the checkpoints holding
        it: its origin's before the step it was forked at, then its own."""
        own = self.history(run_id)
        found = [(s, own) for s in own.chain.steps]
        origin = self.lineage(run_id)
        seen = {run_id}
        while origin is not None and origin.run_id not in seen:
            seen.add(origin.run_id)
            try:
                theirs = self.graph_readers.of(self.get_run(origin.run_id))
            except RunNotFound:
                break
            found = [(s, theirs) for s in theirs.chain.steps if s < origin.step] + found
            origin = self.lineage(origin.run_id)
        return found
