"""A payment deployment whose ``charge`` tool a later deploy re-declares.

``build(db, effect)`` is the deployment's app: workflow ``pay`` charges
once through tool ``charge``, declared with ``effect`` (``"write"`` with a
reconciler that asks the bank, or ``"read"``: the mistake a redeploy made).
The workflow's code is the same in every deployment; only the tool's
declaration differs, so only the bundle's pinned tools tell them apart.
``python -m tests.bundles.payapp RUN_ID CENTS`` runs one payment on
``$CAIRN_DB`` (the write deployment), to be killed at a fault point.
The bank is a JSON-lines file (``$PAY_BANK``) both processes see."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import cairn


def _bank() -> Path:
    return Path(os.environ["PAY_BANK"])


def bank_entries() -> list[dict[str, Any]]:
    path = _bank()
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def _charge(op: cairn.Operation, cents: int) -> dict[str, Any]:
    entry = {"key": op.operation_id, "cents": cents, "n": len(bank_entries()) + 1}
    with _bank().open("a") as out:  # no dedupe at the bank: only the protocol prevents a double charge
        out.write(json.dumps(entry) + "\n")
    return entry


def _lookup(op: cairn.Operation) -> cairn.Done[dict[str, Any]] | cairn.NotFound:
    found = next((e for e in bank_entries() if e["key"] == op.operation_id), None)
    return cairn.NotFound() if found is None else cairn.Done(found)


def pay(ctx: cairn.Context, cents: int) -> dict[str, Any]:
    return CHARGE[0](cents)


#: the deployment's ``charge`` tool (each ``build`` sets it: one deployment per process)
CHARGE: list[Any] = [None]


def build(db: str | None, effect: str = "write") -> cairn.App:
    app = cairn.App(db=db, lease_seconds=0.5)
    reconcile = _lookup if effect == "write" else None
    CHARGE[0] = app.tool(name="charge", effect=effect, reconcile=reconcile)(_charge)  # type: ignore[call-overload]
    app.workflow(name="pay")(pay)
    return app


if __name__ == "__main__":
    application = build(os.environ["CAIRN_DB"])
    application.run("pay", int(sys.argv[2]), run_id=sys.argv[1])
