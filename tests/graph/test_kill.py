"""SIGKILL a graph's worker at random points inside super-steps (both backends).

Workers are real processes killed without warning, again and again, until
one is left to finish. Then: no node of a committed super-step ran after its
checkpoint (every execution the nodes noted happened before the commit of
its super-step), every deposit happened once, and the final state is the
one an uninterrupted run of the same graph produces."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from cairn.graph.checkpoints import KIND
from cairn.store.records import RunStatus
from tests import processes
from tests.backends import StoreBackend
from tests.graph import kill_app

START = {"log": [], "n": 0}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigkill_inside_super_steps_reruns_no_committed_node(tmp_path: Path, backend: StoreBackend) -> None:
    app, workflow = kill_app.build_app(backend.url, tmp_path)
    app.start(workflow, START, run_id="ledger")
    rnd = random.Random()
    workers = []
    try:
        for round_ in range(40):
            log = tmp_path / f"worker-{round_}.log"
            worker = processes.spawn("tests.graph.kill_app", ["--worker-id", f"w{round_}"],
                                     env={"CAIRN_TEST_DB": backend.worker_url(f"w{round_}"),
                                          "CAIRN_TEST_DIR": str(tmp_path)}, log=log)
            workers.append(worker)
            noted = tmp_path / "executions.jsonl"
            seen = len(kill_app.lines(noted))
            deadline = time.monotonic() + 120
            if round_ < 8:  # kill it inside a super-step: once a node of it has started, at a random moment
                while time.monotonic() < deadline and len(kill_app.lines(noted)) == seen:
                    time.sleep(0.005)
                time.sleep(rnd.uniform(0, 0.15))
            else:  # the last one finishes the run
                while time.monotonic() < deadline and app.get_run("ledger").status is not RunStatus.COMPLETED:
                    time.sleep(0.02)
            worker.kill()
            worker.wait(10)
            if app.get_run("ledger").status is RunStatus.COMPLETED:
                break
        run = app.get_run("ledger")
        assert run.status is RunStatus.COMPLETED, [w.args for w in workers]
        committed = {int(str(e.name).split()[1]): e.at for e in app.history("ledger") if e.step_kind == KIND}
        assert sorted(committed) == list(range(kill_app.STEPS + 1))
        executions = kill_app.lines(tmp_path / "executions.jsonl")
        for execution in executions:  # a node of step k reads n == k - 1 ... and ran before step k's commit
            assert execution["t"] < committed[execution["n"] + 1], execution
        effects = kill_app.lines(tmp_path / "effects.jsonl")
        assert sorted(e["n"] for e in effects) == list(range(kill_app.STEPS))  # each deposit once
        final = app.handle("ledger").result()
    finally:
        for worker in workers:
            if worker.poll() is None:
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
    reruns = len(executions) - 2 * kill_app.STEPS
    print(f"{len(workers)} workers, {reruns} node executions of uncommitted super-steps run again")
