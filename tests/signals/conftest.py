"""Fixtures of the signals tests: the engine tier's ``app`` (a real App on
SQLite and on PostgreSQL) and a worker thread to run its runs."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import cairn
from tests.engine.conftest import app, calls  # noqa: F401  (fixtures, re-exported)


@contextlib.contextmanager
def worker_thread(
    application: cairn.App, *, concurrency: int = 1, poll: float = 0.05
) -> Iterator[cairn.App]:
    """A worker of ``application`` running in a thread for the duration of the block."""
    worker = application.worker(concurrency=concurrency, poll_interval=poll)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        yield application
    finally:
        worker.stop()
        thread.join(timeout=30)
        assert not thread.is_alive(), "the worker did not drain"
