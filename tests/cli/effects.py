"""Workflows with side-effecting tools, for the operator commands' tests
(``cairn ops``, ``kill``, ``resume``, ``budget``).

The "bank" is a JSONL ledger file named in the run's input, so what a tool
did is visible from any process. An outage file makes ``pay`` raise
``TimeoutError`` like a request whose answer never came: with the content
``after`` the transfer was applied first (it happened, the answer was lost),
with ``before`` it was not (the request never arrived). ``pay`` has no
``reconcile`` function, so either way the run needs an operator.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cairn


def ledger_lines(ledger: str | Path) -> list[dict[str, Any]]:
    path = Path(ledger)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def register(app: cairn.App) -> None:
    @app.tool(effect="read", name="lookup_account")
    def lookup_account(customer: str) -> str:
        return f"acct_{customer}"

    @app.tool(effect="write", name="pay")
    def pay(op: cairn.Operation, to: str, amount: int, ledger: str, outage: str) -> dict[str, Any]:
        mode = Path(outage).read_text().strip() if outage and Path(outage).exists() else ""
        if mode == "before":
            raise TimeoutError("the bank did not answer in time")
        with Path(ledger).open("a") as fh:
            fh.write(json.dumps({"key": op.operation_id, "to": to, "amount": amount}) + "\n")
        if mode == "after":
            raise TimeoutError("the bank did not answer in time")
        return {"transfer": f"t-{op.operation_id[:8]}", "to": to, "amount": amount}

    @app.workflow(name="payout")
    def payout(
        ctx: cairn.Context, customer: str, amount: int, ledger: str, outage: str = ""
    ) -> dict[str, Any]:
        account = lookup_account(customer)
        return {"receipt": pay(account, amount, ledger, outage)}

    @app.workflow(name="lookups")
    def lookups(ctx: cairn.Context, customers: list[str]) -> list[str]:
        return [lookup_account(customer) for customer in customers]

    @app.workflow(name="guarded")
    def guarded(ctx: cairn.Context, breach: str) -> str:
        lookup_account("eve")
        if Path(breach).exists():
            raise cairn.SecurityViolation("the agent tried to read another tenant's data")
        return "clean"


    @app.step(name="plan")
    def plan(feedback: list[str]) -> int:
        return 3 if feedback else 2

    @app.workflow(name="rewinding")
    def rewinding(ctx: cairn.Context) -> int:
        total = plan([r["reason"] for r in ctx.rewinds()])
        if total % 2 == 0:
            raise cairn.LogicalFailure("the total must be odd", rewind_to="plan")
        return total


def build_app(db: str) -> cairn.App:
    app = cairn.App(db, lease_seconds=5.0)
    register(app)
    return app
