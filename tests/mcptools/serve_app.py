"""Workflows for the ``cairn mcp serve`` tests: one waits for an approval,
one for a signal. ``cairn mcp serve --app tests.mcptools.serve_app:app``."""

from __future__ import annotations

import os

import cairn

app = cairn.App(db=os.environ.get("CAIRN_TEST_DB"))


@app.workflow(name="payout")
def payout(ctx: cairn.Context, cents: int) -> str:
    decision = ctx.request_approval("pay", {"cents": cents})
    return f"{decision.status.value}: {cents}"


@app.workflow(name="waiter")
def waiter(ctx: cairn.Context) -> str:
    return f"got {ctx.wait_for_signal('go', type_=str)}"
