"""The role a graph run's replay or fork acts with, on both backends: the
role of whoever replays or forks it, never its origin's. A run started as
admin, forked by code that names no role (or names a lower one), gives the
fork no admin rights: a tool reserved to admin refuses it and the refusal
is recorded; the fork's row, its ``run.created`` entry and ``started_by``
say who forked it."""

from __future__ import annotations

from typing import Any, TypedDict

import pytest

import cairn
from cairn.store.records import EventType


class Box(TypedDict):
    n: int
    done: list[str]


def register(app: cairn.App, ran: list[str]) -> cairn.Workflow[Any]:
    @app.tool(effect="write", access=cairn.ToolAccess(role="admin"))
    def purge(n: int) -> str:
        ran.append(f"purge {n}")
        return f"purged {n}"

    g = cairn.Graph(Box)

    def bump(state: Box) -> dict[str, Any]:
        return {"n": state["n"] + 1}

    def act(state: Box) -> dict[str, Any]:
        return {"done": [purge(state["n"])]}

    g.node(bump)
    g.node(act)
    g.edge(cairn.START, "bump")
    g.edge("bump", "act")
    g.edge("act", cairn.END)
    return app.graph("purger", g)


def created_detail(app: cairn.App, run_id: str) -> dict[str, Any]:
    first = app.history(run_id)[0]
    assert first.event is EventType.RUN_CREATED
    return first.detail or {}


def test_a_fork_of_an_admins_run_has_the_forkers_rights_not_the_origins(app: cairn.App) -> None:
    ran: list[str] = []
    graph = register(app, ran)
    assert app.run(graph, {"n": 0, "done": []}, run_id="origin", started_role="admin",
                   started_token="tok-admin")["done"] == ["purged 1"]
    assert ran == ["purge 1"]

    # forked by code naming no role: no rights at all (not the origin's admin)
    app.graph_fork("origin", 1, update={"n": 10}, run_id="fork-nobody")
    # replayed as operator, by an operator's token: operator, below the tool's admin
    app.graph_replay("origin", 1, run_id="replay-operator", started_role="operator",
                     started_token="tok-op", started_by={"actor": "token:tok-op", "role": "operator"})
    assert app.store.started_with("fork-nobody") == (None, None)
    assert app.store.started_with("replay-operator") == ("operator", "tok-op")
    for run_id, said in (("fork-nobody", "without a token role"),
                         ("replay-operator", r"as operator \(token tok-op\)")):
        with pytest.raises(cairn.RunFailed, match=rf"tool 'purge' refused: a run started {said}"):
            app.resume(run_id)
        [refused] = [e for e in app.history(run_id) if e.event is EventType.STEP_FAILED]
        assert refused.name == "purge"
        assert not [e for e in app.history(run_id) if e.event is EventType.OP_INTENT]  # never sent
    assert ran == ["purge 1"]

    detail = created_detail(app, "replay-operator")
    assert detail["started_role"] == "operator"
    assert detail["started_token"] == "tok-op"
    assert detail["started_by"]["actor"] == "token:tok-op"
    assert detail["forked_from"] == {"run_id": "origin", "step": 1, "edited": False}
    assert "started_role" not in created_detail(app, "fork-nobody")

    # an admin forking runs with admin rights: the fork is a start like any other
    app.graph_fork("origin", 1, update={"n": 20}, run_id="fork-admin", started_role="admin")
    assert app.resume("fork-admin")["done"] == ["purged 20"]
    assert ran == ["purge 1", "purge 20"]


def test_an_idempotent_fork_keeps_the_role_it_was_made_with(app: cairn.App) -> None:
    """The same run id asked again by someone else returns the run as it
    was made: a second request cannot re-role an existing fork."""
    graph = register(app, [])
    app.run(graph, {"n": 0, "done": []}, run_id="origin", started_role="admin")
    first = app.graph_fork("origin", 1, update={"n": 3}, run_id="f", started_role="viewer")
    again = app.graph_fork("origin", 1, update={"n": 3}, run_id="f", started_role="admin")
    assert (first.created, again.created) == (True, False)
    assert app.store.started_with("f") == ("viewer", None)


def test_a_bad_role_is_refused_before_anything_is_stored(app: cairn.App) -> None:
    graph = register(app, [])
    app.run(graph, {"n": 0, "done": []}, run_id="origin", started_role="admin")
    with pytest.raises(cairn.InvalidArgument, match="root"):
        app.graph_fork("origin", 1, update={"n": 3}, run_id="f", started_role="root")
    assert [r.run_id for r in app.list_runs()] == ["origin"]
