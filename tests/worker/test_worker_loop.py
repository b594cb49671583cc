"""The worker's claim loop on a real SQLite store: a worker whose every slot
is busy does not wake up to poll (each wake-up takes the GIL from the threads
executing steps), and still claims at once when a slot frees."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import cairn
from cairn.store.records import Claim
from cairn.worker.worker import Worker, WorkerSettings


class CountingWorker(Worker):
    """A worker that counts the passes of its claim loop."""

    passes = 0

    def _claim(self) -> list[Claim]:
        self.passes += 1
        return super()._claim()


def test_a_full_worker_sleeps_until_a_slot_frees(tmp_path: Path) -> None:
    app = cairn.App(f"sqlite:///{tmp_path / 'cairn.db'}")
    release = threading.Event()

    @app.step()
    def hold(seconds: float) -> str:
        release.wait(seconds)
        return "held"

    @app.workflow(name="holding")
    def holding(ctx: cairn.Context, seconds: float) -> str:
        return hold(seconds)

    try:
        first = app.start(holding, 10.0)
        worker = CountingWorker(app.runtime, WorkerSettings(concurrency=1, poll_interval=0.01))
        thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
        thread.start()
        try:
            deadline = time.monotonic() + 5
            while worker.claimed == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert worker.claimed == 1
            second = app.start(holding, 0.0)  # waits for the only slot
            passes = worker.passes
            time.sleep(0.5)  # 50 poll intervals
            assert worker.passes - passes <= 1  # asleep, not polling
            release.set()  # the first run ends: its slot frees and the second is claimed at once
            assert first.result(timeout=5) == "held"
            assert second.result(timeout=5) == "held"
        finally:
            worker.stop()
            thread.join(timeout=10)
    finally:
        app.close()
