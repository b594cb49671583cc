"""The audit log's page statements seek their index on both backends (issue
26; migrations SQLite 0031 / PostgreSQL 0047): a tenant's hot runs are
found by ``runs_tenant_created`` and each run's entries read by primary key
from the cursor, with no sort and no scan of ``history``; the operator
log's pages walk ``operator_log_at``; the archive records' pages walk
``run_archives_first_at`` / ``_last_at``. Checked with EXPLAIN on tables
filled and analyzed (a plan that reads the whole tenant and sorts it would
make a page's cost grow with the tenant's history)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg

import cairn
from cairn.store import postgres as pgstore
from cairn.store import sqlite as sqlitestore
from cairn.store.archivesql import ARCHIVE_PAGE

INF = float("inf")
#: a page (the archive records' size, the smallest) past the middle of each
#: table (as many rows of the tenant on either side)
PARAMS: dict[str, Any] = {"tenant": "t1", "run_id": None, "since": -INF, "after_run": "run-0005",
                          "after_seq": 17, "page": ARCHIVE_PAGE, "kind": None}
#: each page statement, the index its plan must walk (SQLite's words, PostgreSQL's) and its cursor's time
CREATED = ("INDEX runs_tenant_created (tenant=?", "runs_tenant_created")  # PostgreSQL: or a bitmap of it
USES = {"audit_log_runs_oldest": (*CREATED, 100.0), "audit_log_runs_newest": (*CREATED, 100.0),
        "audit_log_run_oldest": ("PRIMARY KEY (run_id=? AND seq>?)", "history_pkey", 100.0),
        "audit_log_run_newest": ("PRIMARY KEY (run_id=? AND seq<?)", "history_pkey", 100.0),
        "oplog_log_oldest": ("INDEX operator_log_at (tenant=?", "using operator_log_at on", 1500.0),
        "oplog_log_newest": ("INDEX operator_log_at (tenant=?", "using operator_log_at on", 1500.0),
        "audit_log_archives_oldest": ("INDEX run_archives_first_at (tenant=?",
                                      "using run_archives_first_at on", 1500.0),
        "audit_log_archives_newest": ("INDEX run_archives_last_at (tenant=?",
                                      "using run_archives_last_at on", 1500.0)}
RUNS = [(f"run-{i:04d}", f"t{i % 3}") for i in range(1, 31)]  # with entries; 3,000 runs in all
RECORDS = 3000
OPLOG = ("INSERT INTO operator_log (tenant, seq, at, kind, object_id, action, actor, auth, change, digest, "
         "link) VALUES ")
ARCHIVES = ("INSERT INTO run_archives (run_id, tenant, ref, entries, last_seq, hot_bytes, stored_bytes, "
            "archived_at, first_at, last_at) ")


def _params(at: float) -> dict[str, Any]:
    return {**PARAMS, "at": at, "after_first": at, "after_last": at + 5, "run_id": "run-0004", "seq": 100,
            "after_created": 10.0}


def _fill_sqlite(conn: sqlite3.Connection) -> None:
    """Runs, entries, archive records and operator records written straight in (a plan reads no link)."""
    conn.executemany("INSERT INTO runs (run_id, tenant, workflow, workflow_version, status, created_at, "
                     "updated_at) VALUES (?, ?, 'wf', '1', 'completed', ?, 0)",
                     [(f"run-{i:04d}", f"t{i % 3}", float(i)) for i in range(1, RECORDS + 1)])
    conn.executemany("INSERT INTO history (run_id, seq, tenant, event, at, epoch, link) "
                     "VALUES (?, ?, ?, 'step.completed', ?, 0, X'01')",
                     [(r, s, t, float(s)) for r, t in RUNS for s in range(1, 201)])
    conn.executemany(OPLOG + "(?, ?, ?, 'token', 'x', 'token.mint', 'cli:x', 'os-user', '{}', X'00', X'00')",
                     [(f"t{i % 3}", i, float(i)) for i in range(1, RECORDS + 1)])
    conn.executemany(ARCHIVES + "VALUES (?, ?, 'ref', 1, 1, 1, 1, 0, ?, ?)",
                     [(f"arch-{i:04d}", f"t{i % 3}", float(i), float(i + 5)) for i in range(1, RECORDS + 1)])


def _fill_postgres(conn: psycopg.Connection[Any]) -> None:
    conn.execute("INSERT INTO runs (run_id, tenant, workflow, workflow_version, status, created_at, "
                 "updated_at) SELECT 'run-' || lpad(i::text, 4, '0'), 't' || (i %% 3), 'wf', '1', "
                 "'completed', i, 0 FROM generate_series(1, %s) AS i", (RECORDS,))
    conn.execute("INSERT INTO history (run_id, seq, event, at, epoch, tenant, link) "
                 "SELECT r.run_id, s, 'step.completed', s, 0, r.tenant, '\\x01'::bytea "
                 "FROM runs AS r, generate_series(1, 200) AS s WHERE r.run_id <= 'run-0030'")
    conn.execute(OPLOG.removesuffix("VALUES ") + "SELECT 't' || (i %% 3), i, i, 'token', 'x', 'token.mint', "
                 "'cli:x', 'os-user', '{}', '\\x00'::bytea, '\\x00'::bytea FROM generate_series(1, %s) AS i",
                 (RECORDS,))
    conn.execute(ARCHIVES + "SELECT 'arch-' || lpad(i::text, 4, '0'), 't' || (i %% 3), 'ref', 1, 1, 1, 1, 0, "
                 "i, i + 5 FROM generate_series(1, %s) AS i", (RECORDS,))
    conn.execute("ANALYZE")


def test_sqlite_pages_seek_their_index(tmp_path: Path) -> None:
    path = tmp_path / "cairn.db"
    cairn.App(db=f"sqlite:///{path}").close()  # migrated
    with sqlite3.connect(path) as conn:
        _fill_sqlite(conn)
        conn.execute("ANALYZE")
        for name, (index, _, at) in USES.items():
            rows = conn.execute("EXPLAIN QUERY PLAN " + sqlitestore._Q[name], _params(at))
            plan = "\n".join(r[3] for r in rows)
            assert index in plan.splitlines()[0], (name, plan)
            assert "SCAN h" not in plan, (name, plan)
            assert "TEMP B-TREE" not in plan, (name, plan)
            assert "SCAN" not in plan, (name, plan)


def test_postgres_pages_seek_their_index(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SET search_path = cairn")
        _fill_postgres(conn)
        for name, (_, index, at) in USES.items():
            rows = conn.execute("EXPLAIN (COSTS OFF) " + pgstore._Q[name], _params(at)).fetchall()
            plan = "\n".join(r[0] for r in rows)
            assert index in plan, (name, plan)
            # no sort of what was read (an incremental one, of the rows that tie on the index, is fine)
            nodes = [line.strip().removeprefix("->").strip() for line in plan.splitlines()]
            sorts = [node for node in nodes if node.startswith("Sort") and "Key" not in node]
            if not name.startswith("audit_log_run_"):  # (one run's rows may be sorted: bounded by the run)
                assert not sorts, (name, plan)
            assert "Seq Scan" not in plan, (name, plan)
