"""A checkpoint the code can no longer read parks the run as
``incompatible`` (docs/design.md, "State types that evolve"): never
failed, never wedged; ``retry`` can take it up once a deploy reads it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, TypedDict

import pytest

import cairn
from cairn.errors import RunSuspended
from cairn.store.records import RunStatus


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
