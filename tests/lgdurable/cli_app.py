"""A LangGraph graph registered on a module-level App (``$CAIRN_DB``), for
the command line tests: ``cairn start support --app tests.lgdurable.cli_app:app``."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

import cairn

app = cairn.App()


@app.tool(effect="write")
def refund(order: str, amount: int) -> str:
    return f"refunded {amount} on {order}"


class Ticket(TypedDict):
    order: str
    log: Annotated[list[str], operator.add]


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
support = app.langgraph(builder.compile(), name="support")
