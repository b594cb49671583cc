"""``cairn audit verify`` on PostgreSQL walks ``history``'s primary key
whatever the statistics (issue 26): on a table filled since its last ANALYZE
(here: never analyzed, autovacuum off) the planner had chosen a sequential
scan that sorted the whole table for every page (111k entries/s against
208k/s once analyzed). The page statement, begun as the store begins it,
plans as an index scan of ``history_pkey`` with no sort, for every scope the
verifier reads (all, a tenant, a run); and the store's own pages take no
sequential scan of ``history`` (the server's scan counters)."""

from __future__ import annotations

import time
from typing import Any

import psycopg

import cairn
from cairn.store import postgres as pgstore
from cairn.store.auditsql import PAGE
from tests.engine.conftest import postgres_url

RUNS, STEPS = 20, 400

SCOPES: list[dict[str, Any]] = [
    {"tenant": None, "run_id": None, "after_run": "", "after_seq": 0},
    {"tenant": None, "run_id": None, "after_run": "run-0005", "after_seq": 17},
    {"tenant": "t1", "run_id": None, "after_run": "", "after_seq": 0},
    {"tenant": None, "run_id": "run-0007", "after_run": "", "after_seq": 0},
]


def _fill(conn: psycopg.Connection[Any]) -> None:
    """Runs and entries written straight in (their links do not matter to a plan), never analyzed."""
    conn.execute("ALTER TABLE history SET (autovacuum_enabled = false)")
    conn.execute("ALTER TABLE runs SET (autovacuum_enabled = false)")
    conn.execute("INSERT INTO runs (run_id, tenant, workflow, workflow_version, status, created_at, "
                 "updated_at) SELECT 'run-' || lpad(i::text, 4, '0'), 't' || (i %% 3), 'wf', '1', "
                 "'completed', i, i FROM generate_series(1, %s) AS i", (RUNS,))
    conn.execute("INSERT INTO history (run_id, seq, event, at, epoch, tenant, detail, digest, link) "
                 "SELECT r.run_id, s, 'step.completed', s, 0, r.tenant, repeat('x', 200), "
                 "sha256(s::text::bytea), sha256(s::text::bytea) FROM runs AS r, generate_series(1, %s) AS s",
                 (STEPS,))
    assert not conn.execute("SELECT 1 FROM pg_stats WHERE tablename = 'history'").fetchall(), \
        "history has statistics: the test would not show the fresh table's plan"


def _scans(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute("SELECT seq_scan, coalesce(idx_scan, 0) FROM pg_stat_user_tables "
                       "WHERE relname = 'history' AND schemaname = 'cairn'").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_the_verifiers_pages_walk_the_primary_key_without_statistics(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SET search_path = cairn")
        _fill(conn)
        for scope in SCOPES:
            psycopg.ClientCursor(conn).execute(pgstore._AUDIT_BEGIN)
            plan = "\n".join(r[0] for r in conn.execute(
                "EXPLAIN (COSTS OFF) " + pgstore._Q["audit_entries"], {**scope, "page": PAGE}).fetchall())
            conn.execute("ROLLBACK")
            assert "Index Scan using history_pkey on history" in plan, plan
            assert "Sort" not in plan, plan
            assert "Seq Scan" not in plan, plan

        before = _scans(conn)
        with cairn.App(db=postgres_url(pg_url)) as app:
            store: Any = app.store
            read = list(store.audit_entries())
            assert len(read) == RUNS * STEPS
            assert [(r[0], r[1]) for r in read] == sorted((r[0], r[1]) for r in read)
            of_t1 = sum(i % 3 == 1 for i in range(1, RUNS + 1)) * STEPS
            assert len(list(store.audit_entries(tenant="t1"))) == of_t1
        deadline = time.monotonic() + 10  # a backend reports its counters within a second or so
        while (after := _scans(conn))[1] < before[1] + RUNS * STEPS // PAGE and time.monotonic() < deadline:
            time.sleep(0.2)
        assert after[1] >= before[1] + RUNS * STEPS // PAGE, (before, after)  # a page is one index scan
        assert after[0] == before[0], f"the store's pages scanned history sequentially: {before} -> {after}"
        assert not conn.execute("SELECT 1 FROM pg_stats WHERE tablename = 'history'").fetchall()
