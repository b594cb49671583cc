"""Issue 9 item 11: time is read after the lock.

A SQLite transition that waits for the write lock must take "now" once it
holds it: a claim that queued behind another writer for longer than its
lease used to commit a lease that had already expired (so the next poll of
any worker took the run over at once). And a run's history never goes back
in time, whatever the writers' clocks say.
"""

from __future__ import annotations

import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from cairn.store.contract import Store
from cairn.store.postgres import PostgresStore
from cairn.store.records import ApprovalRequest, EventType, RunStatus
from cairn.store.sqlite import SQLiteStore
from tests.store.contract.helpers import WF, FakeClock, claim, ev, new_run

T = TypeVar("T")
LEASE = 1.0
HELD = 2.0  # the other writer holds the lock longer than a lease


def behind_a_writer(path: Path, call: Callable[[], T]) -> tuple[T, float]:
    """Run ``call`` while another connection holds the write lock for
    ``HELD`` seconds; its result and the time it returned."""
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    done: list[T] = []
    worker = threading.Thread(target=lambda: done.append(call()))
    worker.start()
    time.sleep(HELD)
    holder.execute("COMMIT")
    holder.close()
    worker.join(timeout=30)
    assert done, "the call did not return"
    return done[0], time.time()


def test_a_claim_that_waited_for_the_lock_holds_a_live_lease(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "t.db")
    store.create_run(new_run("r1"))
    claims, returned = behind_a_writer(store.path, lambda: store.claim_runs("w1", [WF], 1, LEASE, 3))
    (got,) = claims
    assert got.run.lease_expires_at is not None
    assert got.run.lease_expires_at > returned, "the lease committed had expired before the claim returned"
    stored = store.get_run("r1")
    assert stored is not None
    assert stored.lease_expires_at is not None
    assert stored.lease_expires_at > returned
    store.close()


def test_every_waiting_transition_stamps_the_time_it_got_the_lock(tmp_path: Path) -> None:
    """Single-run claim, renewal, cancel: each records the time it committed, not when it asked."""
    store = SQLiteStore(tmp_path / "t.db")
    for run_id in ("a", "b", "c"):
        store.create_run(new_run(run_id))
    asked = time.time()
    got, returned = behind_a_writer(store.path, lambda: store.claim_run("a", "w1", LEASE, 3))
    assert got is not None
    assert got.run.lease_expires_at is not None
    assert got.run.lease_expires_at > returned
    renewed = claim(store, "b", lease=LEASE)
    held = {"b": renewed.run.epoch}
    _, returned = behind_a_writer(store.path, lambda: store.renew_leases("w1", held, LEASE))
    after = store.get_run("b")
    assert after is not None
    assert after.lease_expires_at is not None
    assert after.lease_expires_at > returned
    _, _ = behind_a_writer(store.path, lambda: store.cancel_run("c", "stop"))
    cancelled = store.history("c")[-1]
    assert cancelled.event is EventType.RUN_CANCELLED
    assert cancelled.at >= asked + HELD * 0.9
    store.close()


def _store(dialect: str, tmp_path: Path, request: pytest.FixtureRequest, clock: FakeClock) -> Store:
    if dialect == "postgres":
        return PostgresStore(request.getfixturevalue("pg_url"), clock=clock)
    return SQLiteStore(tmp_path / "t.db", clock=clock)


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_history_timestamps_never_go_back_in_a_run(
    tmp_path: Path, dialect: str, request: pytest.FixtureRequest
) -> None:
    """A clock stepped back (NTP) or a lagging writer: each entry's ``at``
    is at least its predecessor's, through every kind of append."""
    clock = FakeClock()
    store = _store(dialect, tmp_path, request, clock)
    store.create_run(new_run("r1"))
    c = claim(store, "r1")
    clock.advance(-100)  # the clock jumps back
    store.append("r1", c.run.epoch, [ev(clock, "r1", c.next_seq, c.run.epoch)])  # the hot path
    store.append("r1", c.run.epoch, [ev(clock, "r1", c.next_seq + 1, c.run.epoch),
                                     ev(clock, "r1", c.next_seq + 2, c.run.epoch)])
    store.release_run("r1", c.run.epoch, ev(clock, "r1", c.next_seq + 3, c.run.epoch, EventType.RUN_RELEASED))
    again = claim(store, "r1")  # a claim's entries (runnable since the release, behind the entries)
    clock.advance(-100)
    store.cancel_run("r1", "stop")  # an operator transition's entry
    history = store.history("r1")
    ats = [e.at for e in history]
    assert ats == sorted(ats), ats
    assert again.run.status is RunStatus.RUNNING
    store.close()


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_history_timestamps_never_go_back_through_the_other_writes_of_a_holder(
    tmp_path: Path, dialect: str, request: pytest.FixtureRequest
) -> None:
    """The holder's writes the test above leaves out: a child started, an
    approval requested, a rewind, a suspension, the finish. Each after the
    clock jumped back again."""
    clock = FakeClock()
    store = _store(dialect, tmp_path, request, clock)
    store.create_run(new_run("r1"))
    c = claim(store, "r1")
    seq, epoch = c.next_seq, c.run.epoch
    clock.advance(-100)
    store.start_child("r1", epoch, ev(clock, "r1", seq, epoch, position=0, step_kind="child", name=WF),
                      new_run("kid"))
    clock.advance(-100)
    store.request_approval("r1", epoch, ev(clock, "r1", seq + 1, epoch, position=1, step_kind="approval",
                                           name="ok"),
                           ApprovalRequest("req", "ok", "T", None, None, None))
    clock.advance(-100)
    store.rewind_run("r1", epoch, ev(clock, "r1", seq + 2, epoch, EventType.RUN_REWOUND,
                                     detail={"from_position": 1, "to": "x", "reason": "r", "rewind": 1}),
                     ev(clock, "r1", seq + 3, epoch, EventType.RUN_RELEASED))
    again = claim(store, "r1")
    clock.advance(-100)
    store.suspend_run("r1", again.run.epoch, ev(clock, "r1", again.next_seq, again.run.epoch,
                                                EventType.RUN_SUSPENDED), clock() - 50, None)
    last = claim(store, "r1")  # due: its wake time has passed on the stepped-back clock
    clock.advance(-100)
    finished = ev(clock, "r1", last.next_seq, last.run.epoch, EventType.RUN_COMPLETED)
    store.finish_run("r1", last.run.epoch, finished, RunStatus.COMPLETED, None, None)
    history = store.history("r1")
    ats = [e.at for e in history]
    assert [e.event for e in history][-1] is EventType.RUN_COMPLETED
    assert ats == sorted(ats), [(e.seq, e.event.value, e.at) for e in history]
    store.close()


# -- a holder write reads "now" once it holds its run ------------------------------
#
# The lock is held by the same run's holder, inside a transactional step
# (``Store.transact``): the SQLite write lock, or on PostgreSQL the run row
# held FOR KEY SHARE, which the holder writes' FOR UPDATE waits for. Once the
# write under test is seen waiting for it, the fake clock moves on and the
# lock is let go: a write that read "now" before its lock stamps the old time.

SKEW = 100.0


def _blocked_on_lock(store: Store, thread: threading.Thread, pg_url: str | None) -> bool:
    """Whether ``thread``'s write waits for the lock (PostgreSQL: a backend
    of the database waits for a row lock; SQLite: the thread is inside the
    store's wait for the write lock)."""
    if pg_url is not None:
        import psycopg

        with psycopg.connect(pg_url, autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                               "AND wait_event_type = 'Lock'").fetchone()
        return bool(row and row[0])
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == "_writing":
            return True
        frame = frame.f_back
    return False


def _prepare(store: Store, clock: FakeClock, op: str) -> tuple[int, int]:
    """A run ``r1`` held by w1, with what ``op`` needs; its ``(epoch, next seq)``."""
    store.create_run(new_run("r1"))
    c = claim(store, "r1")
    seq = c.next_seq
    if op == "take_delivery":
        store.deliver("r1", "signal:go", None)
    if op == "expire_approval":
        store.request_approval("r1", c.run.epoch, ev(clock, "r1", seq, c.run.epoch, position=0,
                                                     step_kind="approval", name="ok"),
                               ApprovalRequest("req", "ok", "T", None, None, None))
        seq += 1
    return c.run.epoch, seq


def _write(store: Store, clock: FakeClock, op: str, epoch: int, seq: int) -> None:
    entry = ev(clock, "r1", seq, epoch, position=1, step_kind="approval", name="ok")
    if op == "suspend_run":
        store.suspend_run("r1", epoch, ev(clock, "r1", seq, epoch, EventType.RUN_SUSPENDED), None, None)
    elif op == "release_run":
        store.release_run("r1", epoch, ev(clock, "r1", seq, epoch, EventType.RUN_RELEASED))
    elif op == "rewind_run":
        store.rewind_run("r1", epoch, ev(clock, "r1", seq, epoch, EventType.RUN_REWOUND,
                                         detail={"from_position": 0, "to": "s", "reason": "r", "rewind": 1}),
                         ev(clock, "r1", seq + 1, epoch, EventType.RUN_RELEASED))
    elif op == "halt_run":
        store.halt_run("r1", epoch, ev(clock, "r1", seq, epoch, EventType.RUN_HALTED), {"type": "X"})
    elif op == "start_child":
        store.start_child("r1", epoch, ev(clock, "r1", seq, epoch, position=1, step_kind="child", name=WF),
                          new_run("kid"))
    elif op == "request_approval":
        store.request_approval("r1", epoch, entry, ApprovalRequest("req", "ok", "T", None, None, None))
    elif op == "expire_approval":
        assert store.expire_approval("r1", epoch, entry, "req")
    else:
        assert op == "take_delivery", op
        store.take_delivery("r1", epoch, ev(clock, "r1", seq, epoch, position=1, step_kind="receive",
                                            name="signal:go"), 1)


def _stamped(store: Store, op: str) -> float | None:
    """The "now" ``op`` wrote."""
    if op == "start_child":
        kid = store.get_run("kid")
        return None if kid is None else kid.created_at
    if op in ("request_approval", "expire_approval"):
        (approval,) = store.approvals(run_id="r1", pending=False)
        return approval.requested_at if op == "request_approval" else approval.decided_at
    if op == "take_delivery":
        (message,) = store.deliveries("r1")
        return message.taken_at
    run = store.get_run("r1")
    return None if run is None else run.updated_at


@pytest.mark.parametrize("op", ["suspend_run", "release_run", "rewind_run", "halt_run", "start_child",
                                "request_approval", "expire_approval", "take_delivery"])
@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_a_holder_write_that_waited_for_its_run_stamps_the_time_it_got_it(
    tmp_path: Path, dialect: str, op: str, request: pytest.FixtureRequest
) -> None:
    """The finish is left out: PostgreSQL's is one message, its "now"
    bound before it is sent (see ``PostgresStore.finish_run``)."""
    clock = FakeClock()
    store = _store(dialect, tmp_path, request, clock)
    pg_url = request.getfixturevalue("pg_url") if dialect == "postgres" else None
    epoch, seq = _prepare(store, clock, op)
    inside, leave = threading.Event(), threading.Event()

    def hold(tx: object) -> tuple[list[Any], None]:
        inside.set()
        assert leave.wait(30), "the test never let the lock go"
        return [ev(clock, "r1", seq, epoch, position=0)], None

    errors: list[BaseException] = []

    def guarded(call: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            try:
                call()
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)
        return run

    holder = threading.Thread(target=guarded(lambda: store.transact("r1", epoch, hold)))
    holder.start()
    assert inside.wait(30), "the transactional step never started"
    writer = threading.Thread(target=guarded(lambda: _write(store, clock, op, epoch, seq + 1)))
    writer.start()
    deadline = time.monotonic() + 30  # a bound on the wait, never a figure checked
    while not _blocked_on_lock(store, writer, pg_url) and writer.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _blocked_on_lock(store, writer, pg_url), "the write never waited for the lock"
    clock.advance(SKEW)
    leave.set()
    holder.join(30)
    writer.join(30)
    assert not errors, errors
    assert _stamped(store, op) == clock(), f"{op} stamped the time before it held its run"
    store.close()


# -- a PostgreSQL claim reads "now" once it holds what it waited for --------------
#
# SQLite's claims are covered at the top (the write lock). On PostgreSQL a
# single claim locks its run row FOR UPDATE, and a batch claim locks the
# limited queues' rows: another transaction holding either makes it wait, and
# a lease that started at the time it asked would be short by that wait.


@pytest.mark.parametrize("op", ["claim_run", "claim_runs"])
def test_a_postgres_claim_that_waited_for_a_lock_leases_from_the_time_it_got_it(
    op: str, pg_url: str
) -> None:
    import psycopg

    from cairn.store.admission import QueueLimits

    clock = FakeClock()
    store = PostgresStore(pg_url, clock=clock)
    store.set_queue(QueueLimits("q", concurrency=5))
    store.create_run(new_run("r1", queue="q"))
    got: list[object] = []
    errors: list[BaseException] = []

    def claim() -> None:
        try:
            got.extend(store.claim_runs("w1", [WF], 1, LEASE, 3) if op == "claim_runs"
                       else [store.claim_run("r1", "w1", LEASE, 3)])
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    locked = ("SELECT 1 FROM cairn.runs WHERE run_id = 'r1' FOR UPDATE" if op == "claim_run"
              else "SELECT 1 FROM cairn.queues WHERE name = 'q' FOR UPDATE")
    with psycopg.connect(pg_url, autocommit=True) as holder:
        holder.execute("BEGIN")
        holder.execute(locked)
        writer = threading.Thread(target=claim)
        writer.start()
        deadline = time.monotonic() + 30  # a bound on the wait, never a figure checked
        while (not _blocked_on_lock(store, writer, pg_url) and writer.is_alive()
               and time.monotonic() < deadline):
            time.sleep(0.01)
        assert _blocked_on_lock(store, writer, pg_url), "the claim never waited for the lock"
        clock.advance(SKEW)
        holder.execute("COMMIT")
    writer.join(30)
    assert not errors, errors
    (claimed,) = got
    assert claimed is not None
    run = store.get_run("r1")
    assert run is not None
    assert run.lease_expires_at == clock() + LEASE, f"{op} leased from the time before it held its lock"
    store.close()
