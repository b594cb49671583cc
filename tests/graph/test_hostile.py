"""Hostile input to a graph run (both backends), beyond ``test_state.py``:
each is a clear one-line error naming what is wrong, bounded in size
whatever the user's text, and nothing of the failed super-step is written
(the latest checkpoint is the one before it, and its state is unchanged).

- a reducer that raises while merging a parallel super-step, after a
  sibling node's journaled step ran;
- a router naming a node that does not exist: by a ``Send``, in a list
  with a real node, from START (before any checkpoint), or a router
  returning something that names no node;
- a 10 MB value: as the name a router returns, as a node's exception
  message, and as an update that does not fit its field (markup in a
  failed graph run's error, shown by the dashboard: tests/server/test_graph_page.py)."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

import pytest

import cairn
from cairn.errors import RunFailed

TEN_MB = 10 * 1024 * 1024
#: no recorded error quotes more of the user's text than this (the message around it aside)
BOUND = 2000


def refuse_twice(old: Any, new: Any) -> Any:
    if old:
        raise ValueError(f"cannot add {new!r} to {old!r}")
    return new


class Pair(TypedDict):
    n: int
    total: Annotated[int, refuse_twice]
    tags: Annotated[list[str], cairn.append]


START_STATE: Pair = {"n": 1, "total": 0, "tags": []}


def fail(app: cairn.App, g: cairn.Graph, run_id: str) -> str:
    with pytest.raises(RunFailed) as raised:
        app.run(app.graph(run_id, g), START_STATE, run_id=run_id)
    message = str(raised.value)
    assert "\n" not in message, message[:500]
    assert len(message) < BOUND, f"an error of {len(message)} characters"
    return message


def test_a_reducer_raising_in_a_parallel_merge_writes_nothing_of_the_super_step(app: cairn.App) -> None:
    ran: list[str] = []

    @app.step
    def side(name: str) -> str:
        ran.append(name)
        return name

    g = cairn.Graph(Pair)
    g.node(lambda s: {"total": 1, "tags": [side("a")]}, name="a")
    g.node(lambda s: {"total": 2, "tags": [side("b")]}, name="b")
    g.edge(cairn.START, "a")
    g.edge(cairn.START, "b")
    g.edge("a", cairn.END)
    g.edge("b", cairn.END)
    message = fail(app, g, "merge")
    assert "node 'b': the reducer of field 'total' raised ValueError: cannot add 2 to 1" in message
    assert sorted(ran) == ["a", "b"]  # both nodes ran; their merge failed
    assert [c.step for c in app.checkpoints("merge")] == [0]
    assert app.graph_state("merge") == START_STATE


@pytest.mark.parametrize(("route", "says"), [
    (lambda s: cairn.Send("nowhere", 1), "the router of 'a' named 'nowhere', which is not a node"),
    (lambda s: ["a", "nowhere"], "the router of 'a' named 'nowhere', which is not a node"),
    (lambda s: None, "the router of 'a' returned None: a router returns a node name"),
    (lambda s: [cairn.END, 7], "the router of 'a' returned 7: a router returns a node name"),
], ids=["send", "list", "none", "number"])
def test_a_router_naming_no_node_fails_the_run_writing_nothing(app: cairn.App, route: Any, says: str) -> None:
    g = cairn.Graph(Pair)
    g.node(lambda s: {"n": s["n"] + 1}, name="a")
    g.edge(cairn.START, "a")
    g.route("a", route)
    assert says in fail(app, g, "route")
    assert [c.step for c in app.checkpoints("route")] == [0]
    assert app.graph_state("route") == START_STATE


def test_a_router_from_start_naming_no_node_fails_before_any_checkpoint(app: cairn.App) -> None:
    g = cairn.Graph(Pair)
    g.node(lambda s: None, name="a")
    g.route(cairn.START, lambda s: "nowhere")
    g.edge("a", cairn.END)
    assert "the router of '__start__' named 'nowhere', which is not a node" in fail(app, g, "start")
    assert app.checkpoints("start") == []


def test_a_10_mb_node_name_from_a_router_is_a_bounded_error(app: cairn.App) -> None:
    g = cairn.Graph(Pair)
    g.node(lambda s: None, name="a")
    g.edge(cairn.START, "a")
    g.route("a", lambda s: "<b>" + "x" * TEN_MB)
    message = fail(app, g, "huge-name")
    assert "the router of 'a' named '<b>xxx" in message
    assert "more characters" in message
    assert [c.step for c in app.checkpoints("huge-name")] == [0]
    assert len(str(app.get_run("huge-name").error)) < BOUND


def test_a_10_mb_exception_message_is_a_bounded_error(app: cairn.App) -> None:
    def explode(state: Pair) -> None:
        raise RuntimeError("<script>alert(1)</script>" + "y" * TEN_MB)

    message = fail(app, one(explode), "huge-error")
    assert "node 'bad' failed (attempt 1 of 1): RuntimeError: <script>alert(1)</script>yyy" in message
    assert [c.step for c in app.checkpoints("huge-error")] == [0]
    assert len(str(app.get_run("huge-error").error)) < BOUND


def test_a_10_mb_update_that_does_not_fit_is_a_bounded_error(app: cairn.App) -> None:
    message = fail(app, one(lambda s: {"n": "z" * TEN_MB}), "huge-update")
    assert "node 'bad' returned an invalid update: field 'n'" in message
    assert [c.step for c in app.checkpoints("huge-update")] == [0]


def test_a_10_mb_reducer_error_is_a_bounded_error(app: cairn.App) -> None:
    g = one(lambda s: {"total": "w" * TEN_MB}, total=1)
    message = fail(app, g, "huge-reducer")
    assert "node 'bad': the reducer of field 'total' raised ValueError: cannot add 'www" in message
    assert [c.step for c in app.checkpoints("huge-reducer")] == [1, 0]


def one(fn: Any, total: int = 0) -> cairn.Graph:
    g = cairn.Graph(Pair)
    if total:
        g.node(lambda s: {"total": total}, name="first")
        g.edge(cairn.START, "first")
        g.edge("first", "bad")
    else:
        g.edge(cairn.START, "bad")
    g.node(fn, name="bad")
    g.edge("bad", cairn.END)
    return g
