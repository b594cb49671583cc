"""Step 1 of graph workflows: the state schema, reducers and validation.

A bad update fails the node with a message naming the node and the field,
and nothing of its super-step is written; what can be known before a run
(a missing node, a loop with no way out, a reducer on the wrong type) is
refused by ``app.graph``, which then registers nothing."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, TypedDict

import pydantic
import pytest

import cairn
from cairn.errors import PayloadError, RunFailed, UnknownWorkflow
from cairn.graph.errors import GraphError


class Chat(TypedDict):
    messages: Annotated[list[str], cairn.append]
    seen: Annotated[dict[str, int], cairn.merge]
    total: Annotated[int, lambda old, new: (old or 0) + new]
    last: str


def chat_graph() -> cairn.Graph:
    g = cairn.Graph(Chat)

    @g.node
    def talk(state: Chat) -> dict[str, Any]:
        n = len(state["messages"])
        return {"messages": [f"m{n}"], "seen": {f"k{n}": n}, "total": n, "last": f"m{n}"}

    g.edge(cairn.START, "talk")
    g.route("talk", lambda s: cairn.END if len(s["messages"]) >= 4 else "talk")
    return g


def test_reducers_append_merge_custom_and_replace(app: cairn.App) -> None:
    chat = app.graph("chat", chat_graph())
    final = app.run(chat, {"messages": ["hi"], "seen": {}, "total": 0, "last": ""})
    assert final == {"messages": ["hi", "m1", "m2", "m3"], "seen": {"k1": 1, "k2": 2, "k3": 3},
                     "total": 6, "last": "m3"}


@dataclasses.dataclass
class Counter:
    items: Annotated[list[int], cairn.append]
    n: int = 0


class Model(pydantic.BaseModel):
    items: Annotated[list[int], cairn.append]
    n: int = 0


@pytest.mark.parametrize("state_type", [Counter, Model], ids=["dataclass", "pydantic"])
def test_dataclass_and_pydantic_states(app: cairn.App, state_type: Any) -> None:
    g = cairn.Graph(state_type)

    @g.node
    def bump(state: Any) -> dict[str, Any]:
        assert isinstance(state, state_type)
        return {"items": [state.n], "n": state.n + 1}

    g.edge(cairn.START, "bump")
    g.route("bump", lambda s: cairn.END if s.n >= 3 else "bump")
    final = app.run(app.graph("count", g), state_type(items=[], n=0))
    assert isinstance(final, state_type)
    assert (final.items, final.n) == ([0, 1, 2], 3)
    assert app.graph_state(app.list_runs()[0].run_id, 1) == state_type(items=[0], n=1)


class Small(TypedDict):
    n: int
    tags: Annotated[list[str], cairn.append]


def one_node(fn: Any, state: Any = Small) -> cairn.Graph:
    g = cairn.Graph(state)
    g.node(fn, name="bad")
    g.edge(cairn.START, "bad")
    g.edge("bad", cairn.END)
    return g


def failed(app: cairn.App, g: cairn.Graph, name: str) -> tuple[str, list[cairn.Checkpoint]]:
    workflow = app.graph(name, g)
    with pytest.raises(RunFailed) as raised:
        app.run(workflow, {"n": 1, "tags": []}, run_id=name)
    return str(raised.value), app.checkpoints(name)


@pytest.mark.parametrize(("update", "field", "says"), [
    ({"n": "seven"}, "n", "Expected `int`, got `str`"),
    ({"tags": [1]}, "tags", "Expected `str`, got `int`"),
    ({"nope": 1}, "nope", "is not a field of Small"),
    ({"n": float("nan")}, "n", "not a finite number"),
    ({"tags": [object()]}, "tags", "cannot encode value"),
])
def test_an_update_that_does_not_fit_fails_the_node_naming_node_and_field(
        app: cairn.App, update: dict[str, Any], field: str, says: str) -> None:
    message, checkpoints = failed(app, one_node(lambda state: update), "bad-update")
    assert "node 'bad'" in message, message
    assert repr(field) in message, message
    assert says in message, message
    assert [c.step for c in checkpoints] == [0]  # nothing of the failed super-step was written
    assert app.graph_state("bad-update") == {"n": 1, "tags": []}


def broken(old: Any, new: Any) -> Any:
    raise ValueError("cannot combine")


class Broken(TypedDict):
    n: Annotated[int, broken]
    tags: list[str]


def test_a_reducer_that_raises_fails_the_node_naming_the_field(app: cairn.App) -> None:
    message, checkpoints = failed(app, one_node(lambda state: {"n": 2}, Broken), "bad-reducer")
    assert "node 'bad': the reducer of field 'n' raised ValueError: cannot combine" in message
    assert [c.step for c in checkpoints] == [0]


def test_a_router_naming_a_missing_node_fails_the_run(app: cairn.App) -> None:
    g = cairn.Graph(Small)
    g.node(lambda state: {"n": state["n"] + 1}, name="a")
    g.edge(cairn.START, "a")
    g.route("a", lambda state: "nowhere")
    message, checkpoints = failed(app, g, "bad-router")
    assert "the router of 'a' named 'nowhere', which is not a node" in message
    assert [c.step for c in checkpoints] == [0]


def test_bad_input_is_refused_before_anything_is_stored(app: cairn.App) -> None:
    workflow = app.graph("typed", one_node(lambda state: None))
    with pytest.raises(PayloadError, match="input 'state'"):
        app.start(workflow, {"n": "x", "tags": []}, run_id="bad-input")
    assert app.list_runs() == []


def refused(app: cairn.App, g: cairn.Graph, says: str) -> None:
    with pytest.raises(cairn.InvalidGraph, match=says):
        app.graph("refused", g)
    with pytest.raises(UnknownWorkflow):
        app.definition("refused")


def test_graphs_that_cannot_run_are_refused_at_compile_time(app: cairn.App) -> None:
    g = cairn.Graph(Small)
    g.node(lambda s: None, name="a")
    g.node(lambda s: None, name="b")
    g.edge(cairn.START, "a")
    g.edge("a", "b")
    g.edge("b", "a")
    refused(app, g, "no path to END from node\\(s\\) a, b")

    g = cairn.Graph(Small)
    g.node(lambda s: None, name="a")
    g.edge(cairn.START, "a")
    g.edge("a", "ghost")
    refused(app, g, "'ghost', which is not a node")

    g = cairn.Graph(Small)
    g.node(lambda s: None, name="a")
    g.edge(cairn.START, "a")
    refused(app, g, "node 'a' has no way on")

    g = cairn.Graph(Small)
    g.node(lambda s: None, name="a")
    g.edge("a", cairn.END)
    refused(app, g, "nothing leaves START")


class Wrong(TypedDict):
    n: Annotated[int, cairn.append]


class WrongMerge(TypedDict):
    n: Annotated[list[int], cairn.merge]


def test_a_reducer_on_the_wrong_type_is_refused() -> None:
    with pytest.raises(cairn.InvalidGraph, match=r"cairn\.append needs a list field"):
        cairn.Graph(Wrong)
    with pytest.raises(cairn.InvalidGraph, match=r"cairn\.merge needs a dict field"):
        cairn.Graph(WrongMerge)
    with pytest.raises(cairn.InvalidGraph, match="TypedDict, a dataclass or a pydantic model"):
        cairn.Graph(int)


def test_a_node_returning_something_else_than_a_dict_fails_naming_it(app: cairn.App) -> None:
    message, checkpoints = failed(app, one_node(lambda state: ["n", 2]), "not-a-dict")
    assert "node 'bad' returned a list: a node returns a dict of the fields of Small it updates" in message
    assert [c.step for c in checkpoints] == [0]


@pytest.mark.parametrize("returned", ["n", 3, ("n", 2), [("n", 2)], Small])
def test_update_of_on_a_typeddict_state_names_the_node_for_any_non_dict(returned: Any) -> None:
    """A TypedDict refuses ``isinstance`` checks (a bare ``TypeError``): what
    a node returned is only ever checked against ``Mapping``."""
    schema = cairn.Graph(Small).schema
    with pytest.raises(GraphError, match=r"^node 'talk' returned a \w+: a node returns a dict of the fields"):
        schema.update_of("talk", returned)
