"""A store raises only Cairn's errors: real driver failures become
``StoreError`` at the dialect boundary, on SQLite and PostgreSQL."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from cairn.errors import InvalidArgument, StoreError
from cairn.store.postgres import PostgresStore
from cairn.store.records import EventType, HistoryEvent, NewRun, Payload, RunFilter
from cairn.store.sqlite import SQLiteStore


def _run(run_id: str) -> NewRun:
    return NewRun(run_id, "wf", "1", "t", None, Payload(b"x"))


def test_sqlite_locked_database_is_a_store_error(tmp_path: Path) -> None:
    """Another connection holds the write lock longer than the busy timeout:
    SQLite says "database is locked", the store says StoreError."""
    store = SQLiteStore(tmp_path / "db.sqlite", busy_timeout=0.05)
    blocker = sqlite3.connect(tmp_path / "db.sqlite", isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreError, match="database is locked"):
            store.create_run(_run("r1"))
        blocker.execute("ROLLBACK")
        assert store.create_run(_run("r1"))[1]  # the failure left nothing behind
    finally:
        blocker.close()
        store.close()


def test_sqlite_read_of_a_damaged_database_is_a_store_error(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "db.sqlite")
    try:
        store.create_run(_run("r1"))
        store._conn().execute("DROP TABLE runs")  # damage it behind the store's back
        with pytest.raises(StoreError, match="no such table"):
            store.get_run("r1")
        with pytest.raises(StoreError, match="no such table"):
            store.list_runs(RunFilter())
    finally:
        store.close()


def test_sqlite_append_on_a_damaged_database_is_a_store_error(tmp_path: Path) -> None:
    """The one-statement append (the per-step hot path) wraps too."""
    store = SQLiteStore(tmp_path / "db.sqlite")
    try:
        claim = store.create_claimed_run(_run("r1"), "w", 30)
        assert claim is not None
        store._conn().execute("DROP TABLE history")
        event = HistoryEvent(run_id="r1", seq=claim.next_seq, event=EventType.STEP_COMPLETED, at=0.0,
                             epoch=claim.run.epoch, position=0, step_kind="step", name="s")
        with pytest.raises(StoreError, match="no such table"):
            store.append("r1", claim.run.epoch, [event])
    finally:
        store.close()


def test_postgres_failure_is_a_store_error(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    try:
        store.create_run(_run("r1"))
        with store._conn() as conn:
            conn.execute("ALTER TABLE runs RENAME TO runs_gone")
        with pytest.raises(StoreError, match="runs"):
            store.get_run("r1")
    finally:
        store.close()


def test_sqlite_artifact_file_failure_is_a_store_error(tmp_path: Path) -> None:
    """The artifact files belong to the store too: an OSError there (here the
    directory is a file) is a StoreError, not an OSError."""
    store = SQLiteStore(tmp_path / "db.sqlite")
    try:
        store.artifact_dir.write_bytes(b"not a directory")
        with pytest.raises(StoreError, match="cannot store an artifact"):
            store.put_artifact(b"payload")
    finally:
        store.close()


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_text_no_database_can_hold_is_an_invalid_argument(
    tmp_path: Path, dialect: str, request: pytest.FixtureRequest
) -> None:
    """A lone surrogate (what Python makes of a command-line argument that is
    not UTF-8, or of a JSON escape like \\ud800) is text no database can hold:
    the store says so with Cairn's error, whichever call met it, and writes
    nothing. (It used to escape as a UnicodeEncodeError: a traceback in the CLI.)"""
    store: SQLiteStore | PostgresStore
    if dialect == "postgres":
        store = PostgresStore(request.getfixturevalue("pg_url"))
    else:
        store = SQLiteStore(tmp_path / "db.sqlite")
    bad = "run-\udcff"
    try:
        with pytest.raises(InvalidArgument, match="not valid Unicode"):
            store.get_run(bad)
        with pytest.raises(InvalidArgument, match="not valid Unicode"):
            store.history(bad)
        with pytest.raises(InvalidArgument, match="not valid Unicode"):
            store.create_run(_run(bad))
        with pytest.raises(InvalidArgument, match="not valid Unicode"):
            store.list_runs(RunFilter(tenant="\ud800"))
        with pytest.raises(InvalidArgument, match="not valid Unicode"):
            store.cancel_run(bad, "no")
        assert store.list_runs(RunFilter()) == []
        assert store.create_run(_run("r1"))[1]  # the store still works
    finally:
        store.close()
