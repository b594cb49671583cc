"""A worker's threads never wait for each other in SQLite's busy handler.

SQLite lets one connection write at a time; a connection that finds the
lock taken waits in its busy handler, which sleeps 1, 2, 5, 10... ms between
tries. Inside one worker process the writers are its own threads (step
appends of the runs in its slots, its claim polls, lease renewals), and each
such sleep cost a step twenty times its own time: it was the wall-clock loss
per step that callgrind could not see (issue 8). ``SQLiteStore`` makes its
threads queue on a lock of its own instead (``SQLiteStore._writing``).

Observed from outside: a real worker process draining runs with 4 slots and
a 10 ms poll, under ``strace -f``, must make no sleeping system call at all
(the busy handler sleeps with ``clock_nanosleep``; everything else in a
worker waits on locks and events, i.e. ``futex``). Without the store's
writer lock this drain made hundreds of them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.acceptance.harness import REPO_ROOT
from tests.pins.busy_worker import build
from tests.pins.test_effect_barrier import SKIP

RUNS = 300


@pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
@pytest.mark.slow
def test_a_draining_worker_never_sleeps_in_the_busy_handler(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'busy.db'}"
    app = build(db)
    handles = [app.start("three") for _ in range(RUNS)]
    app.close()
    counts = tmp_path / "sleeps.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), str(REPO_ROOT)])}
    subprocess.run(
        ["strace", "-f", "-qq", "-c", "-o", str(counts), "-e", "trace=clock_nanosleep,nanosleep",
         sys.executable, "-m", "tests.pins.busy_worker", db],
        cwd=REPO_ROOT, env=env, check=True, timeout=300, capture_output=True,
    )
    app = build(db)
    try:
        assert all(app.handle(h.run_id).result(timeout=5) == 3 for h in handles), "runs left undone"
    finally:
        app.close()
    lines = [line.split() for line in counts.read_text().splitlines()]
    named = ("clock_nanosleep", "nanosleep")
    sleeps = {line[-1]: int(line[3]) for line in lines if line and line[-1] in named}
    assert sum(sleeps.values()) == 0, f"the worker slept in SQLite's busy handler: {sleeps}"
