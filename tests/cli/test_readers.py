"""Issue 9 item 10: readers never write.

``cairn runs`` used to wait 30 s and fail with "database is locked" while a
worker held the write lock (it opened the database as a writer: WAL pragma,
a migration check in ``BEGIN IMMEDIATE``), and it silently migrated an older
database. The inspection commands now open it read-only: they answer while
a writer holds the lock, never change the file, and say (one line on
stderr) when migrations are pending, or fail clearly when the schema is too
old to read.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cairn.store.sqlfiles import load_migrations
from cairn.store.sqlite import SQLiteStore, _split_statements
from tests.store.contract.helpers import new_run

READERS = [
    ["runs"],
    ["show", "r1"],
    ["events", "r1"],
    ["ops", "list", "r1"],
    ["queues", "list"],
    ["db", "status"],
]


def cairn(db: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-m", "cairn", *args, "--db", str(db)], capture_output=True,
                          text=True, timeout=timeout, env=env)


#: ``python -m cairn`` with every SQLite connection's busy timeout at zero: a statement that
#: needs a lock another connection holds fails at once ("database is locked") instead of waiting
IMPATIENT_CAIRN = """
import runpy, sys
from cairn.store import sqlite

opened = sqlite.SQLiteStore.__init__
def impatient(self, *args, **kwargs):
    kwargs["busy_timeout"] = 0
    opened(self, *args, **kwargs)
sqlite.SQLiteStore.__init__ = impatient
sys.argv[0] = "cairn"
runpy.run_module("cairn", run_name="__main__")
"""


def impatient_cairn(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-c", IMPATIENT_CAIRN, *args, "--db", str(db)],
                          capture_output=True, text=True, timeout=600, env=env)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "cairn.db"
    store = SQLiteStore(path)
    store.create_run(new_run("r1"))
    store.close()
    return path


@pytest.fixture
def writer_holding_the_lock(db: Path) -> Iterator[sqlite3.Connection]:
    """A worker in the middle of a write transaction (it holds the lock for the whole test)."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("UPDATE runs SET updated_at = updated_at + 1")
    yield conn
    conn.execute("ROLLBACK")
    conn.close()


@pytest.mark.parametrize("command", READERS, ids=lambda c: " ".join(c))
@pytest.mark.slow
def test_inspection_answers_while_a_writer_holds_the_lock(
    db: Path, writer_holding_the_lock: sqlite3.Connection, command: list[str]
) -> None:
    """Never waiting for the writer is shown without a clock: the command runs
    with a busy timeout of zero while the writer holds its transaction open
    for the whole test, so any statement that needed the writer's lock would
    fail at once with "database is locked". (It used to assert the command
    took under 10 s, which a Python process starting at load 15 on two cores
    does not, lock or no lock.)"""
    result = impatient_cairn(db, *command)
    assert result.returncode == 0, result.stderr
    assert "locked" not in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_writer_command_under_the_same_conditions_fails_at_once(
    db: Path, writer_holding_the_lock: sqlite3.Connection
) -> None:
    """The control for the test above: a command that does take the write
    lock (``cairn cancel``) fails under a zero busy timeout while the writer
    holds it, so the readers' success is not the harness failing to hold it."""
    result = impatient_cairn(db, "cancel", "r1")
    assert result.returncode != 0
    assert "locked" in result.stderr, result.stderr


def _old_database(path: Path, version: int) -> None:
    """A database as an older Cairn left it: only the first ``version`` migrations applied."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
                 "applied_at REAL NOT NULL)")
    for migration in load_migrations("sqlite")[:version]:
        for statement in _split_statements(migration.sql):
            conn.execute(statement)
        conn.execute("INSERT INTO schema_migrations VALUES (?, ?, 0)", (migration.version, migration.name))
    conn.close()


def _fingerprint(path: Path) -> tuple[int, str]:
    conn = sqlite3.connect(path)
    version = conn.execute("SELECT MAX(version) FROM schema_migrations").fetchone()[0]
    tables = conn.execute("SELECT group_concat(sql, ';') FROM sqlite_master").fetchone()[0]
    conn.close()
    return version, hashlib.sha256(tables.encode()).hexdigest()


def _version_before(name: str) -> int:
    """The schema version just before the SQLite migration named ``name``
    (found by name, so renumbering does not move the test)."""
    return next(m.version for m in load_migrations("sqlite") if m.name == name) - 1


@pytest.mark.slow
@pytest.mark.parametrize(("before", "readable"), [
    # started_role/started_token are read by authorization (engine.startedwith), not by the run
    # listing: a database without them lists its runs
    ("started_role", True),
    # runs.bundle is in every run the listing reads: a database without it cannot be read
    ("bundles", False),
])
def test_an_older_database_is_read_as_it_is_and_never_migrated(
        tmp_path: Path, before: str, readable: bool) -> None:
    """Readers never migrate. A database whose schema this Cairn can still
    read is read as it is, with one note that migrations are pending; one it
    cannot read (a later migration added a column it selects) is one clear
    error naming ``cairn db migrate``. Either way nothing is changed."""
    path = tmp_path / "old.db"
    _old_database(path, _version_before(before))
    before_fp = _fingerprint(path)
    status = cairn(path, "db", "status")
    assert status.returncode == 0, status.stderr
    assert _fingerprint(path) == before_fp, "cairn db status changed the schema"
    result = cairn(path, "runs")
    assert _fingerprint(path) == before_fp, "cairn runs changed the schema"
    assert "Traceback" not in result.stderr
    notes = [line for line in result.stderr.splitlines() if "migration" in line or "too old" in line]
    if readable:
        assert result.returncode == 0, result.stderr
        assert len(notes) == 1, result.stderr
        assert "pending" in notes[0]
    else:
        assert result.returncode != 0
        assert any("too old to read" in line for line in notes), result.stderr
    assert "cairn db migrate" in result.stderr


@pytest.mark.slow
def test_a_schema_too_old_to_read_is_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "ancient.db"
    _old_database(path, 1)  # no budget column yet
    before = _fingerprint(path)
    result = cairn(path, "runs")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "too old to read" in result.stderr
    assert "cairn db migrate" in result.stderr
    assert _fingerprint(path) == before
