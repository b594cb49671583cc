"""Issue 9 item 9: a store outage is not the run's fault.

A real failure, not an injected exception: the database lives on a small
tmpfs, which is filled up while a worker executes runs whose steps record
large results. Recording fails with "database or disk is full" while small
writes (claims, releases) may still fit. The runs used to be taken over
again and again and quarantined, and stayed so after space was freed, while
the worker logged a traceback every poll. Now the worker gives back what it
cannot record, backs off with one-line warnings, and once space is freed
every run completes, none quarantined, none counted as a crash.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pytest

import cairn
from cairn.engine.executor import PARK_CAP, PARK_FIRST, STORE_FAILURE, give_back, store_failures
from cairn.engine.signals import Suspend
from cairn.store.records import EventType, HistoryEvent, RunFilter, RunStatus
from cairn.worker.worker import Worker, WorkerSettings

STEPS = 6
RUNS = 4
RESULT = 120_000  # bytes per step result: recorded inline, so each record needs new pages


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 24 MiB tmpfs of the test's own (the test runs as root, as the CI does)."""
    mount = tmp_path / "fs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill up (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(mount: Path) -> Path:
    """Fill the file system to the last byte; the filler file, to delete later.

    Unbuffered: a buffered file keeps what the write that hit ENOSPC could not
    write, and its close writes it again: ENOSPC once more, out of the block
    that expected the first one (seen in CI when the last write was partial)."""
    filler = mount / "filler"
    chunk = b"\0" * (1 << 16)
    def write_until_full(fh: BinaryIO) -> None:  # a raw file: each write is one system call
        while True:
            fh.write(chunk)
            fh.flush()

    with open(filler, "wb", buffering=0) as fh, pytest.raises(OSError, match="No space left") as full:
        write_until_full(fh)
    assert full.value.errno == errno.ENOSPC
    with contextlib.suppress(OSError), open(filler, "ab", buffering=0) as fh:
        while True:  # the last few bytes too
            fh.write(b"\0")
            fh.flush()
    assert shutil.disk_usage(mount).free < (1 << 16)
    return filler


@pytest.mark.slow
def test_runs_survive_a_full_disk_and_finish_once_space_is_freed(
    tiny_fs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="cairn")
    app = cairn.App(f"sqlite:///{tiny_fs / 'cairn.db'}", lease_seconds=1.0, max_recoveries=0)
    started = threading.Event()

    @app.step()
    def chunk(i: int) -> str:
        started.set()
        time.sleep(0.05)
        return f"{i}" * RESULT

    @app.workflow(name="writer")
    def writer(ctx: cairn.Context) -> int:
        return sum(len(chunk(i)) for i in range(STEPS))

    handles = [app.start(writer, run_id=f"run-{n}") for n in range(RUNS)]
    worker = Worker(app.runtime, WorkerSettings(concurrency=RUNS, lease_seconds=1.0, poll_interval=0.05))
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        assert started.wait(10)
        filler = fill(tiny_fs)
        time.sleep(6)  # six leases: long enough for every lease to expire several times
        outage_logs = list(caplog.records)
        filler.unlink()  # space is back
        for handle in handles:
            assert handle.result(timeout=60) == STEPS * RESULT
    finally:
        worker.stop()
        thread.join(timeout=30)
    runs = app.store.list_runs(RunFilter())
    assert {r.status for r in runs} == {RunStatus.COMPLETED}
    assert [r.recoveries for r in runs] == [0] * RUNS  # an outage is not a crash of their worker
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged for a store failure"
    failures = [r for r in outage_logs if "full" in r.getMessage()]
    assert failures, "the disk never filled up: the test proved nothing"
    for run in runs:  # one line per attempt to give a run back, the attempts backing off
        attempts = [r for r in failures if "cannot give the run back" in r.getMessage() and run.run_id in
                    r.getMessage()]
        assert len(attempts) <= 10, f"{len(attempts)} attempts to give {run.run_id} back in 6 s: no backoff"
    app.close()


def test_each_store_failure_without_progress_parks_the_run_longer() -> None:
    """A store that takes small writes but not a step's record (a nearly full
    disk) must not have that step executed again and again: each give-back
    since the run last recorded a step parks it twice as long."""

    def entry(seq: int, event: EventType, reason: str | None = None) -> HistoryEvent:
        return HistoryEvent(run_id="r", seq=seq, event=event, at=0.0, epoch=1,
                            detail=None if reason is None else {"reason": reason})

    parked = [entry(1, EventType.STEP_COMPLETED), entry(2, EventType.RUN_SUSPENDED, STORE_FAILURE),
              entry(3, EventType.RUN_WOKEN), entry(4, EventType.RUN_SUSPENDED, STORE_FAILURE)]
    assert store_failures(parked) == 2
    assert store_failures([*parked, entry(5, EventType.STEP_COMPLETED)]) == 0  # progress resets it
    assert store_failures([entry(1, EventType.RUN_SUSPENDED, "timer")]) == 0

    class Parking:
        run_id = "r"
        stop_reason: str | None = None
        wake_at: float | None = None

        def suspend(self, signal: Suspend) -> None:
            self.wake_at = signal.wake_at

    for failures, park in ((0, PARK_FIRST), (1, 2 * PARK_FIRST), (3, 8 * PARK_FIRST), (30, PARK_CAP)):
        execution = Parking()
        before = time.time()
        wake_at = give_back(execution, failures)  # type: ignore[arg-type]
        assert wake_at == execution.wake_at
        assert wake_at is not None
        assert before + park <= wake_at <= time.time() + park
