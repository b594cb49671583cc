"""A checkpoint the code can no longer read parks the run as
``incompatible`` (docs/design.md, "State types that evolve"): never
failed, never wedged; ``retry`` can take it up once a deploy reads it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import pytest

import cairn
from cairn.errors import RunSuspended
from cairn.store.records import EventType, RunStatus
from tests.engine.conftest import postgres_url

from .conftest import BACKENDS


def first(state: Any) -> dict[str, Any]:
    return {"n": state["n"] + 1}


def second(state: Any) -> dict[str, Any]:
    return {"n": state["n"] + 1}


def graph_with(profile: type) -> cairn.Graph:
    state = TypedDict("State", {"n": int, "profile": profile})  # type: ignore[misc]  # noqa: UP013 (a type made at run time)
    g = cairn.Graph(state)
    g.node(first)
    g.node(second, interrupt_before=True)
    g.edge(cairn.START, "first")
    g.edge("first", "second")
    g.edge("second", cairn.END)
    return g


def profile_type(age: Any) -> type:
    cls = dataclasses.make_dataclass("Profile", [("age", age)])
    cls.__module__ = __name__
    return cls


@pytest.mark.parametrize("app", ["sqlite"], indirect=True)  # a second App opens the same file
def test_a_checkpoint_the_state_type_cannot_read_parks_the_run(app: cairn.App, tmp_path: Path) -> None:
    old = profile_type(int)
    workflow = app.graph("evolving", graph_with(old))
    with pytest.raises(RunSuspended):
        app.run(workflow, {"n": 0, "profile": old(age=3)}, run_id="e")
    [request] = app.approvals(run_id="e")
    app.approve("e", request.request_id)

    later = cairn.App(db=f"sqlite:///{tmp_path}/cairn.db")  # a deploy whose Profile.age became a list
    try:
        later.graph("evolving", graph_with(profile_type(list[int])))
        assert later.get_run("e").bundle == app.get_run("e").bundle  # the same code, another state type
        with pytest.raises(cairn.CairnError):
            later.resume("e")
        run = later.get_run("e")
        assert run.status is RunStatus.INCOMPATIBLE, run.error
    finally:
        later.close()


@pytest.fixture(params=BACKENDS)
def deploys(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[cairn.App, cairn.App]]:
    """Two deployments on one database: the old code's app and the new code's."""
    if request.param == "postgres":
        url = postgres_url(request.getfixturevalue("pg_url"))
    else:
        url = f"sqlite:///{tmp_path}/cairn.db"
    old, new = cairn.App(db=url, lease_seconds=1.0), cairn.App(db=url, lease_seconds=1.0)
    yield old, new
    old.close()
    new.close()


class Count(TypedDict):
    n: int


def without_second() -> cairn.Graph:
    g = cairn.Graph(Count)
    g.node(first)
    g.edge(cairn.START, "first")
    g.edge("first", cairn.END)
    return g


def test_a_node_removed_by_a_deploy_parks_the_resumed_run(deploys: tuple[cairn.App, cairn.App]) -> None:
    """The run's latest checkpoint runs ``second`` next; the new deployment's
    graph has no ``second``: the run is parked ``incompatible`` naming the
    checkpoint and the node (it was failed for good, with a GraphError)."""
    app, new_app = deploys
    old = cairn.Graph(Count)
    old.node(first)
    old.node(second, interrupt_before=True)
    old.edge(cairn.START, "first")
    old.edge("first", "second")
    old.edge("second", cairn.END)
    with pytest.raises(RunSuspended):
        app.run(app.graph("counting", old), {"n": 0}, run_id="r")
    assert [(c.step, c.next) for c in app.checkpoints("r")] == [(1, ("second",)), (0, ("first",))]
    [request] = app.approvals(run_id="r")
    app.approve("r", request.request_id)

    new_app.graph("counting", without_second())
    report, _ = new_app.migrate("r", force=True, reason="the graph lost a node")
    assert not report.compatible
    new_app.worker(poll_interval=0.02).run(install_signals=False, max_idle=0.3)
    run = new_app.get_run("r")
    assert run.status is RunStatus.INCOMPATIBLE, (run.status, run.error)
    [parked] = [e for e in new_app.history("r") if e.event is EventType.RUN_INCOMPATIBLE]
    why = str((parked.detail or {}).get("why"))
    assert "checkpoint 1 of run 'r' runs node 'second' next, which this graph has no more" in why, why
    assert [c.step for c in new_app.checkpoints("r")] == [1, 0]  # nothing written after it
