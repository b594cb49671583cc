"""``rows`` maps rows by position, once for both dialects: every statement
that returns runs or history entries must list exactly ``RUN_COLUMNS`` /
``EVENT_COLUMNS``, in that order. Checked against the real databases'
descriptions of each statement's result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cairn.store.postgres import _Q as PG_QUERIES
from cairn.store.postgres import PostgresStore
from cairn.store.rows import EVENT_COLUMNS, RUN_COLUMNS
from cairn.store.sqlite import _Q as SQLITE_QUERIES
from cairn.store.sqlite import SQLiteStore

_UPDATES = ["claim_many", "quarantine", "cancel", "retry", "kill", "reopen", "halt", "set_budget"]
RUN_QUERIES = {"sqlite": ["select_run", "list_runs", *_UPDATES],
               "postgres": ["select_run", "list_runs", "lock_run", *_UPDATES]}
EVENT_QUERIES = ["select_history", "select_histories"]

# Parameters that match nothing (so nothing changes), for every statement above.
NOTHING: dict[str, Any] = {
    "run_id": "absent", "tenant": None, "workflow": None, "thread_id": None, "parent_run_id": None,
    "statuses": None, "limit": 1, "worker": "w", "lease_until": 0.0, "now": 0.0, "recoveries": 0,
    "error": None, "budget": None, "fence": 0, "after_seq": 0,
}


def _names(description: Any) -> tuple[str, ...]:
    return tuple(column[0].split(".")[-1] for column in description)


def test_sqlite_statements_list_the_mapped_columns(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "c.db")
    try:
        conn = store._conn()
        params = {**NOTHING, "claims": "[]", "run_ids": "[]"}
        for name in RUN_QUERIES["sqlite"]:
            assert _names(conn.execute(SQLITE_QUERIES[name], params).description) == RUN_COLUMNS, name
        for name in EVENT_QUERIES:
            assert _names(conn.execute(SQLITE_QUERIES[name], params).description) == EVENT_COLUMNS, name
    finally:
        store.close()


def test_postgres_statements_list_the_mapped_columns(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    try:
        with store._conn() as conn, conn.transaction():
            for name in RUN_QUERIES["postgres"]:
                arrays: dict[str, Any] = {"run_ids": [], "recoveries": []} if name == "claim_many" else {}
                cursor = conn.execute(PG_QUERIES[name], {**NOTHING, **arrays})
                assert _names(cursor.description) == RUN_COLUMNS, name
            for name in EVENT_QUERIES:
                cursor = conn.execute(PG_QUERIES[name], {**NOTHING, "run_ids": []})
                assert _names(cursor.description) == EVENT_COLUMNS, name
    finally:
        store.close()
