"""The store contract suite run against the embedded SQLite backend, plus the
SQLite-only promises: schema migrations and the durability pragmas."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from cairn.errors import LeaseLost, StoreError
from cairn.store.contract import ARTIFACT_GRACE_SECONDS, Store
from cairn.store.records import Durability, EventType, NewRun, Payload
from cairn.store.sqlfiles import load_migrations
from cairn.store.sqlite import SQLiteStore
from tests.store.contract import FakeClock, StoreContract, exercise_every_writer, intent, new_run
from tests.store.memory_cold_contract import MemoryColdContract
from tests.store.memory_contract import MemoryContract
from tests.store.queue_contract import QueueContract
from tests.store.schedule_contract import ScheduleContract


class TestSQLiteStore(StoreContract, QueueContract, ScheduleContract, MemoryContract, MemoryColdContract):
    @pytest.fixture
    def clock(self) -> FakeClock:
        return FakeClock()

    @pytest.fixture
    def store(self, clock: FakeClock, tmp_path: Path, migrated_sqlite: Path) -> Iterator[SQLiteStore]:
        shutil.copyfile(migrated_sqlite, tmp_path / "contract.db")  # every migration applied
        store = SQLiteStore(tmp_path / "contract.db", clock=clock)
        yield store
        store.close()

    def damage_cold_copy(self, store: Store, key: str, data: bytes) -> None:
        assert isinstance(store, SQLiteStore)
        with sqlite3.connect(store.path) as conn:
            conn.execute("UPDATE memory_item_cold SET value = ? WHERE key = ?", (data, key))

    def write_legacy_run(self, store: Store, run: NewRun) -> None:
        assert isinstance(store, SQLiteStore)
        with sqlite3.connect(store.path) as conn:
            conn.execute("INSERT INTO runs (run_id, tenant, workflow, workflow_version, status, created_at, "
                         "updated_at) VALUES (?, ?, ?, ?, 'pending', 0, 0)",
                         (run.run_id, run.tenant, run.workflow, run.workflow_version))


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
    for conn in (store._conn(), store._writer_conn()):  # a thread's reads, and every write
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
        conn = store._writer_conn()
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


# -- tenancy, migrations and pruning ----------------------------------------------------


def _sql(path: Path, query: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(query, params).fetchall()
    finally:
        conn.close()


def test_every_history_row_carries_its_runs_tenant(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    clock = FakeClock()
    store = SQLiteStore(path, clock=clock)
    try:
        exercise_every_writer(store, clock)
    finally:
        store.close()
    rows = _sql(path, "SELECT h.tenant, r.tenant, count(*) FROM history h LEFT JOIN runs r USING (run_id) "
                "GROUP BY h.tenant, r.tenant ORDER BY h.tenant")
    assert [(h, r) for h, r, _ in rows] == [("acme", "acme"), ("globex", "globex")]
    assert sum(int(str(n)) for _, _, n in rows) > 40
    notnull = _sql(path, "SELECT \"notnull\" FROM pragma_table_info('history') WHERE name = 'tenant'")
    assert notnull == [(1,)]


def _database_at(path: Path, version: int) -> None:
    """A database migrated only up to ``version``, as an older Cairn left it."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
                 "applied_at REAL NOT NULL)")
    for migration in load_migrations("sqlite")[:version]:
        conn.executescript(migration.sql)
        conn.execute("INSERT INTO schema_migrations VALUES (?, ?, 0)", (migration.version, migration.name))
    conn.close()


def test_migration_3_backfills_the_tenant_of_existing_history(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _database_at(path, 2)
    conn = sqlite3.connect(path, isolation_level=None)
    for run_id, tenant in (("r1", "acme"), ("r2", "globex")):
        conn.execute("INSERT INTO runs (run_id, tenant, workflow, workflow_version, status, created_at, "
                     "updated_at) VALUES (?, ?, 'wf', '1', 'pending', 0, 0)", (run_id, tenant))
        for seq in (1, 2):
            conn.execute("INSERT INTO history (run_id, seq, event, at, epoch, payload) "
                         "VALUES (?, ?, 'run.created', 0, 0, x'01')", (run_id, seq))
    conn.close()
    store = SQLiteStore(path)
    try:
        assert store.schema_version() == len(load_migrations("sqlite"))
        assert [e.payload for e in store.history("r1")] == [Payload(data=b"\x01")] * 2
    finally:
        store.close()
    rows = _sql(path, "SELECT run_id, seq, tenant FROM history ORDER BY run_id, seq")
    assert rows == [("r1", 1, "acme"), ("r1", 2, "acme"), ("r2", 1, "globex"), ("r2", 2, "globex")]


def test_open_without_migrating_then_migrate(tmp_path: Path) -> None:
    path = tmp_path / "later.db"
    _database_at(path, 1)
    store = SQLiteStore(path, auto_migrate=False)
    try:
        assert store.schema_version() == 1
        assert store.migrate() == [m.version for m in load_migrations("sqlite")][1:]
        assert store.migrate() == []
        assert store.schema_version() == len(load_migrations("sqlite"))
    finally:
        store.close()
    empty = SQLiteStore(tmp_path / "empty.db", auto_migrate=False)
    try:
        assert empty.schema_version() == 0
    finally:
        empty.close()


def _artifact_file(store: SQLiteStore, ref: str) -> Path:
    return store.artifact_dir / ref[:2] / ref


def test_artifact_files_record_when_they_were_last_stored(tmp_path: Path) -> None:
    clock = FakeClock()
    store = SQLiteStore(tmp_path / "a.db", clock=clock)
    try:
        ref = store.put_artifact(b"bytes")
        assert _artifact_file(store, ref).stat().st_mtime == clock()
        clock.advance(123)
        assert store.put_artifact(b"bytes") == ref
        assert _artifact_file(store, ref).stat().st_mtime == clock()
    finally:
        store.close()


def test_prune_deletes_artifact_files_and_keeps_the_rest(tmp_path: Path) -> None:
    clock = FakeClock()
    store = SQLiteStore(tmp_path / "p.db", clock=clock)
    try:
        old = store.put_artifact(b"old input")
        kept = store.put_artifact(b"live input")
        store.create_run(new_run("old", input=Payload(ref=old)))
        store.cancel_run("old", "x")
        store.create_run(new_run("live", input=Payload(ref=kept)))
        clock.advance(2 * ARTIFACT_GRACE_SECONDS)
        assert store.prune_runs(clock()) == 1
        assert not _artifact_file(store, old).exists()
        assert _artifact_file(store, kept).read_bytes() == b"live input"
        assert _sql(store.path, "SELECT count(*) FROM artifact_gc") == [(0,)]
    finally:
        store.close()


def test_the_collection_queue_survives_a_restart(tmp_path: Path) -> None:
    """Within the grace period the file stays, queued in the database; a
    later prune by another store (another process) collects it."""
    path = tmp_path / "q.db"
    clock = FakeClock()
    store = SQLiteStore(path, clock=clock)
    try:
        ref = store.put_artifact(b"input")
        store.create_run(new_run("old", input=Payload(ref=ref)))
        store.cancel_run("old", "x")
        clock.advance(10)
        assert store.prune_runs(clock()) == 1
    finally:
        store.close()
    assert _sql(path, "SELECT ref FROM artifact_gc") == [(ref,)]
    clock.advance(ARTIFACT_GRACE_SECONDS)
    store = SQLiteStore(path, clock=clock)
    try:
        assert _artifact_file(store, ref).exists()
        assert store.prune_runs(clock()) == 0
        assert not _artifact_file(store, ref).exists()
        assert _sql(path, "SELECT count(*) FROM artifact_gc") == [(0,)]
    finally:
        store.close()


def test_a_put_waits_for_a_collection_in_progress(tmp_path: Path) -> None:
    """Deleting files holds the artifact lock exclusively: a put of the same
    bytes waits, then finds the file gone and writes it again."""
    import threading

    clock = FakeClock()
    store = SQLiteStore(tmp_path / "l.db", clock=clock)
    try:
        ref = store.put_artifact(b"contended")
        path = _artifact_file(store, ref)
        put_done = threading.Event()

        def put() -> None:
            store.put_artifact(b"contended")
            put_done.set()

        with store._artifact_lock(exclusive=True):
            worker = threading.Thread(target=put)
            worker.start()
            assert not put_done.wait(0.3)  # blocked on the lock
            path.unlink()  # as the collector does
        worker.join(timeout=10)
        assert put_done.is_set()
        assert path.read_bytes() == b"contended"
    finally:
        store.close()


def test_an_entry_stamped_with_another_epoch_is_refused(tmp_path: Path) -> None:
    """The fenced statement compares the entry's epoch with the run's; an
    entry whose epoch differs from the caller's fencing token is refused."""
    from cairn.errors import LeaseLost
    from cairn.store.records import EventType, HistoryEvent, NewRun, Payload

    store = SQLiteStore(tmp_path / "e.db")
    claim = store.create_claimed_run(NewRun("r", "wf", "1", "t", None, Payload(b"{}")), "w", 30)
    assert claim is not None
    entry = HistoryEvent(
        "r", claim.next_seq, EventType.STEP_COMPLETED, 0.0, claim.run.epoch, "w", 0, "step", "s"
    )
    with pytest.raises(LeaseLost):
        store.append("r", claim.run.epoch + 7, [entry])  # a stale or forged token with a current entry
    assert [e.seq for e in store.history("r")] == [1, 2, 3]
    store.close()
