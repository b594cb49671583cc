"""Graphs the LangGraph checkpointer tests drive (imported where LangGraph is wanted)."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Annotated, Any, TypedDict


class Log(TypedDict):
    log: Annotated[list[str], operator.add]


def appending_loop(steps: int, item: Callable[[int], str], pause: Callable[[int], None] | None = None) -> Any:
    """One node looping until the log has ``steps`` items, the ``n``-th
    ``item(n)`` (``pause(n)`` first, when given)."""
    from langgraph.graph import END, START, StateGraph

    def step(state: Log) -> dict[str, list[str]]:
        if pause is not None:
            pause(len(state["log"]))
        return {"log": [item(len(state["log"]))]}

    def route(state: Log) -> str:
        return END if len(state["log"]) >= steps else "step"

    g = StateGraph(Log)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", route)
    return g


def counting_loop(steps: int, tag: str, pause: Callable[[int], None] | None = None) -> Any:
    """``appending_loop`` whose items are ``<tag><n>``."""
    return appending_loop(steps, lambda n: f"{tag}{n}", pause)


def ledger_loop(steps: int, ledger: str) -> Any:
    """``counting_loop`` whose node, before returning, appends ``<n>`` to the
    file ``ledger`` and fsyncs it: the effect a crash test counts."""
    import os

    def record(n: int) -> None:
        fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{n}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    return counting_loop(steps, "s", record)
