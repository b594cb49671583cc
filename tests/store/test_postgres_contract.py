"""The store contract suite run against the PostgreSQL backend, plus the
PostgreSQL-only promises: schema migrations in a configurable schema, commit
durability, races between machines, and clear errors when the server is
unreachable.

Every test runs on a database of its own, cloned from a migrated template
(see ``tests/store/pg.py``; the fixtures are in ``tests/conftest.py``).
The server is the session's private cluster (``tests/pgcluster.py``), which says
when these tests skip and when they fail.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from cairn.errors import LeaseLost, RunNotFound, StoreError
from cairn.store.contract import Store
from cairn.store.postgres import PostgresStore
from cairn.store.records import Claim, Durability, EventType, NewRun, RunStatus
from cairn.store.sqlfiles import load_migrations
from tests.acceptance.harness import wait_until
from tests.store.contract import (
    LEASE,
    WF,
    FakeClock,
    StoreContract,
    assert_gap_free,
    claim,
    ev,
    exercise_every_writer,
    intent,
    new_run,
    types,
)
from tests.store.memory_cold_contract import MemoryColdContract
from tests.store.memory_contract import MemoryContract
from tests.store.pg import TestDatabases
from tests.store.queue_contract import QueueContract
from tests.store.schedule_contract import ScheduleContract


class TestPostgresStore(StoreContract, QueueContract, ScheduleContract, MemoryContract, MemoryColdContract):
    @pytest.fixture
    def clock(self) -> FakeClock:
        return FakeClock()

    @pytest.fixture
    def store(self, clock: FakeClock, pg_url: str) -> Iterator[PostgresStore]:
        store = PostgresStore(pg_url, clock=clock)
        yield store
        store.close()

    def damage_cold_copy(self, store: Store, key: str, data: bytes) -> None:
        assert isinstance(store, PostgresStore)
        statement = "UPDATE memory_item_cold SET value = %s WHERE key = %s"
        store._operate(lambda tx: tx.execute(statement, (data, key)))

    def write_legacy_run(self, store: Store, run: NewRun) -> None:
        """As before migration 0020: its constraint dropped for the insert, then
        added back as that migration adds it (NOT VALID: the row stays)."""
        assert isinstance(store, PostgresStore)
        (constraint,) = _constraint_definitions(store, "runs_schedule_ids")

        def write(tx: Any) -> None:
            tx.execute("ALTER TABLE runs DROP CONSTRAINT runs_schedule_ids")
            tx.execute("INSERT INTO runs (run_id, tenant, workflow, workflow_version, status, created_at, "
                       "updated_at) VALUES (%s, %s, %s, %s, 'pending', 0, 0)",
                       (run.run_id, run.tenant, run.workflow, run.workflow_version))
            add = sql.SQL("ALTER TABLE runs ADD CONSTRAINT runs_schedule_ids {}").format(sql.SQL(constraint))
            tx.execute(add)

        store._operate(write)

    @pytest.mark.parametrize("durability", list(Durability))
    def test_durability_is_kept(self, pg_url: str, durability: Durability) -> None:
        store = PostgresStore(pg_url, durability=durability)
        assert store.durability is durability
        store.close()


def _constraint_definitions(store: PostgresStore, name: str) -> list[str]:
    """How PostgreSQL shows constraint ``name`` of ``runs`` (``CHECK (...) NOT VALID``)."""
    statement = ("SELECT pg_get_constraintdef(oid) FROM pg_constraint "
                 "WHERE conname = %s AND conrelid = 'runs'::regclass")
    return store._operate(lambda tx: [row[0] for row in tx.execute(statement, (name,))])


# -- schema and migrations ------------------------------------------------------------


def _query(url: str, query: str | sql.Composable, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


def test_migrations_are_applied_once_and_recorded_in_a_custom_schema(pg_url: str) -> None:
    schema = "Tenant Schema-1"  # needs quoting everywhere it is used
    migrations = load_migrations("postgres")
    store = PostgresStore(pg_url, schema=schema)
    assert store.schema_version() == len(migrations)
    store.create_run(new_run("r1"))
    store.close()
    store = PostgresStore(pg_url, schema=schema)  # reopening applies nothing twice
    assert store.migrate() == []
    assert store.schema_version() == len(migrations)
    assert store.get_run("r1") is not None
    store.close()
    rows = _query(
        pg_url, sql.SQL("SELECT version, name FROM {}.schema_migrations ORDER BY version").format(
            sql.Identifier(schema))
    )
    assert rows == [(m.version, m.name) for m in migrations]
    tables = _query(pg_url, "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
                    "ORDER BY table_name", (schema,))
    assert tables == [("api_tokens",), ("approvals",), ("artifact_gc",), ("artifacts",),
                      ("audit_checkpoints",), ("audit_legacy",), ("bundles",),
                      ("data_keys",), ("erasures",), ("history",), ("lg_blobs",), ("lg_checkpoints",),
                      ("lg_threads",),
                      ("lg_values",), ("lg_writes",),
                      ("mailbox",), ("memory_item_cold",), ("memory_items",),
                      ("memory_outbox",), ("memory_run",),
                      ("memory_thread_messages",), ("memory_threads",), ("memory_vectors",),
                      ("operator_log",),
                      ("queue_buckets",), ("queue_shares",), ("queues",),
                      ("retention_deleted",), ("retention_lease",), ("retention_policies",),
                      ("run_archive_refs",), ("run_archives",), ("runs",), ("schedules",),
                      ("schema_migrations",),
                      ("tenant_grants",),
                      ("tenant_privileges",), ("workspace_objects",)]
    # The template's own schema is untouched and nothing landed in public.
    assert _query(pg_url, "SELECT count(*) FROM cairn.runs") == [(0,)]
    assert _query(pg_url, "SELECT to_regclass('public.runs')") == [(None,)]


def test_schemas_are_separate_stores(pg_url: str) -> None:
    a = PostgresStore(pg_url, schema="a")
    b = PostgresStore(pg_url, schema="b")
    try:
        a.create_run(new_run("r1"))
        assert b.get_run("r1") is None
        assert b.create_run(new_run("r1", tenant="other"))[1] is True
        assert a.get_run("r1").tenant == "default"  # type: ignore[union-attr]
    finally:
        a.close()
        b.close()


def test_open_without_migrating_then_migrate(pg_url: str) -> None:
    store = PostgresStore(pg_url, schema="later", auto_migrate=False)
    try:
        assert store.schema_version() == 0
        assert store.migrate() == [m.version for m in load_migrations("postgres")]
        assert store.migrate() == []
        assert store.schema_version() == len(load_migrations("postgres"))
        assert store.create_run(new_run("r1"))[1] is True
    finally:
        store.close()


def test_concurrent_opens_migrate_exactly_once(pg_url: str) -> None:
    """Workers on many machines start together against an empty schema."""
    n = 6
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []
    stores: list[PostgresStore] = []
    lock = threading.Lock()

    def open_store() -> None:
        try:
            barrier.wait()
            store = PostgresStore(pg_url, schema="race")
            with lock:
                stores.append(store)
        except BaseException as exc:  # surfaced to the test thread below
            errors.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for store in stores:
        store.close()
    assert errors == []
    assert len(stores) == n
    rows = _query(pg_url, "SELECT version FROM race.schema_migrations ORDER BY version")
    assert rows == [(m.version,) for m in load_migrations("postgres")]


# -- durability -------------------------------------------------------------------------


@pytest.mark.parametrize(("durability", "ordinary"), [(Durability.PROCESS, "on"), (Durability.POWER, "on")])
def test_durability_modes_set_synchronous_commit(pg_url: str, durability: Durability, ordinary: str) -> None:
    """Every commit is synchronous in both modes: the database server is a
    process too, and a committed step must survive its crash."""
    store = PostgresStore(pg_url, durability=durability)
    try:
        with store._conn() as conn:
            assert conn.execute("SHOW synchronous_commit").fetchone() == (ordinary,)
        seen = store._transaction(lambda tx: tx.execute("SHOW synchronous_commit").fetchone(), durable=True)
        assert seen == ("on",)
        with store._conn() as conn:
            assert conn.execute("SHOW synchronous_commit").fetchone() == (ordinary,)
    finally:
        store.close()


def test_separate_stores_claiming_concurrently_never_share_a_run(pg_url: str) -> None:
    """Eight workers, each with its own store (as on eight machines), drain
    200 runs: every run is claimed exactly once."""
    setup = PostgresStore(pg_url)
    for i in range(200):
        setup.create_run(new_run(f"r{i:03d}"))
    n = 8
    stores = [PostgresStore(pg_url, pool_size=2) for _ in range(n)]
    barrier = threading.Barrier(n)
    got: list[list[Claim]] = [[] for _ in range(n)]
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            barrier.wait()
            while claims := stores[k].claim_runs(f"w{k}", [WF], 3, 300.0, 3):
                got[k].extend(claims)
        except BaseException as exc:  # surfaced to the test thread below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(n)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert errors == []
        ids = [c.run.run_id for claims in got for c in claims]
        assert sorted(ids) == [f"r{i:03d}" for i in range(200)]
        for k, claims in enumerate(got):
            for c in claims:
                record = setup.get_run(c.run.run_id)
                assert record is not None
                assert (record.owner, record.epoch) == (f"w{k}", 1)
                assert types(setup.history(c.run.run_id)).count(EventType.LEASE_CLAIMED) == 1
    finally:
        for store in [setup, *stores]:
            store.close()


def _race(*jobs: Callable[[], object]) -> list[BaseException | None]:
    """Run ``jobs`` on threads released at the same instant; return what
    each one raised (``None`` if it returned)."""
    barrier = threading.Barrier(len(jobs))
    raised: list[BaseException | None] = [None] * len(jobs)

    def run(k: int, job: Callable[[], object]) -> None:
        barrier.wait()
        try:
            job()
        except BaseException as exc:  # LeaseLost is a BaseException; surfaced to the caller
            raised[k] = exc

    threads = [threading.Thread(target=run, args=(k, job)) for k, job in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    return raised


def _append_until_lost(
    store: PostgresStore, clock: FakeClock, claimed: Claim, barrier: bool, appended: list[int]
) -> None:
    """The holder of ``claimed`` appends steps as fast as it can until it is
    fenced out, noting every seq the store acknowledged."""
    rid, epoch = claimed.run.run_id, claimed.run.epoch
    for seq in range(claimed.next_seq, claimed.next_seq + 10_000):
        if barrier:
            event = intent(clock, rid, seq, epoch, position=seq)
        else:
            event = ev(clock, rid, seq, epoch, position=seq)
        store.append(rid, epoch, [event], barrier=barrier)
        appended.append(seq)


_BUMPS: dict[str, tuple[Callable[[PostgresStore, str], object], list[EventType]]] = {
    "takeover": (
        lambda store, rid: claim(store, rid, "w2", max_recoveries=100),
        [EventType.LEASE_LOST, EventType.LEASE_TAKEN_OVER],
    ),
    "cancel": (lambda store, rid: store.cancel_run(rid, "race"), [EventType.RUN_CANCELLED]),
    "kill": (lambda store, rid: store.kill_runs("race", run_id=rid), [EventType.RUN_KILLED]),
}


@pytest.mark.parametrize(("bump", "rounds"), [("takeover", 300), ("cancel", 100), ("kill", 100)])
def test_fenced_append_never_lands_after_a_concurrent_epoch_bump(pg_url: str, bump: str, rounds: int) -> None:
    """A holder appends as fast as it can while another machine takes its
    run over (or an operator cancels or kills it). Whatever the interleaving,
    every append the holder was told succeeded is in the history, all of
    them come before the bump's entries, and the holder is stopped with
    ``LeaseLost``. Odd rounds use barrier appends (their own transactions)."""
    clock = FakeClock()
    holder = PostgresStore(pg_url, clock=clock)
    rival = PostgresStore(pg_url, clock=clock)
    do_bump, bump_events = _BUMPS[bump]
    raced = 0
    try:
        for i in range(rounds):
            rid = f"r{i}"
            holder.create_run(new_run(rid))
            # An already expired lease: the rival may take the run over at once.
            c = holder.claim_run(rid, "w1", -1.0, 100)
            assert c is not None
            appended: list[int] = []
            lost, bumped = _race(
                functools.partial(_append_until_lost, holder, clock, c, i % 2 == 1, appended),
                functools.partial(do_bump, rival, rid),
            )
            assert isinstance(lost, LeaseLost), lost
            assert bumped is None
            history = holder.history(rid)
            assert_gap_free(history, rid)
            tail = history[-len(bump_events) :]
            assert types(tail) == bump_events
            mine = [e.seq for e in history if e.epoch == c.run.epoch and e.position is not None]
            assert mine == appended  # every acknowledged append is there, and nothing else of the holder's
            assert all(seq < tail[0].seq for seq in mine)
            raced += bool(appended)
    finally:
        holder.close()
        rival.close()
    assert raced > 0, "the holder never got an append in before the bump: the race was not exercised"


def test_artifacts_are_shared_between_stores(pg_url: str) -> None:
    """No shared filesystem between machines: artifacts live in the database."""
    a, b = PostgresStore(pg_url), PostgresStore(pg_url)
    try:
        ref = a.put_artifact(b"x" * 100_000)
        assert b.get_artifact(ref) == b"x" * 100_000
        assert b.put_artifact(b"x" * 100_000) == ref
    finally:
        a.close()
        b.close()


def test_child_end_and_parent_suspend_racing_never_lose_the_wake_up(pg_url: str) -> None:
    """A parent suspends waiting on its child while the child finishes on
    another machine: whichever commits first, the parent ends up runnable."""
    clock = FakeClock()
    parent_side = PostgresStore(pg_url, clock=clock)
    child_side = PostgresStore(pg_url, clock=clock)
    try:
        for i in range(100):
            pid, kid = f"p{i}", f"k{i}"
            parent_side.create_run(new_run(pid))
            p = claim(parent_side, pid, "w1")
            parent_side.start_child(pid, p.run.epoch, ev(clock, pid, p.next_seq, p.run.epoch), new_run(kid))
            k = claim(child_side, kid, "w2")
            suspended = ev(clock, pid, p.next_seq + 1, p.run.epoch, EventType.RUN_SUSPENDED)
            completed = ev(clock, kid, k.next_seq, k.run.epoch, EventType.RUN_COMPLETED, worker="w2")
            raised = _race(
                functools.partial(parent_side.suspend_run, pid, p.run.epoch, suspended, None, kid),
                functools.partial(
                    child_side.finish_run, kid, k.run.epoch, completed, RunStatus.COMPLETED, None, None
                ),
            )
            assert raised == [None, None]
            woken = parent_side.claim_run(pid, "w3", LEASE, 3)
            assert woken is not None, f"round {i}: the parent was never woken"
            assert woken.history[-1].event is EventType.RUN_WOKEN
    finally:
        parent_side.close()
        child_side.close()


# -- errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://127.0.0.1:5432/db?no_such_option=1", "malformed PostgreSQL URL"),
        ("postgresql://postgres:s3cret@127.0.0.1:1/cairn", "cannot open PostgreSQL database 127.0.0.1:1"),
        ("postgresql://127.0.0.1:notaport/cairn", "PostgreSQL"),
    ],
)
def test_bad_url_or_stopped_server_is_a_one_line_store_error(url: str, expected: str) -> None:
    with pytest.raises(StoreError) as info:
        PostgresStore(url)
    message = str(info.value)
    assert expected in message
    assert "\n" not in message
    assert "s3cret" not in message


def test_missing_database_is_a_one_line_store_error(pg_databases: TestDatabases) -> None:
    with pytest.raises(StoreError, match="does not exist") as info:
        PostgresStore(pg_databases.url_for(f"{pg_databases.prefix}_missing"))
    assert "\n" not in str(info.value)


def test_lost_connection_is_a_store_error_and_the_store_recovers(pg_url: str) -> None:
    """The server drops the store's connections (a restart, a failover): the
    call in flight fails with a one-line StoreError; later calls reconnect."""
    store = PostgresStore(pg_url)
    try:
        store.create_run(new_run("r1"))
        # The second argument waits until the backends are gone.
        _query(pg_url, "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
               "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        outcomes: list[str] = []
        for _ in range(3):
            try:
                outcomes.append(repr(store.get_run("r1") is not None))
            except StoreError as exc:
                outcomes.append(str(exc))
        assert outcomes[1:] == ["True", "True"]
        assert outcomes[0].startswith("PostgreSQL error (")
        assert "\n" not in outcomes[0]
    finally:
        store.close()


def test_closed_store_is_closed_for_every_method(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    store.close()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.claim_runs("w1", [WF], 1, LEASE, 3)
    with pytest.raises(StoreError, match="closed"):
        store.schema_version()


# -- tenancy and pruning ------------------------------------------------------------------


def test_every_history_row_carries_its_runs_tenant(pg_url: str) -> None:
    clock = FakeClock()
    store = PostgresStore(pg_url, clock=clock)
    try:
        exercise_every_writer(store, clock)
    finally:
        store.close()
    rows = _query(pg_url, "SELECT h.tenant, r.tenant, count(*) FROM cairn.history h "
                  "LEFT JOIN cairn.runs r USING (run_id) GROUP BY h.tenant, r.tenant ORDER BY h.tenant")
    assert [(h, r) for h, r, _ in rows] == [("acme", "acme"), ("globex", "globex")]
    assert sum(n for _, _, n in rows) > 40
    nullable = _query(pg_url, "SELECT is_nullable FROM information_schema.columns "
                      "WHERE table_schema = 'cairn' AND table_name = 'history' AND column_name = 'tenant'")
    assert nullable == [("NO",)]


def test_migration_4_backfills_the_tenant_of_existing_history(pg_url: str) -> None:
    """A schema an older Cairn left at migration 3, with runs in it."""
    migrations = load_migrations("postgres")
    with psycopg.connect(pg_url, autocommit=True) as conn, conn.transaction():
        conn.execute("CREATE SCHEMA old")
        conn.execute("SET LOCAL search_path = old")
        conn.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
                     "applied_at DOUBLE PRECISION NOT NULL)")
        for migration in migrations[:3]:
            conn.execute(migration.sql.encode())
            conn.execute("INSERT INTO schema_migrations VALUES (%s, %s, 0)",
                         (migration.version, migration.name))
        for run_id, tenant in (("r1", "acme"), ("r2", "globex")):
            conn.execute("INSERT INTO runs (run_id, tenant, workflow, workflow_version, status, created_at, "
                         "updated_at) VALUES (%s, %s, 'wf', '1', 'pending', 0, 0)", (run_id, tenant))
            for seq in (1, 2):
                conn.execute("INSERT INTO history (run_id, seq, event, at, epoch) "
                             "VALUES (%s, %s, 'run.created', 0, 0)", (run_id, seq))
        conn.execute("INSERT INTO artifacts (ref, data) VALUES ('a', '\\x01')")
    store = PostgresStore(pg_url, schema="old")
    try:
        assert store.schema_version() == len(migrations)
        assert len(store.history("r1")) == 2
    finally:
        store.close()
    rows = _query(pg_url, "SELECT run_id, seq, tenant FROM old.history ORDER BY run_id, seq")
    assert rows == [("r1", 1, "acme"), ("r1", 2, "acme"), ("r2", 1, "globex"), ("r2", 2, "globex")]
    assert _query(pg_url, "SELECT ref, touched_at FROM old.artifacts") == [("a", 0.0)]


def test_put_artifact_records_when_it_was_last_stored(pg_url: str) -> None:
    clock = FakeClock()
    store = PostgresStore(pg_url, clock=clock)
    try:
        small = store.put_artifact(b"small")
        big = store.put_artifact(b"b" * 100_000)  # looked up before it is sent
        clock.advance(50)
        store.put_artifact(b"small")
        store.put_artifact(b"b" * 100_000)
        clock.advance(-20)  # another machine's clock, behind: the latest time stays
        store.put_artifact(b"small")
        rows = _query(pg_url, "SELECT ref, touched_at FROM cairn.artifacts ORDER BY touched_at, ref")
        assert sorted(rows) == sorted([(small, clock() + 20), (big, clock() + 20)])
    finally:
        store.close()


def _failed_run(store: PostgresStore, clock: FakeClock, rid: str) -> None:
    store.create_run(new_run(rid))
    c = claim(store, rid)
    failed = ev(clock, rid, c.next_seq, c.run.epoch, EventType.RUN_FAILED)
    store.finish_run(rid, c.run.epoch, failed, RunStatus.FAILED, None, {"type": "E", "message": ""})
    clock.advance(1)


def test_prune_locks_out_a_retry_landing_between_its_read_and_its_locks(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worst moment, forced: the prune has chosen a failed run (read
    without locks), then an operator's retry commits before the prune locks
    it. The prune must see the retry under its locks and spare the run: a
    retried run never loses its history. (A race left to the scheduler hit
    this window too rarely for a missing re-check to fail the test.)"""
    from cairn.store import postgres as pg_module

    clock = FakeClock()
    pruner = PostgresStore(pg_url, clock=clock)
    operator = PostgresStore(pg_url, clock=clock)
    real_select = pg_module._select_prunable
    interleaved: list[str] = []

    def select_then_retry(conn: Any, *args: Any) -> tuple[list[str], list[str]]:
        chosen = real_select(conn, *args)
        if not interleaved:
            assert chosen[1] == ["r1"]
            operator.retry_run("r1")  # commits now: the prune holds no lock yet
            interleaved.append("retried")
        return chosen

    try:
        _failed_run(pruner, clock, "r1")
        monkeypatch.setattr(pg_module, "_select_prunable", select_then_retry)
        assert pruner.prune_runs(clock()) == 0
        assert interleaved == ["retried"]
        record = operator.get_run("r1")
        assert record is not None
        assert record.status is RunStatus.PENDING
        assert types(operator.history("r1"))[-1] is EventType.RUN_RETRIED
        assert_gap_free(operator.history("r1"), "r1")
    finally:
        pruner.close()
        operator.close()


def test_a_retry_arriving_after_the_prunes_locks_waits_and_finds_no_run(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other worst moment, forced: the prune has locked the run and
    re-checked it; a retry now must wait for the prune to commit, then find
    no run. Without the row locks the retry would commit in between and the
    prune delete a retried run (the retry reported success, the run gone)."""
    from cairn.store import postgres as pg_module

    clock = FakeClock()
    pruner = PostgresStore(pg_url, clock=clock)
    operator = PostgresStore(pg_url, clock=clock)
    real_trees = pg_module._trees
    calls: list[int] = []
    outcome: list[BaseException | None] = []

    def retry() -> None:
        try:
            operator.retry_run("r1")
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    def waiting_on_a_lock() -> bool:
        rows = _query(pg_url, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                              "AND datname = current_database()")
        return bool(rows[0][0])

    retrier = threading.Thread(target=retry)

    def trees_then_retry(conn: Any, roots: Any) -> Any:
        found = real_trees(conn, roots)
        calls.append(len(calls))
        if len(calls) == 2:  # the re-check, under the prune's locks
            retrier.start()
            wait_until(lambda: outcome or waiting_on_a_lock(), 10, "the retry to finish or wait on a lock")
        return found

    try:
        _failed_run(pruner, clock, "r1")
        monkeypatch.setattr(pg_module, "_trees", trees_then_retry)
        pruned = pruner.prune_runs(clock())
        retrier.join(timeout=10)
        assert calls == [0, 1]
        assert pruned == 1
        assert len(outcome) == 1
        assert isinstance(outcome[0], RunNotFound), f"the retry went through during the prune: {outcome}"
        assert operator.get_run("r1") is None
        assert operator.history("r1") == []
    finally:
        pruner.close()
        operator.close()


def test_a_retry_after_a_prune_finds_no_run(pg_url: str) -> None:
    clock = FakeClock()
    pruner = PostgresStore(pg_url, clock=clock)
    operator = PostgresStore(pg_url, clock=clock)
    try:
        _failed_run(pruner, clock, "r1")
        assert pruner.prune_runs(clock()) == 1
        with pytest.raises(RunNotFound):
            operator.retry_run("r1")
        assert operator.get_run("r1") is None
        assert operator.history("r1") == []
    finally:
        pruner.close()
        operator.close()


def test_prune_and_retry_racing_leave_a_whole_run_or_none(pg_url: str) -> None:
    """Released together, whichever wins: a retried run with its history, or
    no run and a ``RunNotFound``. Every round checks that; which order the
    scheduler picks is not asserted (the forced orders above pin both)."""
    clock = FakeClock()
    pruner = PostgresStore(pg_url, clock=clock)
    operator = PostgresStore(pg_url, clock=clock)
    try:
        for i in range(40):
            rid = f"r{i}"
            _failed_run(pruner, clock, rid)
            raised = _race(functools.partial(pruner.prune_runs, clock()),
                           functools.partial(operator.retry_run, rid))
            record = operator.get_run(rid)
            if record is None:
                assert isinstance(raised[1], RunNotFound)
                assert operator.history(rid) == []
            else:
                assert raised == [None, None]
                assert record.status is RunStatus.PENDING
                assert types(operator.history(rid))[-1] is EventType.RUN_RETRIED
                assert_gap_free(operator.history(rid), rid)
                operator.cancel_run(rid, "clean up")
    finally:
        pruner.close()
        operator.close()
