"""A graph with ``async def`` nodes runs through LangGraph's async API (both
backends): an async node awaits an async Cairn ``write`` tool and asks with
``interrupt()``; the run suspends, and resumes with the answer, the tool
before the interrupt paid once."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

import cairn
from cairn.errors import RunSuspended


class Order(TypedDict):
    log: Annotated[list[str], operator.add]


def test_async_nodes_await_tools_and_interrupt(app: cairn.App) -> None:
    paid: list[str] = []

    @app.tool(effect="write")
    async def pay(what: str) -> str:
        paid.append(what)
        return f"paid {what}"

    async def confirm(state: Order) -> dict[str, Any]:
        deposit = await pay("deposit")
        answer = interrupt("how much?")
        return {"log": [deposit, await pay(f"balance {answer}")]}

    def note(state: Order) -> dict[str, Any]:  # a sync node beside it, in LangGraph's executor
        return {"log": ["noted"]}

    builder = StateGraph(Order)
    builder.add_node("confirm", confirm)
    builder.add_node("note", note)
    builder.add_edge(START, "confirm")
    builder.add_edge("confirm", "note")
    builder.add_edge("note", END)
    workflow = app.langgraph(builder.compile(), name="async-order")
    with pytest.raises(RunSuspended, match="waiting for a decision"):
        app.run(workflow, {"log": []}, run_id="a")
    [request] = app.approvals(run_id="a")
    app.approve("a", request.request_id, edit=7)
    assert app.resume("a") == {"log": ["paid deposit", "paid balance 7", "noted"]}
    assert paid == ["deposit", "balance 7"]
