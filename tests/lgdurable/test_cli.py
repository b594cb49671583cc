"""A LangGraph run through the command line (both backends): ``cairn start``
stores it, ``cairn worker`` claims it, the interrupt waits as an approval
that ``cairn approve`` decides, and ``cairn show`` lists its super-steps
with their LangGraph node names."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import cairn
from cairn.store.records import RunStatus
from tests import processes
from tests.backends import StoreBackend

APP = "tests.lgdurable.cli_app:app"


def cli(db: str, *args: str) -> str:
    done = processes.run("cairn", [*args], env={"CAIRN_DB": db}, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_start_worker_approve_show(tmp_path: Path, backend: StoreBackend) -> None:
    db = backend.url
    given = json.dumps({"input": {"order": "A-17", "log": []}})
    assert cli(db, "start", "support", "--app", APP, "--input", given, "--run-id", "t-1").strip() == "t-1"
    worker = processes.spawn("cairn", ["worker", "--app", APP, "--concurrency", "1", "--poll", "0.05"],
                             env={"CAIRN_DB": backend.worker_url("w")}, log=tmp_path / "worker.log")
    app = cairn.App(db=db)
    try:
        deadline = time.monotonic() + 90
        while app.get_run("t-1").status is not RunStatus.SUSPENDED and time.monotonic() < deadline:
            time.sleep(0.05)  # the request is stored, then the run suspends
        [request] = app.approvals(run_id="t-1")
        cli(db, "approve", "t-1", request.request_id, "--edit", "25")
        assert app.handle("t-1").result(timeout=90) == {"order": "A-17",
                                                        "log": ["triaged A-17", "refunded 25 on A-17"]}
        shown = cli(db, "show", "t-1")
        assert "step 1: triage" in shown
        assert "step 2: settle" in shown
    finally:
        worker.terminate()
        worker.wait(30)
        app.close()
