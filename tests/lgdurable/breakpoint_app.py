"""The LangGraph graph of the static-interrupt crash test (``test_breakpoint_crash.py``),
in the test process and in worker processes (``python -m tests.lgdurable.breakpoint_app --worker-id X``).

``draft`` then ``pay``, compiled with ``interrupt_before=["pay"]``: the run
stops for an approval before ``pay``, whose edit sets the amount (a field
with an ``add`` reducer, so an edit applied twice would show). ``pay`` pays
through a Cairn ``write`` tool into ``bank.jsonl``; every node notes its
executions in ``executions.jsonl`` first."""

from __future__ import annotations

import argparse
import operator
import os
import sys
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

import cairn
from tests.lgdurable.agent_app import lines, note

START_STATE = {"log": [], "amount": 0}


class Bill(TypedDict):
    log: Annotated[list[str], operator.add]
    amount: Annotated[int, operator.add]


def build(db: str, directory: Path) -> tuple[cairn.App, cairn.Workflow[Any]]:
    app = cairn.App(db=db, lease_seconds=0.5, max_recoveries=100)
    executions, bank = directory / "executions.jsonl", directory / "bank.jsonl"

    def found(op: cairn.Operation) -> cairn.Done[str] | cairn.NotFound:
        done = [e for e in lines(bank) if e["op"] == op.operation_id]
        return cairn.Done(f"paid {done[0]['amount']}") if done else cairn.NotFound()

    @app.tool(effect="write", reconcile=found)
    def transfer(op: cairn.Operation, amount: int) -> str:
        note(bank, {"op": op.operation_id, "amount": amount, "pid": os.getpid()})
        return f"paid {amount}"

    def draft(state: Bill) -> dict[str, Any]:
        note(executions, {"node": "draft", "pid": os.getpid()})
        return {"log": ["drafted"]}

    def pay(state: Bill) -> dict[str, Any]:
        note(executions, {"node": "pay", "pid": os.getpid()})
        return {"log": [transfer(state["amount"])]}

    builder = StateGraph(Bill)
    builder.add_node("draft", draft)
    builder.add_node("pay", pay)
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "pay")
    builder.add_edge("pay", END)
    return app, app.langgraph(builder.compile(interrupt_before=["pay"]), name="bill")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker-id", required=True)
    args = parser.parse_args()
    app, _ = build(os.environ["CAIRN_TEST_DB"], Path(os.environ["CAIRN_TEST_DIR"]))
    app.worker(concurrency=1, worker_id=args.worker_id, poll_interval=0.02).run()
    app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
