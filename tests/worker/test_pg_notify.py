"""Workers on PostgreSQL are woken by LISTEN/NOTIFY; polling is the safety net."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

import cairn
from cairn.store.postgres import PostgresStore
from tests.store.pg import TestDatabases


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


def test_a_notification_wakes_an_idle_worker_long_before_its_poll(app: tuple[cairn.App, str]) -> None:
    application, _ = app
    worker, thread = serve(application, poll_interval=60.0)  # a poll alone would take a minute
    try:
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


def test_a_freed_slot_of_a_limited_queue_wakes_the_workers(app: tuple[cairn.App, str]) -> None:
    """Queue ``default`` runs one run at a time, and an inline run (``App.run``,
    in a thread of this process) holds that slot. The worker is told of the
    second run at once but may not start it; when the inline run completes
    (which makes no run runnable: only the freed slot can wake the worker), it
    starts it at once, not after its minute-long poll."""
    application, _ = app
    application.set_queue("default", concurrency=1)
    holding = threading.Thread(target=application.run, args=("busy", 1.0), kwargs={"run_id": "inline"})
    holding.start()
    worker = application.worker(concurrency=2, poll_interval=60.0)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while application.get_run("inline") is None and time.monotonic() < deadline:
            time.sleep(0.01)
        second = application.start("ping")
        holding.join(timeout=10)
        assert application.get_run("inline").status.value == "completed"  # type: ignore[union-attr]
        assert second.result(timeout=10) == "pong"
    finally:
        worker.stop()
        thread.join(timeout=10)
    assert not thread.is_alive()
