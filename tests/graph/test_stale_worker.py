"""Two workers, one graph run (both backends): worker A is frozen with
SIGSTOP inside a super-step, its lease runs out, worker B takes the run
over and finishes it; A is then let go with SIGCONT and goes on where it
stood. Whatever A then tries to write is refused: the chain of
checkpoints is one (each super-step checkpointed once, none by A after B
took over), each deposit was sent under one operation id (A may still
send the one it was frozen inside, which B found not done and sent: the
idempotency key is what makes that one effect), and the final state is an
uninterrupted run's."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from cairn.graph.checkpoints import KIND
from cairn.store.records import RunStatus
from tests import processes
from tests.backends import StoreBackend
from tests.graph import kill_app
from tests.timing import SLACK

START = {"log": [], "n": 0}


def _wait(what: str, done: object, seconds: float) -> None:
    deadline = time.monotonic() + seconds * SLACK
    while not done():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_frozen_worker_let_go_after_a_takeover_writes_nothing(tmp_path: Path,
                                                                backend: StoreBackend) -> None:
    app, workflow = kill_app.build_app(backend.url, tmp_path)
    app.start(workflow, START, run_id="ledger")
    noted = tmp_path / "executions.jsonl"
    env = {"CAIRN_TEST_DIR": str(tmp_path)}
    a = processes.spawn("tests.graph.kill_app", ["--worker-id", "A"],
                        env={**env, "CAIRN_TEST_DB": backend.worker_url("A")}, log=tmp_path / "a.log")
    b = None
    try:
        # freeze A inside a super-step after a few have committed
        _wait("A to start super-step 4", lambda: any(e["n"] >= 3 for e in kill_app.lines(noted)), 60)
        os.kill(a.pid, signal.SIGSTOP)
        frozen_at = app.get_run("ledger").epoch
        b = processes.spawn("tests.graph.kill_app", ["--worker-id", "B"],
                            env={**env, "CAIRN_TEST_DB": backend.worker_url("B")}, log=tmp_path / "b.log")
        _wait("B to finish the run", lambda: app.get_run("ledger").status is RunStatus.COMPLETED, 120)
        assert app.get_run("ledger").epoch > frozen_at, "B finished without taking the run over"
        taken_over = max(e.seq for e in app.history("ledger") if e.worker == "A")
        os.kill(a.pid, signal.SIGCONT)
        # A goes on from where it stood: its node finishes and its write is tried, then refused
        time.sleep(3.0)
        assert a.poll() is None, "worker A died instead of being refused"
        history = app.history("ledger")
        assert max(e.seq for e in history if e.worker == "A") == taken_over, "A wrote after the takeover"
        steps = Counter(int(str(e.name).split()[1]) for e in history if e.step_kind == KIND)
        assert steps == Counter(range(kill_app.STEPS + 1)), steps  # one chain: each super-step once
        # each deposit under one operation id: a frozen A may still send the one it was inside
        # when frozen (B found it not done and sent it), but under the same idempotency key, which
        # the outside world deduplicates; never a second id for one deposit
        effects = kill_app.lines(tmp_path / "effects.jsonl")
        keys: dict[int, set[str]] = {}
        for effect in effects:
            keys.setdefault(effect["n"], set()).add(effect["op"])
        assert sorted(keys) == list(range(kill_app.STEPS))
        assert all(len(ops) == 1 for ops in keys.values()), keys
        final = app.handle("ledger").result()
    finally:
        for worker in (a, b):
            if worker is not None and worker.poll() is None:
                os.kill(worker.pid, signal.SIGCONT)
                worker.kill()
                worker.wait(10)
        app.close()

    clean_dir = tmp_path / "clean"
    clean_dir.mkdir()
    clean, clean_workflow = kill_app.build_app(f"sqlite:///{clean_dir}/cairn.db", clean_dir)
    try:
        assert final == clean.run(clean_workflow, START, run_id="ledger")
    finally:
        clean.close()
