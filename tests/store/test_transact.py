"""``Store.transact`` on both backends: the fence of a transactional step.

A stale holder (taken over, cancelled, killed, an old epoch, a finished run:
every scenario of the contract's ``LOSS_SCENARIOS``) runs no body and
commits nothing. The fenced append inside the transaction is fenced too: a
body that bumps its own run's epoch through the handle loses its rows with
its record. And no takeover can interleave between the fence and the
commit (SQLite: the write lock; PostgreSQL: the run row held ``FOR KEY
SHARE``, which the takeover's ``FOR UPDATE`` waits for).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from cairn.errors import LeaseLost, SQLError, StoreError, TransactionMisuse
from cairn.store.contract import Store
from cairn.store.postgres import PostgresStore
from cairn.store.records import EventType, HistoryEvent
from cairn.store.sqlite import SQLiteStore
from cairn.store.transactions import Tx
from tests.backends import BACKENDS
from tests.store.contract import LEASE, LOSS_SCENARIOS, FakeClock, ev, running


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def open_store(kind: str, request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> Store:
    if kind == "postgres":
        return PostgresStore(request.getfixturevalue("pg_url"), clock=clock)
    return SQLiteStore(tmp_path / "transact.db", clock=clock)


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> Iterator[Store]:
    opened = open_store(request.param, request, tmp_path, clock)
    yield opened
    opened.close()


def mark(tx: Tx) -> str:
    return "?" if tx.paramstyle == "qmark" else "%s"


def with_orders(store: Store, clock: FakeClock) -> None:
    """The user's table, created by a transaction of a run of its own."""
    c = running(store, clock, "ddl")

    def body(tx: Tx) -> tuple[Sequence[HistoryEvent], None]:
        tx.execute("CREATE TABLE orders (item TEXT NOT NULL)")
        return [ev(clock, "ddl", c.next_seq, c.run.epoch)], None

    store.transact("ddl", c.run.epoch, body)


def order_count(store: Store, clock: FakeClock) -> int:
    c = running(store, clock, f"count-{clock()}")
    run_id = c.run.run_id

    def body(tx: Tx) -> tuple[Sequence[HistoryEvent], int]:
        count = int(tx.execute("SELECT count(*) FROM orders").scalar())
        return [ev(clock, run_id, c.next_seq, c.run.epoch)], count

    clock.advance(0.001)
    return store.transact(run_id, c.run.epoch, body)


def inserting(clock: FakeClock, run_id: str, seq: int, epoch: int, ran: list[str]) -> Callable[
        [Tx], tuple[Sequence[HistoryEvent], str]]:
    def body(tx: Tx) -> tuple[Sequence[HistoryEvent], str]:
        ran.append(run_id)
        tx.execute(f"INSERT INTO orders (item) VALUES ({mark(tx)})", (run_id,))
        return [ev(clock, run_id, seq, epoch)], "placed"

    return body


def test_a_live_holder_commits_its_rows_with_its_record(store: Store, clock: FakeClock) -> None:
    with_orders(store, clock)
    c = running(store, clock)
    ran: list[str] = []
    assert store.transact("r1", c.run.epoch, inserting(clock, "r1", c.next_seq, c.run.epoch, ran)) == "placed"
    assert ran == ["r1"]
    assert order_count(store, clock) == 1
    last = store.history("r1")[-1]
    assert (last.seq, last.event, last.epoch) == (c.next_seq, EventType.STEP_COMPLETED, c.run.epoch)


@pytest.mark.parametrize("scenario", sorted(LOSS_SCENARIOS))
def test_a_stale_holder_runs_no_body_and_commits_nothing(
    store: Store, clock: FakeClock, scenario: str
) -> None:
    with_orders(store, clock)
    run_id, epoch, seq = LOSS_SCENARIOS[scenario](store, clock)
    before = store.history(run_id)
    ran: list[str] = []
    with pytest.raises(LeaseLost):
        store.transact(run_id, epoch, inserting(clock, run_id, seq, epoch, ran))
    assert ran == []  # fenced before the body: a stale holder's body never runs
    assert store.history(run_id) == before
    assert order_count(store, clock) == 0


def test_the_append_inside_is_fenced_too(store: Store, clock: FakeClock) -> None:
    """A body that bumps its own run's epoch (through the handle, as the
    owner's store may) makes the fenced append fail: its rows go with it."""
    with_orders(store, clock)
    c = running(store, clock)

    def body(tx: Tx) -> tuple[Sequence[HistoryEvent], None]:
        tx.execute(f"INSERT INTO orders (item) VALUES ({mark(tx)})", ("r1",))
        tx.execute(f"UPDATE runs SET epoch = epoch + 1 WHERE run_id = {mark(tx)}", ("r1",))
        return [ev(clock, "r1", c.next_seq, c.run.epoch)], None

    with pytest.raises(LeaseLost):
        store.transact("r1", c.run.epoch, body)
    assert order_count(store, clock) == 0
    got = store.get_run("r1")
    assert got is not None
    assert got.epoch == c.run.epoch


def test_no_takeover_interleaves_with_the_body(
    request: pytest.FixtureRequest, store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    """A takeover attempted while the body runs (another store, the lease
    expired by the clock) waits for the commit: the record is committed
    under the holder's epoch and the takeover comes after it."""
    with_orders(store, clock)
    c = running(store, clock)
    other = open_store("postgres" if isinstance(store, PostgresStore) else "sqlite", request, tmp_path, clock)
    taken: list[Any] = []
    try:
        def body(tx: Tx) -> tuple[Sequence[HistoryEvent], None]:
            tx.execute(f"INSERT INTO orders (item) VALUES ({mark(tx)})", ("r1",))
            clock.advance(LEASE + 1)
            thief = threading.Thread(target=lambda: taken.append(other.claim_run("r1", "w2", LEASE, 5)))
            thief.start()
            thief.join(timeout=1.0)  # a window for a takeover that does not wait (there must be none)
            taken.append(thief)
            return [ev(clock, "r1", c.next_seq, c.run.epoch)], None

        store.transact("r1", c.run.epoch, body)
        thief = taken.pop(0)
        thief.join(timeout=30)
        (stolen,) = taken
    finally:
        other.close()
    history = store.history("r1")
    record = next(e for e in history if e.seq == c.next_seq)
    assert (record.event, record.epoch) == (EventType.STEP_COMPLETED, c.run.epoch)
    assert stolen is not None
    assert stolen.run.epoch == c.run.epoch + 1
    assert [e.event for e in history[c.next_seq:]][:2] == [EventType.LEASE_LOST, EventType.LEASE_TAKEN_OVER]
    assert order_count(store, clock) == 1


def test_a_failed_statement_the_body_caught_commits_nothing(store: Store, clock: FakeClock) -> None:
    with_orders(store, clock)
    c = running(store, clock)

    def body(tx: Tx) -> tuple[Sequence[HistoryEvent], None]:
        tx.execute(f"INSERT INTO orders (item) VALUES ({mark(tx)})", ("r1",))
        with contextlib.suppress(SQLError):
            tx.execute("INSERT INTO no_such_table VALUES (1)")
        with pytest.raises(SQLError, match="earlier statement"):
            tx.execute("SELECT 1")  # the transaction is doomed: nothing more runs
        return [ev(clock, "r1", c.next_seq, c.run.epoch)], None

    with pytest.raises(SQLError, match="rolls the whole transaction back"):
        store.transact("r1", c.run.epoch, body)
    assert len(store.history("r1")) == c.next_seq - 1
    assert order_count(store, clock) == 0


@pytest.mark.parametrize("store", ["postgres"], indirect=True)  # SQLite has no such bound: the lock is held
def test_a_body_idle_past_the_servers_timeout_commits_nothing(store: Store, clock: FakeClock) -> None:
    """PostgreSQL ends a session idle in a transaction for 5 s (so a frozen
    worker cannot keep its run locked); a body that pauses that long between
    statements loses its transaction the same way. SQLite has no such bound."""
    assert isinstance(store, PostgresStore)
    with_orders(store, clock)
    c = running(store, clock)

    def body(tx: Tx) -> tuple[Sequence[HistoryEvent], None]:
        tx.execute(f"INSERT INTO orders (item) VALUES ({mark(tx)})", ("r1",))
        threading.Event().wait(6.0)  # past idle_in_transaction_session_timeout (5 s)
        return [ev(clock, "r1", c.next_seq, c.run.epoch)], None

    with pytest.raises(StoreError, match="idle-in-transaction timeout"):
        store.transact("r1", c.run.epoch, body)
    assert order_count(store, clock) == 0
    assert len(store.history("r1")) == c.next_seq - 1


def test_a_body_cannot_leave_a_temporary_table_behind(store: Store, clock: FakeClock) -> None:
    """Unqualified names look in the temporary schema first, on both
    backends: a temporary ``history`` left on the store's connection would
    take the records of every later step. The keyword guard refuses
    ``CREATE TEMP``; a schema-qualified one is caught after the body."""
    with_orders(store, clock)
    c = running(store, clock)
    temp = "temp" if isinstance(store, SQLiteStore) else "pg_temp"

    def body(tx: Tx) -> tuple[Sequence[HistoryEvent], None]:
        tx.execute(f"INSERT INTO orders (item) VALUES ({mark(tx)})", ("r1",))
        tx.execute(f"CREATE TABLE {temp}.history (run_id TEXT)")
        return [ev(clock, "r1", c.next_seq, c.run.epoch)], None

    with pytest.raises(TransactionMisuse, match="temporary"):
        store.transact("r1", c.run.epoch, body)
    assert order_count(store, clock) == 0
    # the connection is clean: the next record lands in the real history
    ran: list[str] = []
    store.transact("r1", c.run.epoch, inserting(clock, "r1", c.next_seq, c.run.epoch, ran))
    assert store.history("r1")[-1].seq == c.next_seq
    assert order_count(store, clock) == 1


def test_session_settings_a_body_changes_are_set_back(pg_url: str, clock: FakeClock) -> None:
    """PostgreSQL only (SQLite's connection has no such settings): a body's
    ``set_config(..., false)`` commits with it and would stay on the pooled
    connection; the store sets its own settings again before the record."""
    store = PostgresStore(pg_url, clock=clock, pool_size=1)  # one connection: the next body gets it
    try:
        with_orders(store, clock)
        c = running(store, clock)

        def loosen(tx: Tx) -> tuple[Sequence[HistoryEvent], None]:
            tx.execute("SELECT set_config('statement_timeout', '0', false), "
                       "set_config('lock_timeout', '0', false), set_config('search_path', 'public', false)")
            return [ev(clock, "r1", c.next_seq, c.run.epoch)], None

        store.transact("r1", c.run.epoch, loosen)

        def look(tx: Tx) -> tuple[Sequence[HistoryEvent], tuple[Any, ...] | None]:
            row = tx.execute("SELECT current_setting('statement_timeout'), current_setting('lock_timeout'), "
                             "current_setting('search_path')").fetchone()
            return [ev(clock, "r1", c.next_seq + 1, c.run.epoch)], row

        assert store.transact("r1", c.run.epoch, look) == ("30s", "10s", '"cairn"')
    finally:
        store.close()
