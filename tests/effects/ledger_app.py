"""A tiny 'outside world' and an agent that touches it through tools.

Used in a subprocess that dies at a named fault point (real SIGKILL) and then
in the test process, which recovers the run. The ledger is a JSON-lines file
so both processes see the same world; it supports idempotency keys and a
lookup by key, like a payment API.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import cairn

DB = os.environ.get("CAIRN_TEST_DB", "sqlite:///.cairn/effects-test.db")
LEDGER = Path(os.environ.get("CAIRN_TEST_LEDGER", ".cairn/ledger.jsonl"))

app = cairn.App(db=DB, lease_seconds=0.5)


def ledger_entries() -> list[dict[str, object]]:
    if not LEDGER.exists():
        return []
    return [json.loads(line) for line in LEDGER.read_text().splitlines() if line.strip()]


def post(kind: str, key: str, amount: int, *, dedupe: bool) -> dict[str, object]:
    """Apply a transfer; with ``dedupe`` a repeated key returns the first result."""
    if dedupe:
        for entry in ledger_entries():
            if entry["key"] == key:
                return entry
    entry = {"kind": kind, "key": key, "amount": amount, "n": len(ledger_entries()) + 1}
    with LEDGER.open("a") as fh:
        fh.write(json.dumps(entry) + "\n")
    return entry


def find(key: str) -> dict[str, object] | None:
    return next((e for e in ledger_entries() if e["key"] == key), None)


def reconcile_transfer(op: cairn.Operation) -> cairn.Done[dict[str, object]] | cairn.NotFound:
    entry = find(op.operation_id)
    return cairn.Done(entry) if entry is not None else cairn.NotFound()


@app.tool(effect="write", reconcile=reconcile_transfer)
def transfer(op: cairn.Operation, amount: int) -> dict[str, object]:
    # no server-side dedupe: only the ledger protocol prevents a double charge
    return post("transfer", op.operation_id, amount, dedupe=False)


@app.tool(effect="write")
def unreconciled_transfer(op: cairn.Operation, amount: int) -> dict[str, object]:
    return post("unreconciled", op.operation_id, amount, dedupe=False)


@app.tool(effect="idempotent")
def idempotent_transfer(op: cairn.Operation, amount: int) -> dict[str, object]:
    return post("idempotent", op.operation_id, amount, dedupe=True)


@app.tool(effect="read")
def balance(op: cairn.Operation) -> int:
    post("read", f"{op.operation_id}-{op.attempt}-{len(ledger_entries())}", 0, dedupe=False)
    return sum(int(str(e["amount"])) for e in ledger_entries() if e["kind"] != "read")


def reconcile_keyed(op: cairn.Operation) -> cairn.Done[dict[str, object]] | cairn.NotFound:
    entry = find(op.operation_id)
    return cairn.Done(entry) if entry is not None else cairn.NotFound()


@app.tool(effect="write", reconcile=reconcile_keyed)
def keyed_transfer(op: cairn.Operation, amount: int) -> dict[str, object]:
    # a bank that deduplicates by key: a reused key returns the first receipt
    return post("keyed", op.operation_id, amount, dedupe=True)


@app.step()
def decide(amount: int) -> int:
    return amount


@app.workflow(name="pay_checked")
def pay_checked(ctx: cairn.Context, amount: int) -> dict[str, object]:
    """Pays, finds the amount wrong, rewinds and pays the corrected amount:
    two intended effects, which must both land, once each."""
    chosen = decide(amount + 1000 * len(ctx.rewinds()))
    receipt = keyed_transfer(chosen)
    if not ctx.rewinds():
        raise cairn.LogicalFailure("the amount was wrong", rewind_to="decide")
    return receipt


#: the test process flips this to play a deploy that removed the write call
CHANGED = {"write_removed": False}


@app.workflow(name="pay_once")
def pay_once(ctx: cairn.Context, amount: int) -> str:
    if not CHANGED["write_removed"]:
        transfer(amount)
    return "done"


@app.workflow(name="pay")
def pay(ctx: cairn.Context, tool: str, amount: int) -> dict[str, object]:
    chosen = {"transfer": transfer, "unreconciled": unreconciled_transfer,
              "idempotent": idempotent_transfer}[tool]
    receipt = chosen(amount)
    return {"receipt": receipt, "balance": balance()}


if __name__ == "__main__":  # the crashing child: python -m tests.effects.ledger_app RUN_ID TOOL AMOUNT
    import sys

    if sys.argv[2] == "checked":
        app.run(pay_checked, int(sys.argv[3]), run_id=sys.argv[1])
    elif sys.argv[2] == "once":
        app.run(pay_once, int(sys.argv[3]), run_id=sys.argv[1])
    else:
        app.run(pay, sys.argv[2], int(sys.argv[3]), run_id=sys.argv[1])
