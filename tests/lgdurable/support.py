"""The support graph of the command line and HTTP tests (the README's
example): ``triage``, then ``settle``, which asks how much to refund
(``interrupt()``) and refunds through a Cairn ``write`` tool."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

import cairn


class Ticket(TypedDict):
    order: str
    log: Annotated[list[str], operator.add]


def register(app: cairn.App) -> cairn.Workflow[Any]:
    @app.tool(effect="write")
    def refund(order: str, amount: int) -> str:
        return f"refunded {amount} on {order}"

    def triage(state: Ticket) -> dict[str, Any]:
        return {"log": [f"triaged {state['order']}"]}

    def settle(state: Ticket) -> dict[str, Any]:
        amount = interrupt({"order": state["order"], "question": "refund how much?"})
        return {"log": [refund(state["order"], amount)]}

    builder = StateGraph(Ticket)
    builder.add_node("triage", triage)
    builder.add_node("settle", settle)
    builder.add_edge(START, "triage")
    builder.add_edge("triage", "settle")
    builder.add_edge("settle", END)
    return app.langgraph(builder.compile(), name="support")
