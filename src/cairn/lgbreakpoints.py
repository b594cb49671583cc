"""Static interrupts of a LangGraph graph run on Cairn workers
(``compile(interrupt_before=[...], interrupt_after=[...])``, or ``"*"``).

Why the driver decides them itself. LangGraph stops at a static interrupt
by raising inside its loop and remembers that it passed one only in the
*next* checkpoint (``versions_seen["__interrupt__"]``, set by any resume
with ``None`` or a ``Command``). Nothing stored says "stopped at a
breakpoint": the checkpoint it stops at is the same as the one a killed
worker leaves between two super-steps, and resuming that one (what the
driver does after a crash) passes the breakpoint silently. So the graph
is copied without its static interrupts, and whether a checkpoint is a
breakpoint is a pure function of the stored checkpoint (``Breakpoints.at``),
asked the same way whether this execution just stopped there or a dead
one left it there; the decision is a journaled approval (or signal wait),
replayed by any later execution. LangGraph is still told to stop at the
same nodes per invocation (``stops``), so it never runs past one: that is
its only role.

The rule, LangGraph's: a root checkpoint stored by the loop (not the input,
not an edit's update) is a breakpoint *before* the interrupt nodes among
its tasks, and *after* those among the tasks of the super-step that stored
it (its parent checkpoint's tasks; after the last super-step too, so an
edit may change the final state). Both at one checkpoint are one stop, as
in LangGraph. ``"*"`` is every node but LangGraph's hidden ones
(``__start__``).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, TypedDict, cast

from cairn.codec import schemas, values
from cairn.errors import InvalidArgument, PayloadError

try:
    from langgraph.checkpoint.base import CheckpointTuple
    from langgraph.constants import TAG_HIDDEN
    from langgraph.pregel import Pregel
except ImportError as exc:  # pragma: no cover - the extra is installed in dev
    from cairn.errors import MissingExtra

    raise MissingExtra("cairn.lgbreakpoints", "langgraph") from exc

#: a checkpoint source that can be a breakpoint (``input``: the run's input; ``update``: an edit)
LOOP = "loop"
#: what an edit is when the graph has no state type (a map; a state type whose fields' types
#: have no JSON Schema, LangChain messages, still names its fields: each is then ``Any``)
ANY_UPDATE = dict[str, Any]


def nodes_of(found: Any) -> list[str]:
    """The node names of ``interrupt_before`` / ``interrupt_after`` (``["*"]`` for all)."""
    if not found:
        return []
    return ["*"] if found == "*" else [str(n) for n in found]


@dataclasses.dataclass(frozen=True, slots=True)
class Breakpoint:
    """A root checkpoint the run stops at: before ``before`` run, after ``after`` ran."""

    checkpoint_id: str
    step: int
    before: tuple[str, ...]
    after: tuple[str, ...]
    #: the nodes of the super-step that stored the checkpoint (``None``: not looked up)
    ran: tuple[str, ...] | None

    def describe(self) -> str:
        """``before pay`` / ``after draft`` / ``after draft; before pay``."""
        parts = ([f"after {', '.join(self.after)}"] if self.after else []) + (
            [f"before {', '.join(self.before)}"] if self.before else [])
        return "; ".join(parts)


class Breakpoints:
    """The static interrupts of one graph, and what an edit of its state may be."""

    def __init__(self, graph: Pregel[Any, Any, Any, Any]) -> None:
        self.before = nodes_of(graph.interrupt_before_nodes)
        self.after = nodes_of(graph.interrupt_after_nodes)
        self._hidden = {name for name, node in graph.nodes.items() if TAG_HIDDEN in (node.tags or ())}
        #: what an edit is decoded as: the state's fields, each optional (an update, as a node returns)
        self.update_type, self._fields = update_type(graph)

    def __bool__(self) -> bool:
        return bool(self.before or self.after)

    def stops(self) -> dict[str, Any]:
        """The keyword arguments that make one invocation stop at these nodes."""
        if not self:
            return {}
        return {"interrupt_before": _argument(self.before), "interrupt_after": _argument(self.after)}

    def at(self, graph: Pregel[Any, Any, Any, Any], latest: CheckpointTuple, tasks: Sequence[Any]) \
            -> Breakpoint | None:
        """The breakpoint root checkpoint ``latest`` (whose tasks are ``tasks``) is, if any."""
        metadata = latest.metadata or {}
        if metadata.get("source") != LOOP:
            return None
        before = self._matching(self.before, (t.name for t in tasks))
        ran = self.ran(graph, latest) if self.after else None
        after = self._matching(self.after, ran or ())
        if not before and not after:
            return None
        step = metadata.get("step")
        return Breakpoint(latest.checkpoint["id"], step if isinstance(step, int) else -1, before, after, ran)

    @staticmethod
    def ran(graph: Pregel[Any, Any, Any, Any], latest: CheckpointTuple) -> tuple[str, ...]:
        """The nodes of the super-step that stored ``latest``: its parent's tasks."""
        if latest.parent_config is None:
            return ()
        return tuple(t.name for t in graph.get_state(latest.parent_config).tasks)

    def as_node(self, graph: Pregel[Any, Any, Any, Any], latest: CheckpointTuple, found: Breakpoint) -> str:
        """The node an edit at ``found`` is applied as (``update_state(as_node=)``):
        the interrupted node after it ran; before a node, one that ran in the
        super-step before (so the interrupted nodes are still the next tasks)."""
        if found.after:
            return found.after[0]
        ran = found.ran if found.ran is not None else self.ran(graph, latest)
        return sorted(ran)[0] if ran else "__start__"

    def details_type(self, state: Any) -> Any:
        """The approval's type: the update type when the state decodes as it, else a map."""
        if self.update_type is ANY_UPDATE:
            return ANY_UPDATE
        try:
            values.decode(values.encode(state), self.update_type)
        except PayloadError:
            return ANY_UPDATE
        return self.update_type

    def checked(self, data: Any) -> dict[str, Any]:
        """``data`` as an update of the state (a signal's edit): ``InvalidArgument`` (one line) if not."""
        if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
            raise InvalidArgument(f"an edit of the state is a map of its fields, not {type(data).__name__}")
        if self._fields is not None:
            unknown = sorted(set(data) - self._fields)
            if unknown:
                raise InvalidArgument(f"an edit names {', '.join(unknown)}, not a field of the state "
                                      f"({', '.join(sorted(self._fields))})")
        if self.update_type is not ANY_UPDATE:
            try:
                decoded = values.decode(values.encode(data), self.update_type, what="the edit of the state")
            except PayloadError as exc:
                raise InvalidArgument(str(exc)) from None
            return cast(dict[str, Any], decoded)
        return data

    def _matching(self, wanted: list[str], names: Iterable[str]) -> tuple[str, ...]:
        if wanted == ["*"]:
            return tuple(sorted({n for n in names if n not in self._hidden}))
        return tuple(sorted({n for n in names if n in wanted}))


def _argument(nodes: list[str]) -> Any:
    return "*" if nodes == ["*"] else nodes


def update_type(graph: Pregel[Any, Any, Any, Any]) -> tuple[Any, frozenset[str] | None]:
    """A ``TypedDict`` of the graph's state fields, none required: what an
    edit of the state is validated as (``ANY_UPDATE`` when Cairn cannot
    describe their types, e.g. LangChain message objects); and the fields'
    names (``None``: unknown, a graph without a state type)."""
    schema = getattr(getattr(graph, "builder", None), "state_schema", None)
    if not isinstance(schema, type):
        return ANY_UPDATE, None
    try:
        hints = typing.get_type_hints(schema)
    except Exception:  # a forward reference Cairn cannot resolve: the edit is not typed
        return ANY_UPDATE, None
    model_fields = getattr(schema, "model_fields", None)
    if isinstance(model_fields, dict):
        names = list(model_fields)
    elif dataclasses.is_dataclass(schema):
        names = [f.name for f in dataclasses.fields(schema)]
    else:
        names = [n for n, t in hints.items() if typing.get_origin(t) is not ClassVar]
    fields = {n: hints[n] for n in names if n in hints}
    make = cast(Any, TypedDict)
    partial = make(f"{schema.__name__}Update", fields, total=False)
    partial.__module__ = schema.__module__  # the name an approval's type shows
    try:
        schemas.schema_of(partial)
    except PayloadError:  # the fields are still named: an edit naming another is refused where decided
        partial = make(f"{schema.__name__}Update", dict.fromkeys(fields, Any), total=False)
        partial.__module__ = schema.__module__
    return partial, frozenset(fields)


__all__ = ["ANY_UPDATE", "Breakpoint", "Breakpoints", "nodes_of", "update_type"]
