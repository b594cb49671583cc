"""A worker SIGKILLed (``$CAIRN_FAULTS``) right after a root checkpoint of a
LangGraph run is stored and before its journal entry is recorded (both
backends): the next worker records the entry for that checkpoint
(``LangGraphRun._catch_up``) and finishes the run, each payment once and the
final state an uninterrupted run's. At the last checkpoint this is the case
where the calls of the last super-step would otherwise lie past the run's
end, and the run would fail as non-deterministic."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from cairn.store.records import RunStatus
from tests import processes
from tests.backends import StoreBackend
from tests.lgdurable import agent_app

#: root checkpoints of the agent's run: its input, step 0, and three per round
CHECKPOINTS = 2 + 3 * agent_app.ROUNDS


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("nth", [5, CHECKPOINTS])
def test_a_death_between_a_checkpoint_and_its_journal_entry(tmp_path: Path, backend: StoreBackend,
                                                            nth: int) -> None:
    app, workflow = agent_app.build(backend.url, tmp_path)
    app.start(workflow, agent_app.START_STATE, run_id="agent")
    env = {"CAIRN_TEST_DIR": str(tmp_path)}
    doomed = processes.spawn("tests.lgdurable.agent_app", ["--worker-id", "doomed"],
                             env={**env, "CAIRN_TEST_DB": backend.worker_url("doomed"),
                                  "CAIRN_FAULTS": f"langgraph.after_checkpoint@{nth}"},
                             log=tmp_path / "doomed.log")
    rescuer = None
    try:
        assert doomed.wait(120) != 0, "the fault point never fired"
        steps = [e.name for e in app.history("agent") if e.step_kind == "langgraph"]
        assert len(steps) == nth - 1, steps  # the nth checkpoint was stored, its entry not recorded
        rescuer = processes.spawn("tests.lgdurable.agent_app", ["--worker-id", "rescuer"],
                                  env={**env, "CAIRN_TEST_DB": backend.worker_url("rescuer")},
                                  log=tmp_path / "rescuer.log")
        deadline = time.monotonic() + 120
        while not app.get_run("agent").status.terminal and time.monotonic() < deadline:
            time.sleep(0.05)
        run = app.get_run("agent")
        assert run.status is RunStatus.COMPLETED, (run.status, run.error)
        paid = Counter(e["what"] for e in agent_app.lines(tmp_path / "bank.jsonl"))
        assert paid == Counter(agent_app.PAYMENTS)
        final = app.handle("agent").result()
    finally:
        for worker in (doomed, rescuer):
            if worker is not None and worker.poll() is None:
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
