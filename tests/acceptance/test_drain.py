"""SIGTERM drains a worker: the step in progress finishes and is recorded, the
run is given back (``pending``, ``run.released``), the process exits 0, and a
new worker continues at once without re-running anything recorded."""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import cairn.worker.worker as worker_module
from cairn import EventType, RunStatus
from tests.acceptance.apps import build_app, expected_fifty
from tests.acceptance.harness import (
    Cluster,
    audit_history,
    by_key,
    can_see_syscalls,
    format_history,
    journal,
    read_effects,
    sleeping_in_syscall,
    thread_syscalls,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

STEPS = 20
PAUSE = 0.15
#: long, so that a continuation which had to wait for lease expiry would show
LEASE = 15.0


# On PostgreSQL this found a bug (about 1 run in 6): Worker.run stopped LISTEN (joining a thread that
# waits up to 0.5 s for a notification) *before* flagging the drain, so steps kept starting after SIGTERM.
@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
def test_sigterm_finishes_current_step_releases_run_and_exits_zero(cluster: Cluster) -> None:
    app = cluster.app(lease_seconds=LEASE)
    run_id = "drain-1"
    app.start("fifty", STEPS, PAUSE, run_id=run_id)
    first = cluster.spawn("drain-w1", lease=LEASE)

    def begun(pid: int, position: int) -> bool:
        return any(e["kind"] == "begin" and e["pid"] == pid and e["position"] >= position
                   for e in cluster.effects())

    wait_until(lambda: begun(first.pid, 3), 15, "the first worker to begin step 3")
    term_at = first.send(signal.SIGTERM)
    code = first.wait_exit(10)
    assert code == 0, f"draining worker exited {code}, expected 0; log:\n{first.log_tail()}"

    record = app.get_run(run_id)
    history = app.history(run_id)
    assert record.status is RunStatus.PENDING, (
        f"drained run is {record.status.value}, expected pending\n{format_history(history)}")
    assert record.owner is None, f"drained run still owned by {record.owner}"
    assert history[-1].event is EventType.RUN_RELEASED, (
        f"last entry after the drain is {history[-1].event.value}, expected run.released\n"
        f"{format_history(history)}")
    assert history[-1].worker == "drain-w1", f"run.released written by {history[-1].worker}"

    effects = cluster.effects()
    first_begins = sorted((e for e in effects if e["kind"] == "begin" and e["pid"] == first.pid),
                          key=lambda e: e["t0"])
    in_progress = max(e["position"] for e in first_begins if e["t0"] < term_at)
    late = [e for e in first_begins if e["t0"] > term_at]
    assert not late, f"draining worker began new steps after SIGTERM: {late}"
    recorded = journal(history)
    begun_positions = [e["position"] for e in first_begins]
    assert sorted(recorded) == sorted(begun_positions), (
        f"draining worker began positions {begun_positions} but the journal records {sorted(recorded)}: "
        "every step it began must be finished and recorded before it releases the run")
    assert in_progress in recorded, f"step {in_progress}, in progress at SIGTERM, was not recorded"
    assert all(e.worker == "drain-w1" for e in recorded.values())
    last_step_seq = max(e.seq for e in recorded.values())
    assert history[-1].seq == last_step_seq + 1, (
        f"run.released is not right after the last recorded step\n{format_history(history)}")

    released_at = history[-1].at
    second = cluster.spawn("drain-w2", lease=LEASE)
    wait_until(lambda: app.get_run(run_id).status is RunStatus.COMPLETED, LEASE - 3,
               lambda: f"the second worker to finish the released run (now {app.get_run(run_id).status})")
    assert app.handle(run_id).result(timeout=1) == expected_fifty(STEPS)

    history = app.history(run_id)
    problems = audit_history(history)
    assert not problems, f"history breaks the fencing rules: {problems}\n{format_history(history)}"
    kinds = [e.event for e in history]
    for kind in (EventType.LEASE_LOST, EventType.LEASE_TAKEN_OVER):
        assert kind not in kinds, (
            f"a released run must be claimed normally, not taken over\n{format_history(history)}")
    claim = next(e for e in history if e.event is EventType.LEASE_CLAIMED and e.worker == "drain-w2")
    assert claim.at - released_at < LEASE / 2, (
        f"second worker claimed {claim.at - released_at:.1f}s after the release; it should not wait "
        f"for a lease ({LEASE}s) to expire")

    effects = cluster.effects()
    begins, ends = by_key(effects, "begin"), by_key(effects, "end")
    for position in range(STEPS):
        key = (run_id, position)
        counts = (len(begins.get(key, [])), len(ends.get(key, [])))
        assert counts == (1, 1), (
            f"position {position} began {counts[0]} and ended {counts[1]} time(s); a drain must not "
            "cause re-execution")
    for position in recorded:
        assert begins[(run_id, position)][0]["pid"] == first.pid, (
            f"position {position}, recorded by the drained worker, was run again by another process")

    second.send(signal.SIGTERM)
    assert second.wait_exit(10) == 0, f"idle worker did not exit 0 on SIGTERM; log:\n{second.log_tail()}"


def test_sigterm_releases_every_run_in_flight(cluster: Cluster) -> None:
    """A worker holding three runs at once gives all three back, untouched
    runs stay pending, and the next worker re-runs nothing."""
    app = cluster.app(lease_seconds=LEASE)
    run_ids = [f"drain-many-{i}" for i in range(4)]
    first = cluster.spawn("drain-many-w1", concurrency=3, lease=LEASE)
    wait_until(lambda: "starting" in first.log_text(), 15, "the first worker to start")
    for run_id in run_ids:
        app.start("fifty", 12, PAUSE, run_id=run_id)

    def running_runs() -> set[str]:
        return {e["run_id"] for e in cluster.effects() if e["kind"] == "begin" and e["position"] >= 1}

    held = wait_until(lambda: running_runs() if len(running_runs()) == 3 else None, 15,
                      lambda: f"three runs past their first step (now {sorted(running_runs())})")
    first.send(signal.SIGTERM)
    assert first.wait_exit(10) == 0, f"draining worker did not exit 0; log:\n{first.log_tail()}"

    for run_id in run_ids:
        record = app.get_run(run_id)
        history = app.history(run_id)
        assert record.status is RunStatus.PENDING, (
            f"{run_id} is {record.status.value} after the drain\n{format_history(history)}")
        if run_id in held:
            assert history[-1].event is EventType.RUN_RELEASED, f"{run_id}:\n{format_history(history)}"
        else:
            assert [e.event for e in history] == [EventType.RUN_CREATED], (
                f"{run_id} was never begun yet has history:\n{format_history(history)}")

    second = cluster.spawn("drain-many-w2", concurrency=3, lease=LEASE)
    wait_until(lambda: all(app.get_run(r).status is RunStatus.COMPLETED for r in run_ids), 30,
               "the second worker to finish every run")
    begins = by_key(cluster.effects(), "begin")
    repeated = {key: len(v) for key, v in begins.items() if len(v) != 1}
    assert not repeated, f"steps executed more than once across a drain: {repeated}"
    for run_id in run_ids:
        assert app.handle(run_id).result(timeout=1) == expected_fifty(12)
        problems = audit_history(app.history(run_id))
        assert not problems, f"{run_id}: {problems}"
    second.send(signal.SIGTERM)
    assert second.wait_exit(10) == 0


# SQLite only: the test makes the claim wait by holding SQLite's database write lock itself, and
# recognises the wait as the worker sleeping in SQLite's busy handler
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_sigterm_during_a_claim_gives_that_run_back(cluster: Cluster) -> None:
    """Real process, real SIGTERM: the signal arrives while the worker waits
    for the database write lock inside ``claim_runs`` (the test holds the lock),
    so the claim completes just after the signal. The run it claimed must be
    given back (released) at once, not executed to its end by a draining worker."""
    if not can_see_syscalls():
        pytest.skip("needs /proc/<pid>/task/<pid>/syscall on Linux x86_64 or aarch64")
    app = cluster.app(lease_seconds=LEASE)
    worker = cluster.spawn("claim-race-w", lease=LEASE, poll_interval=0.5)
    # warm up: the worker's pool thread exists and is idle, as in any worker that has done some work
    app.start("fifty", 2, 0.0, run_id="claim-race-warm")
    wait_until(lambda: app.get_run("claim-race-warm").status is RunStatus.COMPLETED, 15, "the warm-up run")

    steps = 10
    lock = sqlite3.connect(cluster.db_path, isolation_level=None, timeout=10)
    try:
        for attempt in range(5):
            run_id = f"claim-race-{attempt}"
            app.start("fifty", steps, 0.05, run_id=run_id)
            lock.execute("BEGIN IMMEDIATE")  # every other writer now waits in its busy handler
            if app.get_run(run_id).status is RunStatus.PENDING:
                break
            lock.execute("ROLLBACK")  # the worker claimed it in the instant before the lock: again,
            # once that run is done: until then the worker's one slot is taken and it claims nothing
            # (seen at load ~17: the next attempt waited in vain for a claim, the worker's executor
            # thread was the one waiting for the lock)
            wait_until(lambda r=run_id: app.get_run(r).status is RunStatus.COMPLETED, 15,
                       f"{run_id}, claimed before the lock, to complete")
        else:
            raise AssertionError("the worker always claimed the run before the test could take the lock")
        # 20 s, not 10: once under `-n 2` (CI) no sleep was seen in 10 s, cause not
        # established; the message now names every thread's system call for next time
        wait_until(lambda: sleeping_in_syscall(worker.pid), 20,
                   lambda: f"the worker to wait for the write lock inside claim_runs (its threads: "
                           f"{thread_syscalls(worker.pid)}; log:\n{worker.log_tail()})")
        worker.send(signal.SIGTERM)
        lock.execute("ROLLBACK")
    finally:
        lock.close()

    code = worker.wait_exit(30)
    assert code == 0, f"worker exited {code}; log:\n{worker.log_tail()}"
    record = app.get_run(run_id)
    history = app.history(run_id)
    executed = len(journal(history))
    assert record.status is RunStatus.PENDING, (
        f"the run claimed as SIGTERM arrived was not given back: the draining worker executed "
        f"{executed}/{steps} steps after the signal and left it {record.status.value}\n"
        f"{format_history(history)}")
    assert history[-1].event is EventType.RUN_RELEASED, format_history(history)
    assert executed <= 1, f"the draining worker began {executed} new steps after SIGTERM"


def test_drain_gives_back_a_run_claimed_just_before_sigterm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process: the worker claims a run, SIGTERM arrives, and the drain
    flags the executions it watches *before* the pool thread has started
    executing the new claim (an OS scheduling delay, reproduced here by
    holding that thread back). That run must still be given back, not
    executed to its end while the worker is draining."""
    app = build_app(tmp_path / "race.db", tmp_path / "effects.jsonl", lease_seconds=30.0)
    run_id = "drain-race"
    steps = 8
    app.start("fifty", steps, 0.01, run_id=run_id)
    worker = app.worker(concurrency=1, worker_id="race-w", poll_interval=0.01)

    flagged = threading.Event()
    real_flag_all = worker.keeper.flag_all

    def flag_all(reason: str) -> None:
        real_flag_all(reason)
        flagged.set()

    real_execute = worker_module.execute

    def scheduled_late(runtime: Any, claim: Any, worker_id: str, *rest: Any) -> Any:
        worker.stop()  # what the SIGTERM handler does, right after this run was claimed
        if not flagged.wait(10):
            raise AssertionError("the drain never flagged the watched executions")
        return real_execute(runtime, claim, worker_id, *rest)

    monkeypatch.setattr(worker.keeper, "flag_all", flag_all)
    monkeypatch.setattr(worker_module, "execute", scheduled_late)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    thread.join(30)
    try:
        assert not thread.is_alive(), "the worker did not finish draining within 30s"
        record = app.get_run(run_id)
        history = app.history(run_id)
        executed = len(journal(history))
        assert record.status is RunStatus.PENDING, (
            f"a run claimed just before SIGTERM was not given back: the draining worker executed "
            f"{executed}/{steps} steps and left it {record.status.value}\n{format_history(history)}")
        assert history[-1].event is EventType.RUN_RELEASED, format_history(history)
    finally:
        app.close()


def test_sigterm_waits_for_a_sibling_step_mid_body(cluster: Cluster) -> None:
    """Real process, real SIGTERM, async workflow: a long step runs beside a
    chain of short ones (``asyncio.gather``). The drain stops the chain at its
    next step boundary, but the long sibling is mid-body: it must finish and
    be recorded before the run is given back, and never run again."""
    app = cluster.app(lease_seconds=LEASE)
    run_id = "drain-siblings"
    app.start("siblings", 30, 0.1, 2.0, run_id=run_id)
    first = cluster.spawn("drain-sib-w1", lease=LEASE)

    def begun(position: int) -> bool:
        return any(e["kind"] == "begin" and e["run_id"] == run_id and e["position"] >= position
                   for e in cluster.effects())

    wait_until(lambda: begun(0) and begun(3), 15, "the long step and the chain to be under way")
    first.send(signal.SIGTERM)
    assert first.wait_exit(15) == 0, f"draining worker did not exit 0; log:\n{first.log_tail()}"

    history = app.history(run_id)
    assert history[-1].event is EventType.RUN_RELEASED, format_history(history)
    recorded = journal(history)
    assert recorded.get(0) is not None, (
        f"the long sibling, mid-body at SIGTERM, was not recorded before the release\n"
        f"{format_history(history)}")
    assert recorded[0].name == "long_async"
    effects = cluster.effects()
    first_begins = {e["position"] for e in effects if e["kind"] == "begin" and e["pid"] == first.pid}
    assert first_begins == set(recorded), (
        f"the drained worker began {sorted(first_begins)} but recorded {sorted(recorded)}")

    second = cluster.spawn("drain-sib-w2", lease=LEASE)
    wait_until(lambda: app.get_run(run_id).status is RunStatus.COMPLETED, 30, "the second worker to finish")
    assert app.handle(run_id).result(timeout=1) == 1000 + sum(range(30))
    begins = by_key(cluster.effects(), "begin")
    repeated = {key: len(v) for key, v in begins.items() if len(v) != 1}
    assert not repeated, f"steps executed more than once across the drain: {repeated}"
    assert not audit_history(app.history(run_id))
    second.send(signal.SIGTERM)
    assert second.wait_exit(10) == 0


def test_drain_is_flagged_before_listening_stops(tmp_path: Path) -> None:
    """In process, deterministic: a store that pushes wake-ups and takes half
    a second to stop listening (as PostgreSQL's listener thread does). Steps
    must not keep starting while it stops: the drain is flagged first."""
    app = build_app(tmp_path / "listen.db", tmp_path / "effects.jsonl", lease_seconds=30.0)
    run_id = "drain-listen"
    app.start("fifty", 200, 0.01, run_id=run_id)
    stop_called = threading.Event()
    stopped_at: list[float] = []

    def listen(callback: Any) -> Any:
        def stop() -> None:
            stopped_at.append(time.time())
            stop_called.set()
            time.sleep(0.5)
        return stop

    app.store.listen = listen  # type: ignore[attr-defined]
    worker = app.worker(concurrency=1, worker_id="listen-w", poll_interval=0.01)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: len(journal(app.history(run_id))) >= 3, 15, "three steps")
        worker.stop()
        thread.join(30)
        assert not thread.is_alive()
        late = [e for e in read_effects(tmp_path / "effects.jsonl")
                if e["kind"] == "begin" and e["t0"] > stopped_at[0]]
        assert not late, f"{len(late)} step(s) began while the worker stopped listening, after the drain"
        assert app.history(run_id)[-1].event is EventType.RUN_RELEASED
    finally:
        app.close()
