"""Fencing on PostgreSQL: a worker frozen *inside* a transaction does not wedge runs.

The frozen-worker fencing tests (a worker frozen outside a transaction, in a
step or a write tool's body, refused by the fence after a takeover) are
written once for every backend in ``tests/acceptance/test_fencing.py``. This
one is PostgreSQL's own: a SQLite writer frozen inside its transaction holds
the database's one write lock, and nobody can write until it wakes (SQLite's
documented model), while on PostgreSQL the other runs must go on.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.acceptance.harness import WorkerProcess, process_state, wait_until
from tests.distributed.bank_app import WORKFLOW
from tests.distributed.cluster import DistCluster, application_name, verify_runs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LEASE = 1.0
UNFINISHED = "SELECT run_id, status, owner, epoch FROM runs WHERE status <> 'completed' ORDER BY run_id"
WEDGE_RUNS = 12
WEDGE_STEPS = 20
#: how long the rescuer gets to finish every run once the frozen worker's leases expired
WEDGE_PATIENCE = 30.0


def locked_runs(dist: DistCluster) -> list[str]:
    """The runs whose rows some transaction holds locked right now."""
    rows = dist.observer.query(
        "SELECT run_id FROM runs WHERE run_id NOT IN (SELECT run_id FROM runs FOR UPDATE SKIP LOCKED) "
        "ORDER BY run_id")
    return [str(row[0]) for row in rows or []]


def stop_inside_transaction(
    dist: DistCluster, worker: WorkerProcess, attempts: int = 1000
) -> tuple[float, str, list[str]]:
    """SIGSTOP ``worker`` at a moment one of its connections is inside a
    transaction that holds run rows locked (``idle in transaction``: the
    server waits for the frozen client's next command). Returns the time of
    that stop, the statement the transaction last ran and the locked runs."""
    name = application_name(worker.worker_id)
    for _ in range(attempts):
        stopped_at = worker.send(signal.SIGSTOP)
        wait_until(lambda: process_state(worker.pid) == "T", 5, f"pid {worker.pid} to stop")
        rows = dist.observer.query(
            "SELECT query FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s "
            "AND state LIKE 'idle in transaction%%'", (name,))
        locked = locked_runs(dist) if rows else []
        if rows and locked:
            return stopped_at, " ".join(str(rows[0][0]).split()), locked
        worker.send(signal.SIGCONT)
        time.sleep(0.003)
    raise AssertionError(f"never caught {worker.worker_id} inside a transaction holding locks "
                         f"in {attempts} stops")


@pytest.mark.bank(delay_ms=5)
def test_worker_frozen_inside_a_transaction_does_not_wedge_runs(dist: DistCluster) -> None:
    """A worker can freeze at any instant (SIGSTOP, a stalled VM, a network
    partition), including between two statements of one of its transactions:
    a claim, a lease renewal, the end of a run. Its leases expire like any
    other; another worker must then be able to take the runs over. Here the
    frozen worker's open transaction keeps the run rows it locked, so the
    rescuer skips them (``FOR UPDATE SKIP LOCKED``) for as long as the freeze
    lasts, leases or not."""
    app = dist.app(lease_seconds=LEASE)
    runs = {app.start(WORKFLOW, run_index=i, steps=WEDGE_STEPS, run_id=f"wedge-{i:02d}").run_id: i
            for i in range(WEDGE_RUNS)}
    frozen = dist.spawn("frozen", concurrency=4, lease=LEASE)
    wait_until(lambda: dist.observer.query("SELECT 1 FROM runs WHERE owner = 'frozen'"), 30,
               "the first worker to claim runs")
    stopped_at, statement, locked = stop_inside_transaction(dist, frozen)
    rescuer = dist.spawn("rescuer", concurrency=4, lease=LEASE)
    try:
        def all_completed() -> bool:
            counts = dist.observer.statuses()
            return counts is not None and counts["completed"] == WEDGE_RUNS

        wait_until(all_completed, LEASE + WEDGE_PATIENCE, lambda: (
            f"the rescuer to finish every run while the first worker is frozen (for "
            f"{time.time() - stopped_at:.1f}s, lease {LEASE:g}s) inside a transaction whose last statement "
            f"was {statement[:120]!r}; rows it locks: {locked}; runs now: "
            f"{dist.observer.query(UNFINISHED)}"
        ), interval=0.2)
    finally:
        frozen.send(signal.SIGCONT)
    assert process_state(rescuer.pid) != "T"
    verdict = verify_runs(app, dist.bank.client().transfers(), dist.effects(), runs, WEDGE_STEPS)
    dist.terminate_gracefully([frozen, rescuer])
    print(f"\nfrozen inside {statement[:80]!r}: the rescuer finished every run; {verdict}")
