"""The PostgreSQL store hands out the connection it used last
(``cairn.store.pgrecent``): one thread's statements stay on one backend
after the pool grew, concurrent users still get a connection each, a
connection whose block failed or that broke goes back through the pool, and
a kept connection returns to the pool once its hold is over."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from cairn.errors import StoreError
from cairn.store.pgrecent import Recent
from cairn.store.postgres import PostgresStore


@pytest.fixture
def store(pg_url: str) -> Iterator[PostgresStore]:
    opened = PostgresStore(pg_url, pool_size=4)
    try:
        yield opened
    finally:
        opened.close()


def _backend(store: PostgresStore) -> int:
    with store._conn() as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def _grow(store: PostgresStore, n: int) -> set[int]:
    """Take ``n`` connections at once (the pool grows to hold them); their backends."""
    with store._conn() as a, store._conn() as b, store._conn() as c:
        held = [a, b, c][:n]
        return {int(conn.execute("SELECT pg_backend_pid()").fetchone()[0]) for conn in held}  # type: ignore[index]


def test_one_thread_stays_on_the_connection_it_used_last(store: PostgresStore) -> None:
    assert len(_grow(store, 3)) == 3  # the pool now holds three connections
    first = _backend(store)
    # handed out oldest-idle first, the next reads would take the two others in turn
    assert {_backend(store) for _ in range(8)} == {first}


def test_concurrent_users_get_a_connection_each(store: PostgresStore) -> None:
    _backend(store)  # one connection kept for the next taker
    inside, release = threading.Event(), threading.Event()
    seen: list[int] = []

    def hold() -> None:
        with store._conn() as conn:
            seen.append(int(conn.execute("SELECT pg_backend_pid()").fetchone()[0]))  # type: ignore[index]
            inside.set()
            release.wait(10)

    worker = threading.Thread(target=hold)
    worker.start()
    assert inside.wait(10)
    try:
        other = _backend(store)  # while the kept connection is in the other thread's hands
    finally:
        release.set()
        worker.join(10)
    assert len(seen) == 1
    assert other != seen[0]


def test_a_connection_whose_block_failed_goes_back_through_the_pool(store: PostgresStore) -> None:
    _grow(store, 3)
    kept = _backend(store)
    with pytest.raises(StoreError), store._conn() as conn:
        conn.execute("SELECT 1/0")  # the block fails: the connection goes back through the pool
    assert _backend(store) != kept


def test_a_broken_connection_is_not_handed_out_again(store: PostgresStore, pg_url: str) -> None:
    _grow(store, 3)
    kept = _backend(store)
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (kept,))
    with pytest.raises(StoreError):
        _backend(store)  # the kept connection finds its backend gone, once
    assert _backend(store) != kept  # the pool took the broken one back and replaces it


def test_a_kept_connection_goes_back_to_the_pool_when_its_hold_is_over() -> None:
    recent: Recent[object] = Recent(_CountingPool(), lambda conn: True, hold=0.0)  # type: ignore[arg-type]
    with recent.connection():
        pass
    pool = recent._pool
    assert isinstance(pool, _CountingPool)
    assert pool.returned == 1  # hold 0: straight back to the pool
    held: Recent[object] = Recent(_CountingPool(), lambda conn: True, hold=60.0)  # type: ignore[arg-type]
    for _ in range(3):
        with held.connection():
            pass
    counting = held._pool
    assert isinstance(counting, _CountingPool)
    assert (counting.taken, counting.returned) == (1, 0)  # one taken, kept between blocks
    held.close()
    assert counting.returned == 1


class _Block:
    def __enter__(self) -> _Block:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class _CountingPool:
    """A pool that counts what ``Recent`` takes and gives back (the hold logic, without a server)."""

    def __init__(self) -> None:
        self.taken = 0
        self.returned = 0
        self.closed = False

    def getconn(self) -> _Block:
        self.taken += 1
        return _Block()

    def putconn(self, conn: _Block) -> None:
        self.returned += 1


def test_a_taker_waiting_in_a_full_pool_gets_the_next_connection_returned(pg_url: str) -> None:
    """Two connections at most: one held for long, one returned while a third
    taker waits. The returned one goes to the waiter, not aside for later
    (else the waiter would wait for the long holder, or time out)."""
    store = PostgresStore(pg_url, pool_size=2)
    try:
        long_held, second_in, waiter_done = threading.Event(), threading.Event(), threading.Event()
        release_second = threading.Event()
        got: list[int] = []

        def hold(entered: threading.Event, until: threading.Event) -> None:
            with store._conn():
                entered.set()
                until.wait(20)

        holder = threading.Thread(target=hold, args=(long_held, waiter_done))
        second = threading.Thread(target=hold, args=(second_in, release_second))
        holder.start()
        second.start()
        assert long_held.wait(10)
        assert second_in.wait(10)

        def wait_for_one() -> None:
            got.append(_backend(store))
            waiter_done.set()

        waiter = threading.Thread(target=wait_for_one)
        waiter.start()
        time.sleep(0.3)  # the waiter is in the pool's queue by now
        release_second.set()
        waiter_done.wait(8)  # before the long holder lets go (it waits for the waiter)
        assert len(got) == 1, "the waiter was left waiting beside a connection kept aside"
        for thread in (holder, second, waiter):
            thread.join(15)
    finally:
        store.close()
