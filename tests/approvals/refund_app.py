"""A refund agent whose refunds over 1,000 cents need approval, and a tiny
'outside world' (a JSON-lines ledger that deduplicates by idempotency key,
like a payment API), for the crash tests.

Run as a child process on ``$CAIRN_TEST_DB``: ``run RUN_ID CUSTOMER CENTS``
(``run-timed``: the refund whose approval times out) or ``resume RUN_ID``
(inline, usually armed with ``$CAIRN_FAULTS`` to die at a fault point), or
``worker ID`` (a worker with one slot, until killed).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import cairn

DB = os.environ.get("CAIRN_TEST_DB", "sqlite:///.cairn/approvals-test.db")
LEDGER = Path(os.environ.get("CAIRN_TEST_LEDGER", ".cairn/approvals-ledger.jsonl"))

app = cairn.App(db=DB, lease_seconds=0.5)


def ledger() -> list[dict[str, Any]]:
    if not LEDGER.exists():
        return []
    return [json.loads(line) for line in LEDGER.read_text().splitlines() if line.strip()]


def pay(key: str, customer: str, cents: int) -> dict[str, Any]:
    """The bank: a repeated key is the same transfer (its first receipt)."""
    for entry in ledger():
        if entry["key"] == key:
            return entry
    entry = {"key": key, "customer": customer, "cents": cents}
    with LEDGER.open("a") as fh:
        fh.write(json.dumps(entry) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return entry


def find_refund(op: cairn.Operation) -> cairn.Done[dict[str, Any]] | cairn.NotFound:
    found = next((e for e in ledger() if e["key"] == op.operation_id), None)
    return cairn.Done(found) if found is not None else cairn.NotFound()


@app.step()
def draft(customer: str, cents: int) -> dict[str, Any]:
    return {"customer": customer, "cents": cents}


@app.tool(effect="write", reconcile=find_refund, approval=lambda args: args["cents"] > 1000)
def refund(op: cairn.Operation, customer: str, cents: int) -> dict[str, Any]:
    return pay(op.operation_id, customer, cents)


@app.workflow(name="refund_agent")
def refund_agent(ctx: cairn.Context, customer: str, cents: int) -> dict[str, Any]:
    plan = draft(customer, cents)
    return refund(plan["customer"], plan["cents"])


@app.tool(effect="write", reconcile=find_refund, approval=True, approval_timeout=2.5)
def timed(op: cairn.Operation, customer: str, cents: int) -> dict[str, Any]:
    return pay(op.operation_id, customer, cents)


@app.workflow(name="timed_refund")
def timed_refund(ctx: cairn.Context, customer: str, cents: int) -> dict[str, Any]:
    try:
        return timed(customer, cents)
    except cairn.ApprovalExpired:
        return {"refused": "expired"}


#: positions: draft 0, approval request 1, decision 2, the refund tool 3
TOOL_POSITION = 3


if __name__ == "__main__":
    command = sys.argv[1]
    try:
        if command == "run":
            app.run(refund_agent, sys.argv[3], int(sys.argv[4]), run_id=sys.argv[2])
        elif command == "run-timed":
            app.run(timed_refund, sys.argv[3], int(sys.argv[4]), run_id=sys.argv[2])
        elif command == "resume":
            app.resume(sys.argv[2])
        elif command == "worker":
            app.worker(concurrency=1, worker_id=sys.argv[2], poll_interval=0.05).run()
    except cairn.RunSuspended:
        sys.exit(3)  # waiting for a decision: nothing more to do here
    finally:
        app.close()
