"""The worker's claim loop on a real SQLite store: a worker whose every slot
is busy does not wake up to poll (each wake-up takes the GIL from the threads
executing steps), and still claims at once when a slot frees.

Nothing here depends on a quiet machine: the test waits for conditions with
generous deadlines, and tells sleeping from polling by a margin a loaded
machine cannot close (a polling worker makes ~100 passes in the window, a
sleeping one none beyond a late wake-up)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import cairn
from cairn.store.records import Claim
from cairn.worker.worker import Worker, WorkerSettings
from tests.timing import SLACK

#: seconds the test watches a full worker for claim passes (poll_interval 0.01: 100 polls)
WINDOW = 1.0
#: passes allowed in the window all the same: a wake-up the store pushed before the window may
#: reach the loop inside it, however long the test waited (the machine decides)
LATE_WAKEUPS = 2


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """``timeout`` is for a quiet machine; a loaded one gets ``SLACK`` times it."""
    deadline = time.monotonic() + timeout * SLACK
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout * SLACK:.0f}s waiting for {what}"
        time.sleep(0.01)


def settle(worker: CountingWorker, quiet: float = 0.3, timeout: float = 10.0) -> int:
    """The worker's pass count once it stopped changing for ``quiet``
    seconds (or after ``timeout``: a polling worker never settles, and the
    window that follows shows it)."""
    deadline = time.monotonic() + timeout
    passes, since = worker.passes, time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < quiet:
        time.sleep(0.02)
        if worker.passes != passes:
            passes, since = worker.passes, time.monotonic()
    return worker.passes


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
        first = app.start(holding, 120.0)  # held until the test releases it
        worker = CountingWorker(app.runtime, WorkerSettings(concurrency=1, poll_interval=0.01))
        thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
        thread.start()
        try:
            wait_for(lambda: worker.claimed == 1, 30, "the worker to claim the first run")
            second = app.start(holding, 0.0)  # waits for the only slot
            # The claim pass after the first claim, and the wake-ups the store pushes (the new run,
            # the listener's first connection), may come late on a loaded machine: each costs one
            # pass. Wait until the loop has been still for a while, then watch it.
            passes = settle(worker)
            time.sleep(WINDOW)  # WINDOW / poll_interval = 100 poll intervals
            assert worker.passes - passes <= LATE_WAKEUPS, (  # asleep, not polling
                f"{worker.passes - passes} claim passes in {WINDOW}s with every slot busy")
            release.set()  # the first run ends: its slot frees and the second is claimed at once
            assert first.result(timeout=30) == "held"
            assert second.result(timeout=30) == "held"
        finally:
            worker.stop()
            thread.join(timeout=10)
    finally:
        app.close()
