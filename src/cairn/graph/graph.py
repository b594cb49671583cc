"""``cairn.Graph``: nodes, edges and routers over a typed state.

A graph is built by calls (``node``, ``edge``, ``route``) and checked once,
by ``compile`` (``app.graph`` calls it): everything that can be known
without running it (an edge to a node that does not exist, a node with no
way on, a loop with no way out to ``END``) is refused there, before a run
or a bundle is stored. What only a run can tell (a router naming a missing
node, an update that does not fit) fails that run with a ``GraphError``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, overload

from cairn.graph.errors import InvalidGraph
from cairn.graph.state import Schema
from cairn.retry import NO_RETRY, RetryPolicy

#: where every run enters the graph (``g.edge(START, "first")``)
START = "__start__"
#: where a branch leaves it (``g.edge("last", END)``, or a router returning it)
END = "__end__"

NodeFn = Callable[..., Any]
Router = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class Send:
    """A router's request to run ``node`` in the next super-step with
    ``arg`` (any JSON value) as its input instead of the state: one ``Send``
    per item maps a node over a list computed at run time."""

    node: str
    arg: Any = None


@dataclass(frozen=True, slots=True)
class Node:
    """A registered node: its function and how it is called."""

    name: str
    fn: NodeFn
    is_async: bool
    #: ``(state, ctx)`` rather than ``(state)``
    takes_context: bool
    retry: RetryPolicy
    #: ask for an approval (``ctx.request_approval``) before a super-step
    #: running this node, and after one that ran it; an edit sets the state
    interrupt_before: bool = False
    interrupt_after: bool = False


def _takes_context(name: str, fn: NodeFn) -> bool:
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return False
    if not params or len(params) > 2:
        raise InvalidGraph(f"node {name!r} takes (state) or (state, ctx), not {len(params)} parameters")
    return len(params) == 2


class Graph:
    """A graph under construction. ``app.graph(name, graph)`` compiles it
    into a workflow; the graph may not change afterwards (the bundle of its
    runs is computed from it)."""

    def __init__(self, state: Any) -> None:
        self.schema = Schema(state)
        self.nodes: dict[str, Node] = {}
        self.edges: dict[str, list[str]] = {}
        self.routers: dict[str, Router] = {}

    @overload
    def node(self, fn: NodeFn, /, *, name: str | None = None, retry: RetryPolicy | None = None,
             interrupt_before: bool = False, interrupt_after: bool = False) -> NodeFn: ...

    @overload
    def node(self, fn: None = None, /, *, name: str | None = None, retry: RetryPolicy | None = None,
             interrupt_before: bool = False, interrupt_after: bool = False) -> Callable[[NodeFn], NodeFn]: ...

    def node(self, fn: NodeFn | None = None, /, *, name: str | None = None,
             retry: RetryPolicy | None = None, interrupt_before: bool = False,
             interrupt_after: bool = False) -> Any:
        """Add a node: ``fn(state)`` or ``fn(state, ctx)``, sync or async,
        returning a dict of the fields it updates (or ``None``). Without
        ``retry`` a failing node fails the run. ``interrupt_before`` /
        ``interrupt_after``: the run waits for an approval (``cairn
        approvals``, ``app.approve``) with the state as its details before a
        super-step that runs the node / after one that ran it, holding no
        worker; an edit replaces the fields it gives, a rejection fails the run."""
        def add(f: NodeFn) -> NodeFn:
            node_name = name or getattr(f, "__name__", None)
            if not isinstance(node_name, str) or not node_name:
                raise InvalidGraph(f"node {f!r} needs a name")
            if node_name in (START, END):
                raise InvalidGraph(f"{node_name!r} is reserved: name the node otherwise")
            if node_name in self.nodes:
                raise InvalidGraph(f"node {node_name!r} is already in the graph")
            self.nodes[node_name] = Node(node_name, f, inspect.iscoroutinefunction(f),
                                         _takes_context(node_name, f), retry or NO_RETRY,
                                         bool(interrupt_before), bool(interrupt_after))
            return f

        return add(fn) if fn is not None else add

    def edge(self, source: str, target: str) -> None:
        """After ``source`` runs, ``target`` runs in the next super-step."""
        if source == END or target == START:
            raise InvalidGraph(f"no edge leaves END or enters START ({source!r} -> {target!r})")
        self.edges.setdefault(source, [])
        if target not in self.edges[source]:
            self.edges[source].append(target)

    def route(self, source: str, router: Router) -> None:
        """After ``source`` runs, ``router(state)`` names what runs next: a
        node, a list of nodes, ``END``, or ``Send``\\ s (state is the state
        after the super-step). One router per node."""
        if source == END:
            raise InvalidGraph("END has no router")
        if source in self.routers:
            raise InvalidGraph(f"node {source!r} has a router already")
        if not callable(router):
            raise InvalidGraph(f"the router of {source!r} is not callable: {router!r}")
        self.routers[source] = router

    def compile(self) -> Compiled:
        """The graph, checked (``InvalidGraph`` naming what is wrong)."""
        if not self.nodes:
            raise InvalidGraph("the graph has no node")
        known = set(self.nodes)
        for source, targets in self.edges.items():
            for name in (source, *targets):
                if name not in known and name not in (START, END):
                    raise InvalidGraph(f"edge {source!r} -> {targets!r} names {name!r}, which is not a node "
                                       f"(nodes: {', '.join(sorted(known))})")
        for source in self.routers:
            if source not in known and source != START:
                raise InvalidGraph(f"a router leaves {source!r}, which is not a node")
        if not self.edges.get(START) and START not in self.routers:
            raise InvalidGraph("nothing leaves START: add g.edge(cairn.START, <first node>)")
        for name in sorted(known):
            if not self.edges.get(name) and name not in self.routers:
                raise InvalidGraph(f"node {name!r} has no way on: add g.edge({name!r}, cairn.END), another "
                                   "edge or a router")
        stuck = _without_end(known, self.edges, self.routers)
        if stuck:
            raise InvalidGraph(f"no path to END from node(s) {', '.join(stuck)}: a run reaching them could "
                               "never end (add an edge to END or a router)")
        return Compiled(self.schema, dict(self.nodes), {k: tuple(v) for k, v in self.edges.items()},
                        dict(self.routers))


def _without_end(nodes: Iterable[str], edges: dict[str, list[str]], routers: dict[str, Router]) -> list[str]:
    """The nodes from which no chain of edges reaches END (a router may
    return END, so a node with one counts as reaching it)."""
    ends = {END, *routers}
    changed = True
    while changed:
        changed = False
        for source, targets in edges.items():
            if source not in ends and any(t in ends for t in targets):
                ends.add(source)
                changed = True
    return sorted(n for n in nodes if n not in ends)


@dataclass(frozen=True, slots=True)
class Compiled:
    """A checked graph: what the runner executes and the bundle hashes."""

    schema: Schema
    nodes: dict[str, Node]
    edges: dict[str, tuple[str, ...]]
    routers: dict[str, Router]

    def structure(self) -> dict[str, Any]:
        """The graph's shape as JSON (part of its bundle's code hash): nodes
        with their retry policies, edges, which nodes route, the state's fields."""
        return {
            "state": {f.name: [repr(f.type), _name(f.reducer)] for f in self.schema.fields.values()},
            "nodes": {n.name: [n.takes_context, repr(n.retry), n.interrupt_before, n.interrupt_after]
                      for n in self.nodes.values()},
            "edges": {k: list(v) for k, v in sorted(self.edges.items())},
            "routers": sorted(self.routers),
        }

    def callables(self) -> list[Callable[..., Any]]:
        """What the code hash reaches into: node functions, routers, custom reducers."""
        found: list[Callable[..., Any]] = [self.nodes[n].fn for n in sorted(self.nodes)]
        found += [self.routers[n] for n in sorted(self.routers)]
        found += [f.reducer for f in self.schema.fields.values() if f.reducer is not None]
        return found


def _name(fn: Any) -> str | None:
    if fn is None:
        return None
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"
