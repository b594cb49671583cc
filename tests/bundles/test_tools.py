"""A run pins its tools' interfaces: a worker whose tools differ from the
run's bundle must not serve it (issue 21). The payment's worker is SIGKILLed
after the bank took the charge but before the result was recorded; a
redeploy that re-declared ``charge`` as ``read`` would simply run it again
(a double charge), so its worker must leave the run to one whose ``charge``
is the pinned ``write`` tool, which reconciles it with the bank instead.
SQLite and PostgreSQL."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import cairn
from cairn.store.records import RunStatus
from tests.acceptance.harness import wait_until
from tests.bundles import payapp

ROOT = Path(__file__).resolve().parents[2]


def _drain(app: cairn.App, seconds: float) -> cairn.Worker:
    worker = app.worker(concurrency=1, poll_interval=0.02, lease_seconds=1.0)
    worker.run(install_signals=False, max_idle=seconds)
    return worker


def _crash_after_the_charge(db_url: str, bank: Path, run_id: str) -> None:
    env = {**os.environ, "CAIRN_DB": db_url, "PAY_BANK": str(bank), "CAIRN_FAULTS": "tool.after_effect"}
    child = subprocess.run([sys.executable, "-m", "tests.bundles.payapp", run_id, "500"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]


@pytest.mark.slow
def test_a_worker_whose_tool_changed_effect_does_not_serve_an_uncertain_write(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    bank = tmp_path / "bank.jsonl"
    monkeypatch.setenv("PAY_BANK", str(bank))
    _crash_after_the_charge(db_url, bank, "pay-1")
    assert len(payapp.bank_entries()) == 1  # charged once; the run does not know it

    redeployed = payapp.build(db_url, effect="read")
    try:
        run = redeployed.get_run("pay-1")
        assert run.status is RunStatus.RUNNING  # the dead worker's lease
        pinned = {t["name"]: t["effect"] for t in redeployed.runtime.registry.load(run.bundle or "",
                                                                                  redeployed.store).tools}
        assert pinned == {"charge": "write"}
        wait_until(lambda: (redeployed.get_run("pay-1").lease_expires_at or 0) < time.time(), 10,
                   "the dead worker's lease to expire")
        with caplog.at_level(logging.ERROR, logger="cairn.bundles"):
            worker = _drain(redeployed, 0.5)
        assert worker.claimed == 0
        assert run.bundle not in worker.bundles
        assert len(payapp.bank_entries()) == 1  # not charged again
        assert redeployed.get_run("pay-1").status is not RunStatus.COMPLETED
        refusals = [r.getMessage() for r in caplog.records if run.bundle and run.bundle in r.getMessage()]
        assert len(refusals) == 1
        assert "tool 'charge'" in refusals[0]
        assert "effect 'write' pinned, 'read' here" in refusals[0]
    finally:
        redeployed.close()

    same = payapp.build(db_url, effect="write")  # the deployment the run started on
    try:
        _drain(same, 0.5)
        assert same.handle("pay-1").result(timeout=5) == payapp.bank_entries()[0]  # reconciled
        assert len(payapp.bank_entries()) == 1
    finally:
        same.close()
