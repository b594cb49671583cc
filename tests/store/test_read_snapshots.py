"""A read of several statements reads one snapshot (``SQLStore._in_read``).

``queue_stats`` judges each queue's counts against its limits: read from two
snapshots, a queue configured (and a run created in it) between the two
statements would show as an unlimited queue with work in it. On PostgreSQL a
transaction at READ COMMITTED takes a snapshot per statement, so the read
runs at REPEATABLE READ; SQLite's read transaction keeps the snapshot of its
first statement. The change is committed by another thread of the same store
right after the first statement, while the read transaction is open.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from cairn.store.admission import QueueLimits, QueueStats
from cairn.store.postgres import PostgresStore
from cairn.store.sqlbase import SQLStore
from cairn.store.sqlite import SQLiteStore
from tests.store.contract.helpers import FakeClock, new_run


def _store(dialect: str, tmp_path: Path, request: pytest.FixtureRequest, clock: FakeClock) -> SQLStore[Any]:
    if dialect == "postgres":
        return PostgresStore(request.getfixturevalue("pg_url"), clock=clock)
    return SQLiteStore(tmp_path / "t.db", clock=clock)


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_queue_stats_read_their_limits_and_counts_from_one_snapshot(
    tmp_path: Path, dialect: str, request: pytest.FixtureRequest
) -> None:
    clock = FakeClock()
    store = _store(dialect, tmp_path, request, clock)
    store.set_queue(QueueLimits("q", concurrency=2))
    store.create_run(new_run("q-0", queue="q"))
    before = store.queue_stats()
    assert before == [QueueStats(QueueLimits("q", concurrency=2), 0, 1)]
    query = store._query
    errors: list[BaseException] = []

    def change() -> None:
        try:
            store.set_queue(QueueLimits("late", concurrency=1))
            store.create_run(new_run("late-0", queue="late"))
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)

    def racing(tx: Any, name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        rows = query(tx, name, params)
        if name == "select_queues":  # the first of the read's statements has run
            writer = threading.Thread(target=change)
            writer.start()
            writer.join(30)
        return rows

    store._query = racing  # type: ignore[method-assign]
    try:
        during = store.queue_stats()
    finally:
        del store._query
    assert not errors, errors
    assert during == before, "queue_stats read the limits and the counts from two snapshots"
    assert store.queue_stats() == [QueueStats(QueueLimits("late", concurrency=1), 0, 1), *before]
    store.close()
