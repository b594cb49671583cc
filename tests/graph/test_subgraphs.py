"""A node that is a graph: it runs as a child run with its own checkpoints,
under an id derived from the parent's (``<parent>:<position>``), on the
fields it shares with the parent's state; its final state comes back as the
node's update (an appended list's new items, other changed fields)."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

import pytest

import cairn
from cairn.errors import RunFailed


class Outer(TypedDict):
    messages: Annotated[list[str], cairn.append]
    topic: str
    done: bool


class Inner(TypedDict):
    messages: Annotated[list[str], cairn.append]
    topic: str


def inner_graph(ran: list[str]) -> cairn.Graph:
    g = cairn.Graph(Inner)

    def search(state: Inner) -> dict[str, Any]:
        ran.append("search")
        return {"messages": [f"found {state['topic']}"]}

    def summarise(state: Inner) -> dict[str, Any]:
        ran.append("summarise")
        return {"messages": [f"summary of {len(state['messages'])}"], "topic": state["topic"].upper()}

    g.node(search)
    g.node(summarise)
    g.edge(cairn.START, "search")
    g.edge("search", "summarise")
    g.edge("summarise", cairn.END)
    return g


def outer_graph(app: cairn.App, ran: list[str]) -> cairn.Graph:
    research = app.graph("research", inner_graph(ran))
    g = cairn.Graph(Outer)
    g.node(lambda state: {"messages": ["asked"]}, name="ask")
    g.node(research, name="research")
    g.node(lambda state: {"done": True}, name="finish")
    g.edge(cairn.START, "ask")
    g.edge("ask", "research")
    g.edge("research", "finish")
    g.edge("finish", cairn.END)
    return g


def test_a_subgraph_runs_as_a_child_with_its_own_checkpoints(app: cairn.App) -> None:
    ran: list[str] = []
    outer = app.graph("outer", outer_graph(app, ran))
    final = app.run(outer, {"messages": ["hi"], "topic": "moss", "done": False}, run_id="o")
    assert final == {"messages": ["hi", "asked", "found moss", "summary of 3"], "topic": "MOSS", "done": True}
    assert ran == ["search", "summarise"]
    [child] = [r for r in app.list_runs() if r.parent_run_id == "o"]
    assert child.run_id.startswith("o:")  # namespaced under the parent's
    assert [c.nodes for c in app.checkpoints(child.run_id)] == [("summarise",), ("search",), ()]
    assert app.graph_state(child.run_id, 1) == {"messages": ["hi", "asked", "found moss"], "topic": "moss"}
    assert [c.nodes for c in app.checkpoints("o")] == [("finish",), ("research",), ("ask",), ()]


def test_a_failing_subgraph_fails_its_node(app: cairn.App) -> None:
    g = cairn.Graph(Inner)

    def boom(state: Inner) -> dict[str, Any]:
        raise ValueError("no results")

    g.node(boom)
    g.edge(cairn.START, "boom")
    g.edge("boom", cairn.END)
    inner = app.graph("inner", g)
    outer = cairn.Graph(Outer)
    outer.node(inner, name="inner")
    outer.edge(cairn.START, "inner")
    outer.edge("inner", cairn.END)
    with pytest.raises(RunFailed, match=r"node 'inner' failed .*ChildFailed"):
        app.run(app.graph("outer", outer), {"messages": [], "topic": "x", "done": False}, run_id="o")


def test_only_a_graph_workflow_can_be_a_node(app: cairn.App) -> None:
    @app.workflow
    def plain(ctx: cairn.Context) -> None:
        return None

    with pytest.raises(cairn.InvalidGraph, match="workflow 'plain' is not a graph"):
        cairn.Graph(Outer).node(plain)
