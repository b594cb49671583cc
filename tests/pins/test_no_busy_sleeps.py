"""A worker's threads never wait for each other in SQLite's busy handler.

SQLite lets one connection write at a time; a connection that finds the
lock taken waits in its busy handler, which sleeps 1, 2, 5, 10... ms between
tries. Inside one worker process the writers are its own threads (step
appends of the runs in its slots, its claim polls, lease renewals), and each
such sleep cost a step twenty times its own time: it was the wall-clock loss
per step that callgrind could not see (issue 8). ``SQLiteStore`` makes its
threads queue on a lock of its own instead (``SQLiteStore._writing``).

Observed from outside: a real worker process draining runs with 4 slots and
a 10 ms poll, under ``strace -f``, must make no sleep of a millisecond or
more (the busy handler sleeps with ``clock_nanosleep``, 1 ms the first time;
everything else in a worker waits on locks and events, i.e. ``futex``).
Without the store's writer lock this drain made hundreds of them.

Sleeps shorter than that are not the busy handler: a reader that finds the
WAL index changing under it (a writer committing while the reader, starved
of CPU, was between two reads of its header) retries and, after a few tries,
yields for a microsecond (``walTryBeginRead``). CI once saw exactly one
sleep at load 10+ when the pin counted calls only; 36 drains here beside four
CPU hogs made one, ``clock_nanosleep(..., {tv_sec=0, tv_nsec=1000})``. So
each sleep's requested duration is read from the trace, and a failure
prints the sleeps.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.acceptance.harness import REPO_ROOT
from tests.pins.busy_worker import build
from tests.pins.test_effect_barrier import SKIP

RUNS = 300

#: SQLite's default busy handler sleeps 1, 2, 5, 10... ms between tries (``sqliteDefaultBusyCallback``)
BUSY_HANDLER_FIRST_SLEEP_NS = 1_000_000
#: a traced sleep's requested duration: ``{tv_sec=0, tv_nsec=1000000}``
DURATION = re.compile(r"\{tv_sec=(\d+), tv_nsec=(\d+)\}")


def requested_ns(line: str) -> int:
    """The duration a traced ``clock_nanosleep``/``nanosleep`` call asked for."""
    match = DURATION.search(line)
    assert match is not None, f"strace line without a duration: {line!r}"
    return int(match[1]) * 1_000_000_000 + int(match[2])


@pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
@pytest.mark.slow
def test_a_draining_worker_never_sleeps_in_the_busy_handler(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'busy.db'}"
    app = build(db)
    handles = [app.start("three") for _ in range(RUNS)]
    app.close()
    trace = tmp_path / "sleeps.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), str(REPO_ROOT)])}
    worker = subprocess.run(
        ["strace", "-f", "-qq", "-o", str(trace), "-e", "trace=clock_nanosleep,nanosleep",
         sys.executable, "-m", "tests.pins.busy_worker", db],
        cwd=REPO_ROOT, env=env, check=True, timeout=300, capture_output=True,
    )
    calls = [line for line in trace.read_text().splitlines() if "nanosleep(" in line]
    busy = [line for line in calls if requested_ns(line) >= BUSY_HANDLER_FIRST_SLEEP_NS]
    assert not busy, (f"the worker slept {len(busy)} times in SQLite's busy handler, e.g. {busy[:5]}; "
                      f"worker stderr: {worker.stderr.decode(errors='replace')[-2000:]}")
    app = build(db)
    try:
        assert all(app.handle(h.run_id).result(timeout=5) == 3 for h in handles), "runs left undone"
    finally:
        app.close()
