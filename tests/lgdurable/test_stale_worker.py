"""Two workers, one LangGraph run (both backends): worker A is frozen with
SIGSTOP inside a node, its lease runs out, worker B takes the run over and
finishes it; A is then let go with SIGCONT and goes on where it stood.
Whatever A then tries to write is refused: nothing in the run's history
after the takeover, and the thread's chain of checkpoints is one (no
checkpoint has two children: A never forked it). Each payment was sent
under one operation id (A may still send the one it was frozen inside,
which B found not done and sent: the idempotency key makes that one
effect), and the final state is an uninterrupted run's."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cairn.langgraph import CairnSaver
from cairn.store.records import RunStatus
from tests import processes
from tests.backends import StoreBackend
from tests.lgdurable import agent_app
from tests.timing import SLACK


def _wait(what: str, done: Any, seconds: float) -> None:
    deadline = time.monotonic() + seconds * SLACK
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def stop_outside_transaction(pid: int, worker_id: str, backend: StoreBackend) -> None:
    """SIGSTOP worker ``pid`` at a moment it holds no write transaction open:
    one frozen inside would block the takeover on the database's locks (a
    property of the database, not what fencing is about)."""
    for _ in range(50):
        os.kill(pid, signal.SIGSTOP)
        _wait(f"pid {pid} to stop", lambda: _state(pid) == "T", 5)
        if not backend.in_transaction(worker_id):
            return
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.01)
    raise AssertionError(f"worker {worker_id} was inside a transaction at each of 50 stops")


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_frozen_worker_let_go_after_a_takeover_writes_nothing(tmp_path: Path,
                                                                backend: StoreBackend) -> None:
    app, workflow = agent_app.build(backend.url, tmp_path)
    app.start(workflow, agent_app.START_STATE, run_id="agent")
    noted = tmp_path / "executions.jsonl"
    env = {"CAIRN_TEST_DIR": str(tmp_path)}
    a = processes.spawn("tests.lgdurable.agent_app", ["--worker-id", "A"],
                        env={**env, "CAIRN_TEST_DB": backend.worker_url("A")}, log=tmp_path / "a.log")
    b = None
    try:  # freeze A inside a pay node of round 2
        _wait("A to pay in round 2", lambda: any(e["node"] == "pay" and e["n"] == 2
                                                 for e in agent_app.lines(noted)), 60)
        time.sleep(0.03)
        stop_outside_transaction(a.pid, "A", backend)
        frozen_at = app.get_run("agent").epoch
        b = processes.spawn("tests.lgdurable.agent_app", ["--worker-id", "B"],
                            env={**env, "CAIRN_TEST_DB": backend.worker_url("B")}, log=tmp_path / "b.log")
        _wait("B to finish the run", lambda: app.get_run("agent").status is RunStatus.COMPLETED, 120)
        assert app.get_run("agent").epoch > frozen_at, "B finished without taking the run over"
        taken_over = max(e.seq for e in app.history("agent") if e.worker == "A")
        os.kill(a.pid, signal.SIGCONT)
        time.sleep(3.0)  # A goes on from where it stood: its node finishes, its writes are refused
        assert a.poll() is None, "worker A died instead of being refused"
        assert max(e.seq for e in app.history("agent") if e.worker == "A") == taken_over, "A wrote after"
        saver = CairnSaver(app)
        chain = list(saver.list({"configurable": {"thread_id": "lg:agent", "checkpoint_ns": ""}}))
        parents = Counter(t.parent_config["configurable"]["checkpoint_id"] for t in chain if t.parent_config)
        assert parents, chain
        assert max(parents.values()) == 1, parents  # one chain: no checkpoint has two children
        ops: dict[str, set[str]] = {}
        for effect in agent_app.lines(tmp_path / "bank.jsonl"):
            ops.setdefault(effect["what"], set()).add(effect["op"])
        assert {what: len(found) for what, found in ops.items()} == agent_app.PAYMENTS
        final = app.handle("agent").result()
    finally:
        for worker in (a, b):
            if worker is not None and worker.poll() is None:
                os.kill(worker.pid, signal.SIGCONT)
                worker.kill()
                worker.wait(10)
        app.close()

    clean_dir = tmp_path / "clean"
    clean_dir.mkdir()
    clean, clean_workflow = agent_app.build(f"sqlite:///{clean_dir}/cairn.db", clean_dir)
    try:
        assert final == clean.run(clean_workflow, agent_app.START_STATE, run_id="agent")
    finally:
        clean.close()
