"""Each dialect's ``schema.sql`` is exactly what its migrations produce, and
both dialects offer the same queries except for named, explained ones.

``schema.sql`` is the schema a reader should not have to assemble from the
migrations; it is only worth having if it cannot drift. So one database gets
every migration (through the store, as in production) and another gets
``schema.sql``, and their schemas must be identical: on SQLite the
``sqlite_master`` definitions, normalized for whitespace, comments and
quoting; on PostgreSQL ``pg_dump --schema-only`` of the store's schema, which
covers columns (types, defaults, nullability), constraints, indexes,
functions, triggers and row-level security policies.
"""

from __future__ import annotations

import difflib
import os
import re
import secrets
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from cairn.store.postgres import PostgresStore
from cairn.store.sqlfiles import load_queries
from cairn.store.sqlite import SQLiteStore
from tests import pgcluster

# -- the queries each dialect offers -----------------------------------------------------------

#: Queries only SQLite has, and why. SQLite serialises every writer on one
#: database lock, so it reads then writes inside its transaction, one row at
#: a time where that is cheapest; artifacts are files beside the database.
SQLITE_ONLY = {
    "lg_blob_chains": "a LangGraph checkpoint's chains, one read at a time (PostgreSQL: lg_page_reads)",
    "lg_values": "a LangGraph checkpoint's values, one thread at a time (PostgreSQL: lg_page_values)",
    "lg_writes_of": "a LangGraph checkpoint's writes, one read at a time (PostgreSQL: lg_page_reads)",
    "lg_set_folded": "a checkpoint's folded pending writes written into its row (PostgreSQL: in the "
                     "insert of the checkpoint that folds them, lg_put_checkpoint)",
    "lg_thread_holder": "a LangGraph thread's holder, read for the client's fence (checkpointsql.hold_rule; "
                        "PostgreSQL: lg_hold, the same rule in the server)",
    "lg_take_thread": "a LangGraph thread taken by the client's fence (PostgreSQL: in lg_hold)",
    "lg_put_blob": "a list channel's version, its base's depth read by the insert (PostgreSQL: "
                   "lg_put_blobs_many, all of a put's in one statement)",
    "lg_put_record": "a put_writes' record appended to its checkpoint's row, a pending one if it is not "
                     "stored, the fence checked by the insert (PostgreSQL: lg_put_writes_many, the row or "
                     "else rows of lg_writes in one statement)",
    "lg_delete_pending": "the pending rows of a thread's checkpoints not stored (PostgreSQL: rows of "
                         "lg_writes, lg_delete_orphan_writes)",
    "audit_previous": "the entry before an appended one, read for its audit link (PostgreSQL: in the insert)",
    "rekey_spilled_set": "a re-encrypted payload too large for its row is written back out of it",
    "ws_put_object": "one workspace object per statement (PostgreSQL: ws_put_objects, all in one)",
    "insert_history_payload": "a history payload too large for its row goes out of it (PostgreSQL: TOAST)",
    "search_nearest_vectors": "sqlite-vec scores the nearest vectors before their items are checked "
                              "(PostgreSQL: pgvector's scan joins by hash, search_vectors alone)",
    "insert_run": "a run is created inside the write transaction (PostgreSQL: create_run, one statement)",
    "insert_event": "unfenced append inside a write transaction (PostgreSQL: append_auto)",
    "renew_lease": "renews one lease per statement (PostgreSQL: renew_leases, all in one statement)",
    "finish": "the end of a run under the write lock (PostgreSQL: finish_fenced after lock_fenced)",
    "queue_artifact": "an artifact file is queued for collection before it is written (PostgreSQL: "
                      "put_artifact queues it in the same statement)",
    "next_queue": "the lane walk takes one index seek per statement (PostgreSQL: select_lanes, one "
                  "recursive query)",
    "next_tenant": "the lane walk, as next_queue",
    "lane_candidates": "the lane walk, as next_queue",
    "queue_running": "counts running runs directly (PostgreSQL: queue_running_totals, through a "
                     "SECURITY DEFINER function, since row-level security hides other tenants' runs)",
    "upsert_bucket": "one token bucket per statement (PostgreSQL: spend_tenant_tokens and "
                     "spend_queue_tokens, through SECURITY DEFINER functions)",
    "insert_created_events": "a run created held: its three first entries in one statement with the "
                             "tenant bound (PostgreSQL: create_run, the run and its entries in one)",
    "insert_event_next": "the fenced append without reading history, when the store appended the "
                         "run's last entry itself (a read of the inserted table costs a temporary copy in "
                         "SQLite; PostgreSQL's trigger keeps time monotonic)",
}

#: Queries only PostgreSQL has, and why. PostgreSQL has row locks instead of
#: one database lock, pays a round trip per statement, and keeps artifacts in
#: the database.
POSTGRES_ONLY = {
    "insert_event_linked": "a step's entry with its audit link computed by the client from the one it "
                           "wrote before, stored only if that link is still there (SQLite: "
                           "insert_event_next, its writer the only one)",
    "lg_page_reads": "a page of LangGraph checkpoints' chains and writes in one round trip (SQLite: "
                     "a statement per checkpoint, no round trips)",
    "lg_read_one": "a LangGraph checkpoint with its chains, writes and values in one round trip, from "
                   "columns the server reads (SQLite: a statement is a call, lg_checkpoint and the rest)",
    "lg_read_page": "a page of LangGraph checkpoints with their chains, writes and values in one round "
                    "trip, as lg_read_one (SQLite: a statement is a call)",
    "lg_hold": "a LangGraph thread's lock, holder and fence in one statement, so a write is one message with "
               "its COMMIT (SQLite: in-process, the client's rule, lg_thread_holder and lg_take_thread)",
    "lg_page_values": "a page's LangGraph values in one round trip (SQLite: per thread)",
    "lg_put_values_many": "a LangGraph put's rows in one statement per table (SQLite: row by row)",
    "lg_put_blobs_many": "a LangGraph put's rows in one statement per table (SQLite: row by row)",
    "lg_put_writes_many": "a LangGraph put's rows in one statement per table (SQLite: row by row)",
    "ws_put_objects": "every workspace object of a batch in one statement (round trips)",
    "create_run": "the run and its first entries in one autocommit statement (one round trip)",
    "create_run_row": "create_run in two statements, for a tenant's role (the history policy checks the run)",
    "create_run_entries": "create_run in two statements, for a tenant's role",
    "append_auto": "append after the current maximum seq, for writers holding the run row FOR UPDATE",
    "insert_events_fenced": "a fenced batch append in one statement (round trips)",
    "renew_leases": "every lease of a worker renewed in one statement",
    "lock_fenced": "row lock under the checked epoch (SQLite: the database write lock)",
    "lock_runs": "row locks on a set of runs in one order (no deadlock between operators)",
    "lock_run": "row lock on one run for an operator action",
    "lock_queues": "row locks serialising claims of a limited queue",
    "finish_fenced": "the end of a run after lock_fenced, in one statement",
    "select_lanes": "the lane walk as one recursive query (one round trip)",
    "queue_running_totals": "calls the SECURITY DEFINER function that counts across tenants",
    "spend_tenant_tokens": "per-tenant token buckets are spent through a SECURITY DEFINER function that "
                           "charges only what the transaction claimed (tenant roles cannot write them)",
    "put_artifact": "artifacts are rows here (SQLite: files)",
    "touch_artifact": "artifacts are rows here (SQLite: files)",
    "get_artifact": "artifacts are rows here (SQLite: files)",
    "delete_stale_artifacts": "artifacts are rows here (SQLite: files deleted by the store)",
    "store_artifact": "a tenant's role stores artifact rows only through a SECURITY DEFINER function",
    "put_artifact_at": "artifacts are rows here (SQLite: files)",
    "touch_artifact_at": "artifacts are rows here (SQLite: files)",
    "replace_artifact": "artifacts are rows here (SQLite: a file renamed over under the exclusive lock)",
    "store_artifact_at": "a tenant's role stores an artifact under a name only through a SECURITY DEFINER "
                         "function, which never replaces bytes",
    "spend_queue_tokens": "queue-wide token buckets are spent through a SECURITY DEFINER function that "
                          "charges only what the transaction claimed (tenant roles cannot write them)",
    "role_scope": "row-level security and tenant grants are PostgreSQL's (SQLite has no roles)",
    "upsert_vector_with_pgvector": "a stored vector and pgvector's copy of it in one statement, where the "
                                   "extension exists (SQLite: sqlite-vec scores the stored blob itself)",
    "cool_vector_with_pgvector": "a cooled vector leaves pgvector's column in the same UPDATE",
    "has_pgvector": "whether migration 0016 could add pgvector's column, and the extension's schema",
    "search_without_pgvector": "the rows in scope pgvector cannot score (cold, or without pgvector's copy)",
}



def _quoted_across_lines(text: str) -> list[int]:
    """The lines of ``text`` (SQL) that end inside a quoted string or
    identifier ('...', "...", $tag$...$tag$); comments are skipped."""
    found: list[int] = []
    i, line, quote = 0, 1, ""
    while i < len(text):
        ch = text[i]
        if ch == "\n":
            if quote:
                found.append(line)
            line += 1
        if quote:
            if text.startswith(quote, i):
                if quote in ("'", '"') and text.startswith(quote * 2, i):
                    i += 2  # a doubled quote inside: still quoted
                    continue
                i += len(quote)
                quote = ""
                continue
            i += 1
            continue
        if text.startswith("--", i):
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
            continue
        if ch in ("'", '"'):
            quote = ch
        elif ch == "$":
            end = text.find("$", i + 1)
            tag = text[i:end + 1] if end > 0 else ""
            if tag and all(c.isalnum() or c == "_" for c in tag[1:-1]) and not tag[1:2].isdigit():
                quote = tag
                i = end + 1
                continue
        i += 1
    return found


def test_no_query_quotes_across_lines() -> None:
    """``load_queries`` leaves out each line's indentation (psycopg caches
    the parse of statements of at most 4,096 bytes only: issue 24,
    2026-12-07), which is whitespace between tokens unless a quoted string
    spans lines: none does, in either dialect."""
    from importlib import resources

    assert _quoted_across_lines("SELECT 'a\n  b'") == [1]
    assert _quoted_across_lines("SELECT $x$a\n b$x$, 'it''s' -- don't\nFROM t") == [1]
    assert _quoted_across_lines("SELECT 'it''s' -- don't\nFROM t") == []
    for dialect in ("sqlite", "postgres"):
        text = resources.files("cairn.store").joinpath("sql", dialect, "queries.sql").read_text("utf-8")
        assert _quoted_across_lines(text) == [], dialect
        for name, statement in load_queries(dialect).items():
            assert not any(ln[:1].isspace() for ln in statement.splitlines()), name

def test_both_dialects_offer_the_same_queries_except_the_listed_ones() -> None:
    sqlite_names = set(load_queries("sqlite"))
    postgres_names = set(load_queries("postgres"))
    shared = sqlite_names & postgres_names
    assert len(shared) >= 20, f"too few shared queries to mean anything: {sorted(shared)}"
    unlisted_sqlite = sorted(sqlite_names - postgres_names - set(SQLITE_ONLY))
    unlisted_postgres = sorted(postgres_names - sqlite_names - set(POSTGRES_ONLY))
    assert not unlisted_sqlite, f"SQLite-only queries without a reason in SQLITE_ONLY: {unlisted_sqlite}"
    assert not unlisted_postgres, (f"PostgreSQL-only queries without a reason in POSTGRES_ONLY: "
                                   f"{unlisted_postgres}")
    stale = sorted((set(SQLITE_ONLY) - (sqlite_names - postgres_names))
                   | (set(POSTGRES_ONLY) - (postgres_names - sqlite_names)))
    assert not stale, f"listed as dialect-only but now shared or gone (remove from the lists): {stale}"


# -- SQLite ------------------------------------------------------------------------------------


def schema_text(dialect: str) -> str:
    return resources.files("cairn.store").joinpath("sql", dialect, "schema.sql").read_text("utf-8")


def normalized(definition: str) -> str:
    """A definition with comments, identifier quotes and layout taken out
    (``ALTER TABLE ... RENAME`` quotes the new name; ``ADD COLUMN`` splices
    the column into the stored text with its own spacing)."""
    text = re.sub(r"--[^\n]*", " ", definition)
    text = re.sub(r'"(\w+)"', r"\1", text)
    text = re.sub(r"\s+", " ", text)
    return re.sub(r"\s*([(),])\s*", r"\1", text).strip()


def sqlite_schema(path: Path) -> list[tuple[str, str, str, str]]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
    finally:
        conn.close()
    return sorted((kind, name, table, normalized(definition or "")) for kind, name, table, definition in rows)


def test_sqlite_schema_sql_is_what_the_migrations_produce(tmp_path: Path) -> None:
    SQLiteStore(str(tmp_path / "migrated.db")).close()
    conn = sqlite3.connect(tmp_path / "declared.db")
    try:
        conn.executescript(schema_text("sqlite"))
    finally:
        conn.close()
    migrated = sqlite_schema(tmp_path / "migrated.db")
    declared = sqlite_schema(tmp_path / "declared.db")
    assert {name for kind, name, _, _ in migrated if kind == "table"} >= {"runs", "history", "queues"}
    assert declared == migrated, "schema.sql differs from the migrations:\n" + "\n".join(
        difflib.unified_diff([" | ".join(r) for r in migrated], [" | ".join(r) for r in declared],
                             "migrations", "schema.sql", lineterm=""))


# -- PostgreSQL --------------------------------------------------------------------------------

SCHEMA = "cairn"


def pg_dump_binary() -> str:
    bindir = pgcluster.find_bindir()
    found = str(bindir / "pg_dump") if bindir is not None and (bindir / "pg_dump").is_file() else None
    found = found or shutil.which("pg_dump")
    if found is None:
        pgcluster.unavailable("no pg_dump to compare PostgreSQL schemas with")
    assert found is not None
    return found


@pytest.fixture
def two_databases(pg_admin_url: str) -> Iterator[tuple[str, str]]:
    """Two empty databases (not template copies: those are migrated already)."""
    names = [f"cairn_schema_{os.getpid()}_{secrets.token_hex(3)}_{kind}" for kind in ("migrated", "declared")]
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        for name in names:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(pg_admin_url, dbname=names[0]), make_conninfo(pg_admin_url, dbname=names[1])
    finally:
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            for name in names:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def pg_schema(conninfo: str) -> list[str]:
    done = subprocess.run([pg_dump_binary(), "--schema-only", "--schema", SCHEMA, "--dbname", conninfo],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    # comments, blank lines, and pg_dump's per-dump \restrict token say nothing about the schema
    return [line for line in done.stdout.splitlines()
            if line.strip() and not line.startswith(("--", "\\restrict", "\\unrestrict"))]


@pytest.mark.slow
def test_postgres_schema_sql_is_what_the_migrations_produce(two_databases: tuple[str, str]) -> None:
    migrated_url, declared_url = two_databases
    PostgresStore(migrated_url, schema=SCHEMA).close()
    with psycopg.connect(declared_url) as conn, conn.transaction():
        # as PostgresStore._migrate runs a migration: in the schema, search_path set for the transaction
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA)))
        conn.execute("SELECT set_config('search_path', %s, true)", (sql.Identifier(SCHEMA).as_string(conn),))
        conn.execute(schema_text("postgres").encode())
    migrated = pg_schema(migrated_url)
    declared = pg_schema(declared_url)
    assert any("CREATE POLICY tenant_isolation" in line for line in migrated), "\n".join(migrated)
    assert declared == migrated, "schema.sql differs from the migrations:\n" + "\n".join(
        difflib.unified_diff(migrated, declared, "migrations", "schema.sql", lineterm=""))
    # what grant_tenant grants is data (tenant_privileges), which pg_dump --schema-only leaves out
    granted = sql.SQL("SELECT * FROM {}.tenant_privileges ORDER BY object_name").format(
        sql.Identifier(SCHEMA))
    with psycopg.connect(migrated_url) as m, psycopg.connect(declared_url) as d:
        assert m.execute(granted).fetchall() == d.execute(granted).fetchall()
