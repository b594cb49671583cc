"""Three worker processes share one SQLite file: 200 short runs, each step
executed exactly once, no run ever handled by two processes, then a graceful
SIGTERM drain of every worker."""

from __future__ import annotations

import itertools
import signal
import time
from collections import Counter, defaultdict

import pytest

from cairn import EventType, RunStatus
from tests.acceptance.apps import expected_short
from tests.acceptance.harness import Cluster, audit_history, by_key, format_history, journal, wait_until

pytestmark = pytest.mark.slow

RUNS = 200
STEPS = 3
PAUSE = 0.002
WORKERS = 3
CONCURRENCY = 2
#: generous: no process dies here, so no lease may expire under the load of the test
LEASE = 10.0


@pytest.mark.timeout(180)
def test_three_workers_two_hundred_runs_exactly_once(cluster: Cluster) -> None:
    app = cluster.app(lease_seconds=LEASE)
    workers = [cluster.spawn(f"mp-w{i}", concurrency=CONCURRENCY, lease=LEASE) for i in range(WORKERS)]
    for w in workers:
        wait_until(lambda w=w: "starting" in w.log_text(), 15, f"worker {w.worker_id} to start")
    started = time.monotonic()
    run_ids = [f"mp-{k:03d}" for k in range(RUNS)]
    for k, run_id in enumerate(run_ids):
        app.start("short", k, PAUSE, run_id=run_id)

    def statuses() -> Counter[str]:
        return Counter(r.status.value for r in app.list_runs(limit=RUNS + 10))

    wait_until(lambda: statuses()["completed"] == RUNS, 90, lambda: f"all runs to complete: {statuses()}")
    elapsed = time.monotonic() - started
    print(f"{RUNS} runs x {STEPS} steps on {WORKERS}x{CONCURRENCY} slots: {elapsed:.1f}s")

    for k, run_id in enumerate(run_ids):
        assert app.handle(run_id).result(timeout=1) == expected_short(k), f"{run_id}: wrong result"

    effects = cluster.effects()
    begins, ends = by_key(effects, "begin"), by_key(effects, "end")
    expected_keys = {(r, p) for r in run_ids for p in range(STEPS)}
    assert set(ends) == expected_keys, (
        f"steps without an execution: {sorted(expected_keys - set(ends))[:10]}; "
        f"unexpected: {sorted(set(ends) - expected_keys)[:10]}")

    overlapping = []
    for key, records in ends.items():
        for earlier, later in itertools.pairwise(records):
            if later["t0"] < earlier["t1"]:
                overlapping.append((key, earlier["pid"], later["pid"]))
    assert not overlapping, f"executions of one step overlapped in time: {overlapping[:10]}"
    repeated = {key: len(v) for key, v in begins.items() if len(v) != 1}
    repeated.update({key: len(v) for key, v in ends.items() if len(v) != 1})
    assert not repeated, f"steps not executed exactly once: {dict(list(repeated.items())[:10])}"

    pids_per_run: dict[str, set[int]] = defaultdict(set)
    for (run_id, _), records in begins.items():
        pids_per_run[run_id].update(e["pid"] for e in records)
    shared = {r: sorted(p) for r, p in pids_per_run.items() if len(p) > 1}
    assert not shared, f"runs executed by more than one process: {dict(list(shared.items())[:10])}"
    used = Counter(next(iter(p)) for p in pids_per_run.values())
    idle = [w.worker_id for w in workers if used[w.pid] == 0]
    assert not idle, f"workers that executed nothing (no contention was tested): {idle}; runs per pid {used}"

    pid_of = {w.worker_id: w.pid for w in workers}
    for run_id in run_ids:
        history = app.history(run_id)
        problems = audit_history(history)
        assert not problems, f"{run_id}: {problems}\n{format_history(history)}"
        kinds = Counter(e.event for e in history)
        assert kinds[EventType.LEASE_CLAIMED] == 1, f"{run_id} claimed {kinds[EventType.LEASE_CLAIMED]} times"
        assert kinds[EventType.LEASE_TAKEN_OVER] == 0, f"{run_id} was taken over:\n{format_history(history)}"
        writers = {e.worker for e in history if e.worker}
        assert len(writers) == 1, f"{run_id} written by {writers}"
        (writer,) = writers
        assert pids_per_run[run_id] == {pid_of[writer]}, (
            f"{run_id} journaled by {writer} (pid {pid_of[writer]}) but executed by {pids_per_run[run_id]}")
        assert sorted(journal(history)) == list(range(STEPS)), f"{run_id}: journal {format_history(history)}"

    for w in workers:
        w.send(signal.SIGTERM)
    for w in workers:
        code = w.wait_exit(5)
        assert code == 0, f"{w.worker_id} exited {code} after SIGTERM; log:\n{w.log_tail()}"
    assert all(r.status is RunStatus.COMPLETED for r in app.list_runs(limit=RUNS + 10))
