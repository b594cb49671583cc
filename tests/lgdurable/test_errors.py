"""Bad input to ``app.langgraph``: one clear line (``InvalidArgument``), and nothing registered."""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph

import cairn
from cairn.errors import InvalidArgument
from cairn.lgdurable import run_context


class Count(TypedDict):
    log: Annotated[list[str], operator.add]


def builder() -> StateGraph[Count, Any, Count, Count]:
    graph = StateGraph(Count)
    graph.add_node("one", lambda state: {"log": ["one"]})
    graph.add_edge(START, "one")
    return graph


def with_subgraph(inner: Any) -> Any:
    """A graph whose node ``inner`` calls ``inner`` (a subgraph found inside a function)."""
    graph = StateGraph(Count)
    graph.add_node("inner", lambda state: inner.invoke(state))
    graph.add_edge(START, "inner")
    return graph.compile()


@pytest.fixture
def app(tmp_path: Path) -> Any:
    application = cairn.App(db=f"sqlite:///{tmp_path}/cairn.db")
    yield application
    application.close()


@pytest.mark.parametrize(("graph", "message"), [
    (lambda: builder(), r"^app.langgraph\('g'\) takes a compiled graph: call .compile\(\) on the StateGraph"),
    (lambda: 42, r"^app.langgraph\('g'\) takes a compiled LangGraph graph \(StateGraph\(...\).compile\(\)\), "
                 r"not int$"),
    (lambda: builder().compile(checkpointer=InMemorySaver()),
     r"^graph 'g' was compiled with checkpointer=InMemorySaver: compile it without one"),
    (lambda: builder().compile(checkpointer=False), r"^graph 'g' was compiled with checkpointer=False"),
    (lambda: with_subgraph(builder().compile(interrupt_after=["one"])),
     r"^graph 'g': node 'inner' runs a subgraph compiled with interrupt_before/interrupt_after \(one\): "
     r"compile the parent with interrupt_before=\['inner'\] or call langgraph.types.interrupt\(\) in the "
     r"subgraph's node$"),
])
def test_a_graph_that_cannot_run_is_refused_in_one_line(app: cairn.App, graph: Any, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message) as refused:
        app.langgraph(graph(), name="g")
    assert "\n" not in str(refused.value)
    assert "g" not in app.runtime.workflows


@pytest.mark.parametrize("name", ["", None, 3])
def test_a_missing_name_is_refused(app: cairn.App, name: Any) -> None:
    with pytest.raises(InvalidArgument, match=r"^app.langgraph needs name= \(a non-empty string\)"):
        app.langgraph(builder().compile(), name=name)


def test_a_name_clash_is_refused(app: cairn.App) -> None:
    @app.workflow(name="taken")
    def taken(ctx: cairn.Context) -> int:
        return 1

    clash = r"^workflow 'taken' is already registered \(not a LangGraph graph\): give the graph another name="
    for version in ("1", "2"):
        with pytest.raises(InvalidArgument, match=clash):
            app.langgraph(builder().compile(), name="taken", version=version)
    assert app.runtime.workflows["taken"].fn is taken.definition.fn
    app.langgraph(builder().compile(), name="counting")
    with pytest.raises(InvalidArgument, match=r"^LangGraph workflow 'counting' version '1' is already "
                                              r"registered: give the new graph a new version="):
        app.langgraph(builder().compile(), name="counting")
    assert app.langgraph(builder().compile(), name="counting", version="2").definition.version == "2"


def test_a_registered_graph_runs_inline(app: cairn.App) -> None:
    workflow = app.langgraph(builder().compile(), name="counting")
    assert app.run(workflow, {"log": []}) == {"log": ["one"]}


def test_a_node_reaches_its_run_through_run_context(app: cairn.App) -> None:
    """``cairn.lgdurable.run_context()`` in a node is the run's ``Context``
    (its calls journaled per task like tools); outside a run it says where it belongs."""
    graph = StateGraph(Count)
    graph.add_node("who", lambda state: {"log": [run_context().run_id, str(run_context().uuid())]})
    graph.add_edge(START, "who")
    workflow = app.langgraph(graph.compile(), name="who")
    log = app.run(workflow, {"log": []}, run_id="w-1")["log"]
    assert log[0] == "w-1"
    assert [e.step_kind for e in app.history("w-1") if e.step_kind == "uuid"] == ["uuid"]
    with pytest.raises(InvalidArgument, match=r"is called inside a node of a graph run by app\.langgraph"):
        run_context()
