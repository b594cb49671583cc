"""Fencing: a worker that froze past its lease cannot write after a takeover.

Written once, run on every backend (``[sqlite]`` and ``[postgres]``: the
``backend`` fixture of the root ``conftest.py``; the crash harness is
``tests/acceptance/harness.py`` for both).

The process tests freeze a real worker (SIGSTOP, at a moment it holds no
write transaction open) past its lease, have a second worker take the run
over and finish it, then wake the first one (SIGCONT):

* inside a long *step*: its step body completes, but its attempt to record
  the result is rejected and nothing it does reaches the history;
* inside a *write tool*'s body (a bank transfer; its intent is durable, the
  bank not called yet): the second worker reconciles the uncertain transfer
  (the bank has no trace of it, so it sends it itself, with the same key) and
  finishes the run; the first wakes up, calls the bank (which answers with the
  second worker's transfer: same key) and is refused by the fence. The bank
  moved the money once.

The in-process tests check the same rule one level down: two ``App``
instances on one database sharing a fake clock, every fenced store write by
the stale holder (every member of ``contract.HOLDER_WRITES``, through the
case table of the store contract's fencing matrix), and the executor's
handling of a takeover that happens while a step body runs.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import cairn
from cairn import EventType, RunStatus
from cairn.engine.executor import execute
from cairn.errors import LeaseLost
from cairn.store.records import HistoryEvent, Payload
from tests.acceptance.apps import SLOW_ENV, expected_fenced
from tests.acceptance.harness import (
    Cluster,
    audit_history,
    by_key,
    format_history,
    journal,
    process_state,
    stop_outside_transaction,
    wait_until,
)
from tests.backends import StoreBackend
from tests.distributed import bank_app
from tests.distributed.cluster import DistCluster, verify_runs
from tests.store.contract.helpers import FENCED_OPS, FakeClock, _fenced_write, held_state

pytestmark = pytest.mark.slow

LEASE = 1.0


@pytest.mark.timeout(120)
def test_frozen_worker_is_fenced_out_after_takeover(cluster: Cluster) -> None:
    app = cluster.app(lease_seconds=LEASE)
    run_id = "fence-1"
    app.start("fenced", 7, run_id=run_id)
    first = cluster.spawn("fence-w1", lease=LEASE, poll_interval=0.2, env={SLOW_ENV: "3.0"})

    def inside_slow_step(pid: int) -> bool:
        return any(e["kind"] == "begin" and e["pid"] == pid and e["position"] == 1 for e in cluster.effects())

    wait_until(lambda: inside_slow_step(first.pid), 15, "the first worker to enter the slow step")
    stopped_at = stop_outside_transaction(first, cluster.backend)
    before_stop = app.history(run_id)
    epoch_before = app.get_run(run_id).epoch
    writers = {e.worker for e in before_stop if e.worker}
    assert writers == {"fence-w1"}, f"writers before the freeze: {writers}\n{format_history(before_stop)}"
    assert journal(before_stop).keys() == {0}, f"not only step 0 recorded:\n{format_history(before_stop)}"

    wait_until(lambda: (app.get_run(run_id).lease_expires_at or 0) < time.time(), LEASE + 5,
               "the frozen worker's lease to expire")
    second = cluster.spawn("fence-w2", lease=LEASE, env={SLOW_ENV: "0"})
    wait_until(lambda: app.get_run(run_id).status is RunStatus.COMPLETED, 15,
               lambda: f"the second worker to finish the run (now {app.get_run(run_id).status})")
    assert first.alive(), "the frozen worker died"
    history_at_resume = app.history(run_id)

    first.send(signal.SIGCONT)

    def late_end() -> dict[str, Any] | None:
        return next((e for e in cluster.effects() if e["kind"] == "end" and e["pid"] == first.pid
                     and e["position"] == 1), None)

    late = wait_until(late_end, 10, "the resumed worker to finish its slow step body")
    rejection = f"lease on run {run_id!r} at epoch {epoch_before} is no longer held"
    wait_until(lambda: rejection in first.log_text(), 10,
               lambda: f"the resumed worker to report its rejected write ({rejection!r}); log:\n"
               f"{first.log_tail()}")

    # the run is done, by the second worker, and nothing of the first came after the freeze
    assert app.handle(run_id).result(timeout=1) == expected_fenced(7)
    history = app.history(run_id)
    shown = format_history(history)
    assert history == history_at_resume, (
        f"the history changed after the frozen worker resumed:\n{shown}")
    assert history[:len(before_stop)] == before_stop, f"pre-freeze entries were rewritten:\n{shown}"
    problems = audit_history(history)
    assert not problems, f"{problems}\n{shown}"

    takeovers = [e for e in history if e.event is EventType.LEASE_TAKEN_OVER]
    assert len(takeovers) == 1, f"expected exactly one takeover:\n{shown}"
    takeover = takeovers[0]
    assert takeover.worker == "fence-w2", f"taken over by {takeover.worker}"
    assert takeover.epoch == epoch_before + 1, f"takeover epoch {takeover.epoch}, held at {epoch_before}"
    assert (takeover.detail or {}).get("from_worker") == "fence-w1", f"takeover detail {takeover.detail}"
    assert takeover.at > stopped_at, "the takeover happened before the freeze"

    after = [e for e in history if e.seq > takeover.seq]
    assert after, "nothing was written after the takeover"
    wrong = [e for e in after if (e.epoch, e.worker) != (takeover.epoch, "fence-w2")]
    assert not wrong, f"entries after the takeover not under (epoch {takeover.epoch}, fence-w2):\n{shown}"

    # lease.lost is written by the taker, naming the old holder: it is not the first worker's write
    by_first = [e for e in history if e.worker == "fence-w1" and e.event is not EventType.LEASE_LOST]
    last_pre_stop = max(e.seq for e in before_stop if e.worker == "fence-w1")
    assert all(e.seq <= last_pre_stop for e in by_first), (
        f"entries by fence-w1 after its last pre-freeze write (seq {last_pre_stop}):\n{shown}")
    assert all(e.at < stopped_at for e in by_first), f"fence-w1 entries stamped after the freeze:\n{shown}"

    recorded = journal(history)
    assert sorted(recorded) == [0, 1, 2], f"journal positions {sorted(recorded)}"
    assert (recorded[1].worker, recorded[1].epoch) == ("fence-w2", takeover.epoch), (
        f"the slow step was recorded by {recorded[1].worker} at epoch {recorded[1].epoch}")
    assert late["t1"] > takeover.at, (
        f"the first worker's slow step ended at {late['t1']:.3f}, before the takeover at {takeover.at:.3f}: "
        "its late completion was not exercised")
    assert recorded[1].at < late["t1"], "the journal entry for the slow step is not the second worker's"

    begins = by_key(cluster.effects(), "begin")
    pids = {position: [e["pid"] for e in begins[(run_id, position)]] for position in range(3)}
    assert pids == {0: [first.pid], 1: [first.pid, second.pid], 2: [second.pid]}, (
        f"pids that began each position: {pids} (first {first.pid}, second {second.pid})")

    for worker in (first, second):
        worker.send(signal.SIGTERM)
    for worker in (first, second):
        code = worker.wait_exit(10)
        assert code == 0, f"{worker.worker_id} exited {code} after SIGTERM; log:\n{worker.log_tail()}"


# -- a worker frozen inside a write tool's body, at the bank ----------------------------------------

TOOL_STEPS = 3
SLOW_POSITION = 1
#: how long the first worker's body at SLOW_POSITION sleeps before it calls the bank; the
#: freeze starts inside it and outlasts the lease, and the body is still asleep at SIGCONT
SLOW_SECONDS = 6.0


@pytest.mark.timeout(300)
def test_frozen_worker_tool_call_is_fenced_out_after_takeover(bank_cluster: DistCluster) -> None:
    dist = bank_cluster
    app = dist.app()
    run_id = app.start(bank_app.WORKFLOW, run_index=7, steps=TOOL_STEPS, run_id="fenced-7").run_id
    first = dist.spawn("first", lease=LEASE, env={bank_app.SLOW_ENV: f"{SLOW_POSITION}:{SLOW_SECONDS}"})

    def first_in_slow_body() -> list[dict[str, object]]:
        return [e for e in dist.effects()
                if e["kind"] == "begin" and e["position"] == SLOW_POSITION and e["worker"] == "first"]

    begin = wait_until(first_in_slow_body, 30, "the first worker to enter the slow transfer")[0]
    stopped_at = stop_outside_transaction(first, dist.backend)
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
    assert float(end["sent"]) > cont_at
    verdict = verify_runs(app, transfers, dist.effects(), {run_id: 7}, TOOL_STEPS, context=shown)

    dist.terminate_gracefully([first, second])
    print(f"\nfencing on {dist.backend.name}: first worker frozen {took:.2f}s (lease {LEASE:g}s) inside the "
          f"transfer at position {SLOW_POSITION}; second took over at epoch {takeover.epoch} (first held "
          f"{first_epoch}); after SIGCONT the first's POST got the existing transfer and its record was "
          f"refused; {verdict}")


# -- in-process: two Apps on one database, one fake clock -----------------------------------------


Apps = tuple[cairn.App, cairn.App, FakeClock]


@pytest.fixture
def two_apps(backend: StoreBackend) -> Iterator[Apps]:
    clock = FakeClock(time.time())
    first = cairn.App(store=backend.open_store(clock), lease_seconds=5.0, max_recoveries=5)
    second = cairn.App(store=backend.open_store(clock), lease_seconds=5.0, max_recoveries=5)
    try:
        yield first, second, clock
    finally:
        first.close()
        second.close()


def register(app: cairn.App, during_middle: Callable[[], None]) -> None:
    @app.step()
    def head(x: int) -> int:
        return x

    @app.step()
    def middle(x: int) -> int:
        during_middle()
        return x * 10

    @app.step()
    def tail(x: int) -> int:
        return x + 1

    @app.workflow(name="three")
    def three(ctx: cairn.Context, x: int) -> int:
        return head(x) + middle(x) + tail(x)


@pytest.mark.parametrize("op", FENCED_OPS)
def test_stale_holder_store_writes_are_all_rejected(two_apps: Apps, op: str) -> None:
    """Every holder write of the contract (``contract.HOLDER_WRITES``), each
    case of the fencing matrix's table (``HOLDER_CASES``: a holder write
    without a case fails here as it does there), by the holder a second App
    took the run over from, through the first App's own store: its view of
    the run (on SQLite, its cache of the run's last entry) is the one from
    before the takeover. Each is tried at the seq it would write next, which
    the takeover's entries took (the cached path), and at the next free one."""
    app_a, app_b, clock = two_apps
    register(app_a, lambda: None)
    register(app_b, lambda: None)
    run_id = "fence-store"
    app_a.start("three", 4, run_id=run_id)
    claim_a = app_a.store.claim_run(run_id, "A", 5.0, 5)
    assert claim_a is not None
    assert claim_a.run.epoch == 1
    clock.advance(6.0)
    claim_b = app_b.store.claim_run(run_id, "B", 5.0, 5)
    assert claim_b is not None, "the second app could not take over an expired lease"
    assert claim_b.run.epoch == 2

    before = held_state(app_a.store, run_id)
    history = app_a.history(run_id)
    free_seq = history[-1].seq + 1
    assert claim_a.next_seq < free_seq
    for seq in (claim_a.next_seq, free_seq):
        with pytest.raises(LeaseLost) as info:
            _fenced_write(op, app_a.store, clock, run_id, claim_a.run.epoch, seq)
        assert (info.value.run_id, info.value.epoch) == (run_id, claim_a.run.epoch)
        assert held_state(app_a.store, run_id) == before, f"a stale {op} at seq {seq} changed the run"
    assert app_a.store.renew_leases("A", {run_id: 1}, 5.0) == {run_id}
    assert held_state(app_a.store, run_id) == before, "a stale renewal extended the lease"

    # the new holder writes at the same seq without trouble
    app_b.store.append(run_id, 2, (HistoryEvent(
        run_id=run_id, seq=free_seq, event=EventType.STEP_COMPLETED, at=clock(), epoch=2, worker="B",
        position=0, step_kind="step", name="head", attempt=1, payload=Payload(data=b"4")),))
    assert app_b.history(run_id)[-1].worker == "B"


def test_takeover_during_a_step_voids_the_stale_result(two_apps: Apps) -> None:
    app_a, app_b, clock = two_apps
    run_id = "fence-exec"
    taken: list[Any] = []

    def take_over() -> None:  # runs inside A's step body: A freezes, its lease expires, B claims
        clock.advance(6.0)
        taken.append(app_b.store.claim_run(run_id, "B", 5.0, 5))

    register(app_a, take_over)
    register(app_b, lambda: None)
    app_a.start("three", 4, run_id=run_id)
    claim_a = app_a.store.claim_run(run_id, "A", 5.0, 5)
    assert claim_a is not None

    outcome_a = execute(app_a.runtime, claim_a, "A")
    assert outcome_a.status == "lost", f"stale holder's outcome is {outcome_a}, expected lost"
    assert taken[0] is not None, "B could not take over"
    history = app_a.history(run_id)
    assert [e.position for e in history if e.event is EventType.STEP_COMPLETED] == [0], (
        f"the stale result of the middle step was recorded:\n{format_history(history)}")

    outcome_b = execute(app_b.runtime, taken[0], "B")
    assert outcome_b.status == "completed", outcome_b
    assert outcome_b.result == 4 + 40 + 5
    history = app_b.history(run_id)
    problems = audit_history(history)
    assert not problems, f"{problems}\n{format_history(history)}"
    recorded = journal(history)
    assert [(p, e.worker, e.epoch) for p, e in sorted(recorded.items())] == [
        (0, "A", 1), (1, "B", 2), (2, "B", 2)], format_history(history)
