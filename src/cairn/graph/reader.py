"""Reading a graph run's checkpoints from the store: its history of
super-steps and the state at any of them (``app.checkpoints``,
``app.graph_state``; shaped as plain records so the CLI and the HTTP API
can serve them as they are)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cairn.codec.payloads import PayloadCodec
from cairn.engine.journal import Journal
from cairn.errors import InvalidArgument
from cairn.graph import checkpoints
from cairn.graph.checkpoints import KIND, Chain
from cairn.graph.graph import Compiled
from cairn.store.contract import Store
from cairn.store.records import EventType, HistoryEvent


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One super-step of a graph run, as its history lists it."""

    run_id: str
    #: the super-step (0: the input)
    step: int
    #: the tasks that ran in it (a node once per task; a ``Send`` fan-out lists it per item)
    nodes: tuple[str, ...]
    #: the nodes the next super-step runs (empty: the graph reached END)
    next: tuple[str, ...]
    #: when it was committed
    at: float
    #: the run's history entry holding it
    seq: int
    #: the super-step before it (``None`` for the input)
    parent: int | None

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "step": self.step, "nodes": list(self.nodes), "next": list(self.next),
                "at": self.at, "seq": self.seq, "parent": self.parent}


def graph_of(fn: Any) -> Compiled | None:
    """The graph a workflow function runs, if it is a graph's (``runner.workflow``)."""
    found = getattr(fn, "__cairn_graph__", None)
    return found if isinstance(found, Compiled) else None


class GraphHistory:
    """The live checkpoints of one run (those no operator retry or rewind voided)."""

    def __init__(self, store: Store, payloads: PayloadCodec, run_id: str,
                 history: list[HistoryEvent] | None = None) -> None:
        self.run_id = run_id
        self._payloads = payloads
        journal = Journal(store.history(run_id) if history is None else history)
        self.entries: dict[int, HistoryEvent] = {}
        for entry in journal.outcomes.values():
            step = checkpoints.step_of(entry.name) if entry.step_kind == KIND else None
            if step is not None and entry.event is EventType.STEP_COMPLETED:
                self.entries[step] = entry
        self.chain = Chain(list(self.entries), self._load)

    def _load(self, step: int) -> checkpoints.Record:
        payload = self.entries[step].payload
        assert payload is not None
        what = f"checkpoint {step} of run {self.run_id!r}"
        return checkpoints.decode(self._payloads.raw(payload, what=what))

    def checkpoints(self, *, before: int | None = None, limit: int = 50) -> list[Checkpoint]:
        """Newest first: the checkpoints of super-steps below ``before``
        (all: ``None``), at most ``limit``."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidArgument(f"limit must be a positive integer, not {limit!r}")
        steps = [s for s in reversed(self.chain.steps) if before is None or s < before][:limit]
        found = []
        for step in steps:
            record = self.chain.record(step)
            entry = self.entries[step]
            following = tuple(t.node for t in record.tasks())
            found.append(Checkpoint(self.run_id, step, tuple(record.nodes), following, entry.at, entry.seq,
                                    record.parent))
        return found

    def state(self, graph: Compiled, step: int | None = None) -> Any:
        """The state after super-step ``step`` (the latest: ``None``), as the graph's state type."""
        if step is None:
            step = self.chain.latest()
            if step is None:
                raise InvalidArgument(f"run {self.run_id!r} has no checkpoint yet")
        elif step not in self.entries:
            raise InvalidArgument(f"run {self.run_id!r} has no checkpoint at super-step {step!r}")
        state = self.chain.state(graph.schema, step, f"checkpoint {step} of run {self.run_id!r}")
        return graph.schema.view(state)
