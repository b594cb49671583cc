"""A LangGraph run stopped at a static interrupt, its workers SIGKILLed at
each window around the decision (both backends): the stop is asked once,
its edit applied once, and ``pay`` runs once.

One chain of worker processes (forked from one pre-loaded parent) runs
``breakpoint_app``'s ``draft -> pay`` graph, compiled with
``interrupt_before=["pay"]``, each armed to die at one moment:

1. after the checkpoint before ``pay`` is stored, before its journal entry
   and before anything was asked: LangGraph never got to stop there, and the
   next worker must still stop (this is what rules out trusting LangGraph's
   own stop: the checkpoint looks like any a killed worker leaves);
2. (unarmed) asks the approval and suspends; the test edits the amount;
3. after the decision is taken from the mailbox and recorded;
4. after the edit's checkpoint (``update_state``) is stored, before its
   journal entry: the edit must not be applied again (the amount has an
   ``add`` reducer: twice would pay 14);
5. after ``pay``'s writes are stored, before the super-step's checkpoint:
   ``pay`` must not run again;
6. (unarmed) finishes the run."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

import cairn
from cairn.store.records import RunStatus
from tests import processes
from tests.backends import StoreBackend
from tests.lgdurable import agent_app, breakpoint_app
from tests.lgdurable.agent_app import lines

#: the armed workers, in order: the point each dies at (steps 1, 3, 4 and 5 of the docstring)
DEATHS = ("langgraph.after_checkpoint@3", "store.take_delivery.after_commit@1",
          "langgraph.after_checkpoint@1", "langgraph.after_writes@1")


def _until(what: str, done: object, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.02)
    assert done(), f"timed out waiting for {what}"  # type: ignore[operator]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_workers_killed_around_a_static_interrupt(tmp_path: Path, backend: StoreBackend) -> None:
    app, workflow = breakpoint_app.build(backend.url, tmp_path)
    app.start(workflow, breakpoint_app.START_STATE, run_id="bill")
    zygote = processes.Zygote("tests.lgdurable.breakpoint_app", log=tmp_path / "zygote.log",
                              preload=agent_app.PRELOAD)
    workers: list[processes.Forked] = []

    def fork(name: str, point: str | None = None) -> processes.Forked:
        env = {"CAIRN_TEST_DIR": str(tmp_path), "CAIRN_TEST_DB": backend.worker_url(name),
               **({"CAIRN_FAULTS": point} if point else {})}
        workers.append(zygote.spawn(["--worker-id", name], env=env, log=tmp_path / f"{name}.log"))
        return workers[-1]

    def dies(name: str, point: str) -> None:
        worker = fork(name, point)
        assert worker.wait(120) != 0, f"{point} never fired"

    def ran() -> list[str]:
        return [e["node"] for e in lines(tmp_path / "executions.jsonl")]

    try:
        dies("w0", DEATHS[0])
        assert ran() == ["draft"]
        assert app.approvals(run_id="bill", pending=False) == []  # it died before asking
        asker = fork("w1")
        _until("the approval", lambda: app.approvals(run_id="bill") or app.get_run("bill").status.terminal)
        assert ran() == ["draft"], "pay ran without its approval"
        _until("the suspension", lambda: app.get_run("bill").status is RunStatus.SUSPENDED)
        asker.kill()
        asker.wait(10)
        [request] = app.approvals(run_id="bill")
        assert request.action == "LangGraph bill: before pay (step 1)"
        assert ran() == ["draft"]
        app.approve("bill", request.request_id, edit={"amount": 7})
        for k, point in enumerate(DEATHS[1:], start=2):
            dies(f"w{k}", point)
        fork("w5")
        _until("the end", lambda: app.get_run("bill").status.terminal)
        run = app.get_run("bill")
        assert run.status is RunStatus.COMPLETED, (run.status, run.error)
        assert app.handle("bill").result() == {"log": ["drafted", "paid 7"], "amount": 7}
        assert len(app.approvals(run_id="bill", pending=False)) == 1  # asked once
        assert Counter(ran()) == Counter({"draft": 1, "pay": 1})  # pay's stored writes were not redone
        assert [e["amount"] for e in lines(tmp_path / "bank.jsonl")] == [7]
        steps = [e.name for e in app.history("bill") if e.step_kind == "langgraph"]
        assert steps.count("step 2 (update)") == 1, steps  # the edit's checkpoint, once
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait(10)
        zygote.close()
        app.close()


def test_the_app_runs_inline_to_its_stop(tmp_path: Path) -> None:
    """The crash test's graph, in-process: it stops before ``pay`` (a check of the app itself)."""
    app, workflow = breakpoint_app.build(f"sqlite:///{tmp_path}/cairn.db", tmp_path)
    try:
        with pytest.raises(cairn.RunSuspended, match=r"before pay \(step 1\)"):
            app.run(workflow, breakpoint_app.START_STATE, run_id="bill")
    finally:
        app.close()
