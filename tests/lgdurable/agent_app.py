"""The LangGraph agent the crash tests run (``test_kill.py``, ``test_stale_worker.py``),
in the test process and in worker processes (``python -m tests.lgdurable.agent_app --worker-id X``).

A real ``StateGraph``: each round ``plan`` fans out two ``pay`` tasks
(``Send``) beside ``audit``, a compiled subgraph of two super-steps
(``check`` then ``stamp``), then ``decide`` loops back to ``plan`` until
``ROUNDS`` rounds are done. ``pay``, ``check`` and ``stamp`` pay through a
Cairn ``write`` tool whose effect is a line in ``bank.jsonl`` (its
reconciler looks the operation id up there), so the test counts what really
happened; every node notes its executions in ``executions.jsonl`` first."""

from __future__ import annotations

import argparse
import json
import operator
import os
import random
import sys
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

import cairn
from tests import processes

ROUNDS = 3
#: payments per round: two ``pay`` tasks, ``check`` and ``stamp``, each
#: ``pay`` task's fee (the same call with the same arguments in both tasks),
#: and ``decide``'s closing entry
PAYMENTS = {**{f"pay {r}.{k}": 1 for r in range(1, ROUNDS + 1) for k in range(2)},
            **{f"{what} {r}": 1 for r in range(1, ROUNDS + 1) for what in ("check", "stamp")},
            **{f"fee {r}": 2 for r in range(1, ROUNDS + 1)},
            **{f"close {r}": 1 for r in range(1, ROUNDS + 1)}}
START_STATE = {"log": [], "n": 0, "paid": 0}
#: the worker processes' lease in seconds (default 1)
LEASE_ENV = "CAIRN_TEST_LEASE"
#: a ``processes.Zygote``'s ``preload`` for this module: ``import cairn`` is lazy, so a zygote
#: of this module alone left each forked worker to import Cairn's runtime and its LangGraph
#: integration (some 250 modules: 0.4 s of CPU, a second and more on a loaded machine)
PRELOAD = (*processes.WORKER_PRELOAD, "cairn.langgraph", "cairn.lgdurable")


class Agent(TypedDict):
    log: Annotated[list[str], operator.add]
    n: int
    paid: Annotated[int, operator.add]


class Audit(TypedDict):
    n: int
    receipts: Annotated[list[str], operator.add]


class Payment(TypedDict):
    round: int
    k: int


def thought(n: int) -> str:
    """Round ``n``'s plan, ~14 KB of words: by the third round the thread has
    written more than a thread dictionary is made of (``cairn.lgdictionary``),
    so the rest of its long values are compressed with one, made by whichever
    worker got there, and read by the workers after it."""
    return f"thought {n}: " + " ".join(f"w{(n * 7919 + i * 104729) % 3001}" for i in range(2400))


def note(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as out:
        out.write(json.dumps(record) + "\n")
        out.flush()
        os.fsync(out.fileno())


def lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def pause(most: float) -> None:
    time.sleep(random.uniform(0, most))


def build(db: str, directory: Path, *, lease_seconds: float = 1.0) -> tuple[cairn.App, cairn.Workflow[Any]]:
    app = cairn.App(db=db, lease_seconds=lease_seconds, max_recoveries=100)
    executions, bank = directory / "executions.jsonl", directory / "bank.jsonl"

    def found(op: cairn.Operation) -> cairn.Done[str] | cairn.NotFound:
        done = [e for e in lines(bank) if e["op"] == op.operation_id]
        return cairn.Done(f"paid {done[0]['what']}") if done else cairn.NotFound()

    @app.tool(effect="write", reconcile=found)
    def transfer(op: cairn.Operation, what: str, amount: int) -> str:
        pause(0.02)
        note(bank, {"op": op.operation_id, "what": what, "amount": amount, "pid": os.getpid()})
        pause(0.02)
        return f"paid {what}"

    def noted(node: str, state: dict[str, Any]) -> None:
        note(executions, {"node": node, "n": state.get("n", state.get("round")), "t": time.time(),
                          "pid": os.getpid()})

    def plan(state: Agent) -> dict[str, Any]:
        noted("plan", dict(state))
        pause(0.03)
        return {"n": state["n"] + 1, "log": [f"plan {state['n'] + 1}", thought(state["n"] + 1)]}

    def fan_out(state: Agent) -> list[Any]:
        return [Send("pay", Payment(round=state["n"], k=k)) for k in range(2)] + ["audit"]

    def pay(payment: Payment) -> dict[str, Any]:
        noted("pay", dict(payment))
        pause(0.05)
        receipt = transfer(f"pay {payment['round']}.{payment['k']}", 10 + payment["k"])
        pause(0.03)
        fee = transfer(f"fee {payment['round']}", 1)  # the same call in both tasks: two fees
        return {"log": [receipt, fee], "paid": 11 + payment["k"]}

    def check(state: Audit) -> dict[str, Any]:
        noted("check", dict(state))
        pause(0.04)
        return {"receipts": [transfer(f"check {state['n']}", 1)]}

    def stamp(state: Audit) -> dict[str, Any]:
        noted("stamp", dict(state))
        pause(0.04)
        return {"receipts": [transfer(f"stamp {state['n']}", 2)]}

    auditor = StateGraph(Audit)
    auditor.add_node("check", check)
    auditor.add_node("stamp", stamp)
    auditor.add_edge(START, "check")
    auditor.add_edge("check", "stamp")
    subgraph = auditor.compile()

    def audit(state: Agent) -> dict[str, Any]:
        """A node that runs a subgraph (its checkpoints nest under this task's)."""
        noted("audit", dict(state))
        done = subgraph.invoke({"n": state["n"], "receipts": []})
        return {"log": done["receipts"], "paid": 3}

    def decide(state: Agent) -> dict[str, Any]:
        noted("decide", dict(state))
        pause(0.03)
        return {"log": [f"decided {state['n']}", transfer(f"close {state['n']}", 0)]}

    builder = StateGraph(Agent)
    builder.add_node("plan", plan)
    builder.add_node("pay", pay)
    builder.add_node("audit", audit)
    builder.add_node("decide", decide)
    builder.add_edge(START, "plan")
    builder.add_conditional_edges("plan", fan_out, ["pay", "audit"])
    builder.add_edge("pay", "decide")
    builder.add_edge("audit", "decide")
    builder.add_conditional_edges("decide", lambda s: END if s["n"] >= ROUNDS else "plan", ["plan", END])
    return app, app.langgraph(builder.compile(), name="agent")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker-id", required=True)
    args = parser.parse_args()
    # the lease a test gives its workers (``CAIRN_TEST_LEASE``): a new worker takes a killed
    # one's run over once it expired, so a chain of kills waits it out once a kill
    lease = float(os.environ.get(LEASE_ENV, "1.0"))
    app, _ = build(os.environ["CAIRN_TEST_DB"], Path(os.environ["CAIRN_TEST_DIR"]), lease_seconds=lease)
    app.worker(concurrency=1, worker_id=args.worker_id, poll_interval=0.02).run()
    app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
