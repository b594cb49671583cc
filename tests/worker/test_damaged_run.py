"""Issue 9 item 7, through a worker: a malformed ``history.detail`` on the
oldest pending run used to make every claim fail (a traceback every poll,
every run stuck behind it). The worker now quarantines that run with a reason
and executes the others, logging no traceback."""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

import pytest

import cairn
from cairn.store.records import RunStatus
from cairn.worker.worker import Worker, WorkerSettings


def test_a_worker_quarantines_the_damaged_oldest_run_and_runs_the_others(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="cairn")
    db = tmp_path / "cairn.db"
    app = cairn.App(f"sqlite:///{db}")

    @app.workflow(name="double")
    def double(ctx: cairn.Context, n: int) -> int:
        return 2 * n

    damaged = app.start(double, 0, run_id="oldest")
    others = [app.start(double, n, run_id=f"r{n}") for n in range(1, 4)]
    with sqlite3.connect(db) as conn:  # as a bad restore or a hostile hand would
        conn.execute("UPDATE history SET detail = '{\"unterminated' WHERE run_id = 'oldest'")
    worker = Worker(app.runtime, WorkerSettings(concurrency=2, poll_interval=0.02))
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        assert [h.result(timeout=20) for h in others] == [2, 4, 6]
        with pytest.raises(cairn.RunFailed, match="damaged"):
            damaged.result(timeout=5)
    finally:
        worker.stop()
        thread.join(timeout=10)
    record = app.get_run("oldest")
    assert record.status is RunStatus.QUARANTINED
    assert record.error is not None
    assert "detail of history entry 1 is not valid JSON" in record.error["message"]
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    app.close()
