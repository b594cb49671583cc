"""The graph the SIGKILL test runs (``test_kill.py``), in the test process
and in worker processes (``python -m tests.graph.kill_app --worker-id X``).

Each super-step runs ``left`` and ``right`` side by side; both note each of
their executions in a file (``executions.jsonl``: node, super-step input,
time, pid) before doing anything, and ``left`` deposits through a ``write``
tool whose effect is a line in ``effects.jsonl`` (its reconciler looks the
operation id up there), so the test can count what really ran."""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

import cairn

STEPS = 12


class Ledger(TypedDict):
    log: Annotated[list[str], cairn.append]
    n: int


def note(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as out:
        out.write(json.dumps(record) + "\n")
        out.flush()
        os.fsync(out.fileno())


def lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def build_app(db: str, directory: Path, *,
              lease_seconds: float = 1.0) -> tuple[cairn.App, cairn.Workflow[Any]]:
    app = cairn.App(db=db, lease_seconds=lease_seconds, max_recoveries=100)
    executions, effects = directory / "executions.jsonl", directory / "effects.jsonl"

    def found(op: cairn.Operation) -> cairn.Done[str] | cairn.NotFound:
        done = [e for e in lines(effects) if e["op"] == op.operation_id]
        return cairn.Done(done[0]["op"]) if done else cairn.NotFound()

    @app.tool(effect="write", reconcile=found)
    def deposit(op: cairn.Operation, n: int) -> str:
        time.sleep(random.uniform(0, 0.03))
        note(effects, {"op": op.operation_id, "n": n, "pid": os.getpid()})
        time.sleep(random.uniform(0, 0.03))
        return op.operation_id

    g = cairn.Graph(Ledger)

    def left(state: Ledger, ctx: cairn.Context) -> dict[str, Any]:
        note(executions, {"node": "left", "n": state["n"], "t": time.time(), "pid": os.getpid()})
        time.sleep(random.uniform(0, 0.05))
        receipt = deposit(state["n"])
        time.sleep(random.uniform(0, 0.05))
        return {"log": [f"left {state['n']} {receipt}"]}

    def right(state: Ledger) -> dict[str, Any]:
        note(executions, {"node": "right", "n": state["n"], "t": time.time(), "pid": os.getpid()})
        time.sleep(random.uniform(0, 0.08))
        return {"n": state["n"] + 1}

    g.node(left)
    g.node(right)
    g.edge(cairn.START, "left")
    g.edge(cairn.START, "right")
    g.route("left", lambda state: cairn.END if state["n"] >= STEPS else ["left", "right"])
    g.route("right", lambda state: cairn.END if state["n"] >= STEPS else ["left", "right"])
    return app, app.graph("ledger", g)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker-id", required=True)
    args = parser.parse_args()
    app, _ = build_app(os.environ["CAIRN_TEST_DB"], Path(os.environ["CAIRN_TEST_DIR"]))
    app.worker(concurrency=1, worker_id=args.worker_id, poll_interval=0.02).run()
    app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
