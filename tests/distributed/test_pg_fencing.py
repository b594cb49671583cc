"""Fencing on PostgreSQL: a frozen worker's writes are refused once its run was taken over.

The first worker executes a run of three bank transfers and is frozen with a
real SIGSTOP inside the second transfer's body (its intent is durable; the
bank has not been called), for longer than its lease. A second worker takes
the run over, reconciles the uncertain transfer (the bank has no trace of it,
so it sends it itself, with the same key) and finishes the run. Then SIGCONT:
the first worker wakes up in the middle of its tool body, calls the bank (which
answers with the second worker's transfer: same key) and tries to record the
result under its old epoch. The fence refuses it: nothing the first worker
wrote after the takeover is in the history, and the bank moved the money once.
"""

from __future__ import annotations

import signal
import time

import pytest

from cairn.store.records import EventType, RunStatus
from tests.acceptance.harness import WorkerProcess, format_history, process_state, wait_until
from tests.distributed.bank_app import SLOW_ENV, WORKFLOW
from tests.distributed.cluster import DistCluster, application_name, verify_runs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LEASE = 1.0
STEPS = 3
SLOW_POSITION = 1
#: how long the first worker's body at SLOW_POSITION sleeps before it calls the bank; the
#: freeze starts inside it and outlasts the lease, and the body is still asleep at SIGCONT
SLOW_SECONDS = 6.0


def stop_outside_transaction(dist: DistCluster, worker: WorkerProcess, attempts: int = 25) -> float:
    """SIGSTOP ``worker`` at a moment none of its connections is inside a
    transaction (a frozen transaction would hold the run's row lock, and the
    takeover would wait for it: a property of row locks, not what fencing is
    about). Returns the time of the SIGSTOP that stuck."""
    name = application_name(worker.worker_id)
    for _ in range(attempts):
        stopped_at = worker.send(signal.SIGSTOP)
        wait_until(lambda: process_state(worker.pid) == "T", 5, f"pid {worker.pid} to stop")
        sessions = dist.observer.sessions(name)
        assert sessions, f"no connection of {worker.worker_id} is visible in pg_stat_activity"
        if all(state == "idle" for _, state in sessions):
            return stopped_at
        worker.send(signal.SIGCONT)
        time.sleep(0.01)
    raise AssertionError(f"worker {worker.worker_id} was inside a transaction at each of {attempts} stops")


def test_frozen_worker_is_fenced_out_after_takeover(dist: DistCluster) -> None:
    app = dist.app()
    run_id = app.start(WORKFLOW, run_index=7, steps=STEPS, run_id="fenced-7").run_id
    first = dist.spawn("first", lease=LEASE, env={SLOW_ENV: f"{SLOW_POSITION}:{SLOW_SECONDS}"})

    def first_in_slow_body() -> list[dict[str, object]]:
        return [e for e in dist.effects()
                if e["kind"] == "begin" and e["position"] == SLOW_POSITION and e["worker"] == "first"]

    begin = wait_until(first_in_slow_body, 30, "the first worker to enter the slow transfer")[0]
    stopped_at = stop_outside_transaction(dist, first)
    frozen = app.get_run(run_id)
    assert (frozen.owner, frozen.status) == ("first", RunStatus.RUNNING)
    first_epoch = frozen.epoch
    assert begin["epoch"] == first_epoch

    second = dist.spawn("second", lease=LEASE)

    def finished() -> bool:
        return app.get_run(run_id).status.terminal

    wait_until(finished, 60, lambda: f"the second worker to finish the run:\n{dist.describe_workers()}")
    assert process_state(first.pid) == "T", "the first worker must still be frozen"
    took = time.time() - stopped_at
    history = app.history(run_id)
    record = app.get_run(run_id)
    shown = format_history(history)
    assert record.status is RunStatus.COMPLETED, f"{record.status.value}: {record.error}\n{shown}"
    takeovers = [e for e in history if e.event is EventType.LEASE_TAKEN_OVER]
    assert len(takeovers) == 1, shown
    takeover = takeovers[0]
    assert takeover.worker == "second", shown
    assert (takeover.detail or {}).get("from_worker") == "first", shown
    assert takeover.epoch > first_epoch, shown
    lost = history[takeover.seq - 2]
    assert (lost.event, lost.worker, lost.epoch) == (EventType.LEASE_LOST, "first", first_epoch), shown

    # wake the first worker up in the middle of its tool body
    cont_at = first.send(signal.SIGCONT)

    def first_called_the_bank() -> list[dict[str, object]]:
        return [e for e in dist.effects()
                if e["kind"] == "end" and e["position"] == SLOW_POSITION and e["worker"] == "first"]

    end = wait_until(first_called_the_bank, SLOW_SECONDS + 20,
                     lambda: f"the first worker to finish its bank call:\n{first.log_tail()}")[0]
    wait_until(lambda: "its writes are void" in first.log_text(), 20,
               lambda: f"the first worker to be refused by the fence:\n{first.log_tail()}")

    after = app.history(run_id)
    assert after == history, f"entries were written after the run ended:\n{format_history(after)}"
    for event in history:
        if event.worker == "first" and event.event is not EventType.LEASE_LOST:
            assert event.epoch == first_epoch, shown
            assert event.seq < takeover.seq, shown
        if event.seq > takeover.seq:
            assert (event.epoch, event.worker) == (takeover.epoch, "second"), shown
    assert all(e.at < cont_at for e in history), shown
    slow_done = next(e for e in history
                     if e.event is EventType.STEP_COMPLETED and e.position == SLOW_POSITION)
    assert (slow_done.worker, slow_done.epoch) == ("second", takeover.epoch), shown
    # the second worker found no trace of the transfer at the bank and sent it itself (same key)
    settled = [e for e in history if e.event is EventType.OP_RECONCILED and e.position == SLOW_POSITION]
    assert [(e.worker, (e.detail or {}).get("outcome")) for e in settled] == [("second", "not_found")], shown

    # the first worker's late POST moved no money: the bank answered with the second's transfer
    transfers = dist.bank.client().transfers()
    slow_transfer = next(t for t in transfers if t.idempotency_key == end["operation_id"])
    assert end["replayed"] is True
    assert end["transfer_id"] == slow_transfer.id
    assert float(end["sent"]) > cont_at  # type: ignore[arg-type]
    verdict = verify_runs(app, transfers, dist.effects(), {run_id: 7}, STEPS, context=shown)

    dist.terminate_gracefully([first, second])
    print(f"\nfencing on PostgreSQL: first worker frozen {took:.2f}s (lease {LEASE:g}s) inside the transfer "
          f"at position {SLOW_POSITION}; second took over at epoch {takeover.epoch} (first held "
          f"{first_epoch}); "
          f"after SIGCONT the first's POST got the existing transfer and its record was refused; {verdict}")


# -- a worker frozen inside a transaction ---------------------------------------------------------

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
