"""The store contract suite run against the embedded SQLite backend, plus the
SQLite-only promises: schema migrations and the durability pragmas."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from cairn.errors import LeaseLost, StoreError
from cairn.store.records import Durability, EventType
from cairn.store.sqlfiles import load_migrations
from cairn.store.sqlite import SQLiteStore
from tests.store.contract import FakeClock, StoreContract, intent, new_run


class TestSQLiteStore(StoreContract):
    @pytest.fixture
    def clock(self) -> FakeClock:
        return FakeClock()

    @pytest.fixture
    def store(self, clock: FakeClock, tmp_path: Path) -> Iterator[SQLiteStore]:
        store = SQLiteStore(tmp_path / "contract.db", clock=clock)
        yield store
        store.close()


def test_migrations_are_applied_once_and_recorded(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    SQLiteStore(path).close()
    store = SQLiteStore(path)  # reopening applies nothing twice
    assert store.schema_version() == len(load_migrations("sqlite"))
    store.close()
    rows = sqlite3.connect(path).execute("SELECT version, name FROM schema_migrations").fetchall()
    assert rows == [(m.version, m.name) for m in load_migrations("sqlite")]


@pytest.mark.parametrize(("durability", "synchronous"), [(Durability.PROCESS, 1), (Durability.POWER, 2)])
def test_durability_modes_set_the_sqlite_pragmas(
    tmp_path: Path, durability: Durability, synchronous: int
) -> None:
    store = SQLiteStore(tmp_path / "d.db", durability=durability)
    conn = store._conn()
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == synchronous  # NORMAL=1, FULL=2
    store.close()


def test_a_file_that_is_not_a_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not a database\n" * 100)
    before = path.read_bytes()
    with pytest.raises(StoreError, match="cannot open SQLite database"):
        SQLiteStore(path)
    assert path.read_bytes() == before


def test_barrier_append_restores_normal_synchronous(tmp_path: Path) -> None:
    """In ``process`` mode the effect barrier commits with synchronous=FULL
    (one fsync), then drops back to NORMAL so later commits stay cheap, and
    it does so even when the fenced append is refused."""
    store = SQLiteStore(tmp_path / "b.db", durability=Durability.PROCESS)
    try:
        conn = store._conn()
        claimed = store.create_claimed_run(new_run("r1"), "w1", 30.0)
        assert claimed is not None
        epoch, seq = claimed.run.epoch, claimed.next_seq
        clock = FakeClock()
        store.append("r1", epoch, [intent(clock, "r1", seq, epoch)], barrier=True)
        assert store.history("r1")[-1].event is EventType.OP_INTENT
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        with pytest.raises(LeaseLost):  # seq already taken
            store.append("r1", epoch, [intent(clock, "r1", seq, epoch)], barrier=True)
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1
        store.append("r1", epoch, [intent(clock, "r1", seq + 1, epoch, position=1)], barrier=True)
        assert len(store.history("r1")) == seq + 1
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1
    finally:
        store.close()
