"""Workers on PostgreSQL are woken by LISTEN/NOTIFY; polling is the safety net."""

from __future__ import annotations

import gc
import select
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import cairn
from cairn.errors import RunNotFound
from cairn.store.postgres import PostgresStore, _relay
from tests.store.pg import TestDatabases
from tests.timing import SLACK


@pytest.fixture
def app(pg_databases: TestDatabases) -> Iterator[tuple[cairn.App, str]]:
    with pg_databases.database() as url:
        application = cairn.App(store=PostgresStore(url))

        @application.workflow(name="ping")
        def ping(ctx: cairn.Context) -> str:
            return "pong"

        @application.step(name="work")
        def work(seconds: float) -> None:
            time.sleep(seconds)

        @application.workflow(name="busy")
        def busy(ctx: cairn.Context, seconds: float) -> str:
            work(seconds)
            return "done"

        yield application, url
        application.close()


def serve(app: cairn.App, poll_interval: float) -> tuple[cairn.worker.worker.Worker, threading.Thread]:
    worker = app.worker(concurrency=1, poll_interval=poll_interval)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    return worker, thread


def test_a_notification_wakes_an_idle_worker_long_before_its_poll(
    app: tuple[cairn.App, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run is started only once the worker is provably idle: its
    listener is connected (LISTEN done) and a claim made after that found
    nothing. From there only a notification can wake it within the test's
    10 s (its poll is a minute). Starting the run earlier would let the
    worker's first claim, racing the start, find the run without any
    notification, and the test pass with LISTEN gone."""
    application, _ = app
    listening, idle = threading.Event(), threading.Event()
    store = application.store
    real_listen = store.listen  # type: ignore[attr-defined]

    def listen(callback: Callable[[], None]) -> Callable[[], None]:
        def woken() -> None:  # called once LISTEN is in place, then per notification
            listening.set()
            callback()
        return real_listen(woken)  # type: ignore[no-any-return]

    monkeypatch.setattr(store, "listen", listen)
    worker = application.worker(concurrency=1, poll_interval=60.0)  # a poll alone would take a minute
    real_claim = worker._claim

    def claim() -> list[Any]:
        after_listen = listening.is_set()
        claims = real_claim()
        if after_listen and not claims:
            idle.set()
        return claims

    monkeypatch.setattr(worker, "_claim", claim)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        assert idle.wait(10), "the worker never listened, or never went idle after listening"
        handle = application.start("ping", run_id="r1")
        assert handle.result(timeout=10) == "pong"
    finally:
        worker.stop()
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_lost_notifications_cost_a_poll_never_a_stuck_run(app: tuple[cairn.App, str]) -> None:
    application, url = app
    with psycopg.connect(url, autocommit=True) as conn:  # suppress every notification
        conn.execute("DROP TRIGGER runs_notify_runnable ON cairn.runs")
    worker, thread = serve(application, poll_interval=0.3)
    try:
        handles = [application.start("ping", run_id=f"r{i}") for i in range(3)]
        assert [h.result(timeout=10) for h in handles] == ["pong"] * 3
    finally:
        worker.stop()
        thread.join(timeout=10)
    assert not thread.is_alive()


@pytest.mark.parametrize("cap", ["queue", "share"])
def test_a_freed_slot_of_a_limited_queue_wakes_the_workers(app: tuple[cairn.App, str], cap: str) -> None:
    """Queue ``default`` runs one run at a time (its limit, or its tenant's
    own share), and an inline run (``App.run``, in a thread of this process)
    holds that slot. The worker is told of the second run at once but may
    not start it; when the inline run completes (which makes no run
    runnable: only the freed slot can wake the worker), it starts it at
    once, not after its minute-long poll."""
    application, _ = app
    if cap == "queue":
        application.set_queue("default", concurrency=1)
    else:  # a share with a rate too: the slot, not the rate, is what wakes
        application.set_queue_share("default", "default", concurrency=1, rate="1000/s")
    holding = threading.Thread(target=application.run, args=("busy", 1.0), kwargs={"run_id": "inline"})
    holding.start()
    worker = application.worker(concurrency=2, poll_interval=60.0)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10 * SLACK
        while not _exists(application, "inline") and time.monotonic() < deadline:
            time.sleep(0.01)
        second = application.start("ping")
        holding.join(timeout=10 * SLACK)
        assert application.get_run("inline").status.value == "completed"  # type: ignore[union-attr]
        assert second.result(timeout=10) == "pong"
    finally:
        worker.stop()
        thread.join(timeout=10)
    assert not thread.is_alive()


def _exists(app: cairn.App, run_id: str) -> bool:
    """Whether the run was created yet (``App.get_run`` raises until it is)."""
    try:
        app.get_run(run_id)
    except RunNotFound:
        return False
    return True


def test_stopping_a_listener_wakes_its_thread_which_ends(app: tuple[cairn.App, str]) -> None:
    """The listener's thread waits on its connection with no timeout: only
    a stop (which closes the other end of a socket pair it also waits on) or
    a failed connection ends that wait, so the thread being gone when
    ``stop`` returns shows the stop woke it. It used to wait up to 0.5 s for
    a ``notifies`` timeout. The thread is first seen calling back for a
    notification, so it is waiting, not on its way to wait, when stopped."""
    store = app[0].store
    assert isinstance(store, PostgresStore)
    woken = threading.Semaphore(0)
    before = set(threading.enumerate())
    stop = store.listen(woken.release)
    assert woken.acquire(timeout=10), "listen() calls back once LISTEN is in place"
    [thread] = [t for t in threading.enumerate() if t not in before and t.name.startswith("cairn-listen-")]
    with psycopg.connect(app[1], autocommit=True) as conn:
        conn.execute("SELECT pg_notify('cairn_runnable', 'cairn')")
    assert woken.acquire(timeout=10), "the notification called nobody back"
    stop()
    assert not thread.is_alive()
    stop()  # a second stop is harmless


def test_a_notification_that_arrives_with_the_stop_calls_nobody(pg_url: str) -> None:
    """Once stopped, ``_relay`` calls nobody back, even for a notification
    already at its socket when the stop came."""
    calls: list[int] = []
    stop = threading.Event()

    def woken() -> None:
        calls.append(1)
        stop.set()  # ends _relay, as a stop would

    wake, waker = socket.socketpair()
    with wake, waker, psycopg.connect(pg_url, autocommit=True) as conn, \
            psycopg.connect(pg_url, autocommit=True) as other:
        conn.execute("LISTEN cairn_runnable")
        other.execute("SELECT pg_notify('cairn_runnable', 'cairn')")
        _relay(conn, wake, stop, "cairn", woken)
        assert calls == [1]
        other.execute("SELECT pg_notify('cairn_runnable', 'cairn')")
        assert select.select([conn], [], [], 10)[0], "the notification never reached the listener"
        waker.close()  # what a stop does
        _relay(conn, wake, stop, "cairn", woken)  # stopped: returns without calling back
    assert calls == [1]


def test_a_listener_whose_stop_was_dropped_ends_its_thread(app: tuple[cairn.App, str]) -> None:
    """A caller that drops ``listen``'s stop function without calling it (a
    public path: ``App.listen_for_changes``) closes the socket pair's peer
    when the function is collected: the listener's thread ends, rather than
    waking on that end of file again and again, spinning a core."""
    store = app[0].store
    assert isinstance(store, PostgresStore)
    woken = threading.Semaphore(0)
    before = set(threading.enumerate())
    stop: Callable[[], None] | None = store.listen(woken.release)
    assert woken.acquire(timeout=10), "listen() calls back once LISTEN is in place"
    [thread] = [t for t in threading.enumerate() if t not in before and t.name.startswith("cairn-listen-")]
    with warnings.catch_warnings():  # the dropped peer is collected unclosed: that is the point
        warnings.simplefilter("ignore", ResourceWarning)
        del stop
        gc.collect()
    thread.join(timeout=10 * SLACK)
    assert not thread.is_alive(), "the listener went on after its stop function was dropped"
