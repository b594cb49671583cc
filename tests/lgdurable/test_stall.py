"""A LangGraph invocation that stores no new checkpoint fails the run with a
line naming the checkpoint, instead of invoking it again forever (both
backends). ``_drive`` resumes a checkpoint that still has tasks; if resuming
it leaves the same checkpoint the newest (a LangGraph that returned without
running them), a second identical attempt could only loop."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

import cairn
from cairn.errors import RunFailed
from cairn.lgdurable import LangGraphRun
from cairn.store.records import RunStatus

#: invocations the stand-in allows before it calls the loop what it is
MOST = 25


class Log(TypedDict):
    log: Annotated[list[str], operator.add]


def two_nodes() -> Any:
    builder = StateGraph(Log)
    builder.add_node("first", lambda state: {"log": ["first"]})
    builder.add_node("second", lambda state: {"log": ["second"]})
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    builder.add_edge("second", END)
    return builder.compile()


def test_a_resume_that_stores_no_checkpoint_fails_the_run_naming_it(
        app: cairn.App, monkeypatch: pytest.MonkeyPatch) -> None:
    invoked: list[Any] = []

    def stops_before_second(self: LangGraphRun, command: Any) -> None:
        """The first invocation runs up to ``second`` (its tasks left pending);
        every later one returns at once, storing nothing."""
        invoked.append(command)
        if len(invoked) == 1:
            self.graph.invoke(command, self.config, durability="sync", interrupt_before=["second"])
        elif len(invoked) > MOST:
            raise AssertionError(f"invoked {len(invoked)} times: the driver loops")

    monkeypatch.setattr(LangGraphRun, "_invoke", stops_before_second)
    workflow = app.langgraph(two_nodes(), name="stall")
    with pytest.raises(RunFailed, match=r"resuming checkpoint \S+ stored no new checkpoint"):
        app.run(workflow, {"log": []}, run_id="stalled")
    run = app.get_run("stalled")
    assert run.status is RunStatus.FAILED
    assert len(invoked) == 2  # the input, then one resume of the checkpoint: a second is refused
