"""PostgreSQL: the index of ``lg_writes`` stays small while its rows come and
go. Under LangGraph's default durability (``"async"``) a node's writes reach
the saver before its checkpoint's put commits, so they are rows of
``lg_writes``, deleted a super-step later by the fold. A deleted row's key
stays in the index until a scan marks it dead or a ``VACUUM`` runs: the
index grew by every key ever inserted (385 bytes a super-step at 3,000).
The fold's ``DELETE`` walks the thread's keys up to the parent's by the index
(``lg_fold_writes``; ``lg_lock_thread`` turns sequential scans off for the
write's transaction, which the planner took once the table was vacuumed
empty), so the keys earlier folds deleted are marked dead and the page they
fill is cleaned instead of split."""

from __future__ import annotations

import time
from typing import Any

import cairn
from tests.engine.conftest import postgres_url
from tests.langgraph.rawsql import raw_sql
from tests.store.pg import TestDatabases
from tests.timing import SLACK

STEPS = 300


def _wait_for_no_other_transaction(url: str) -> None:
    """Wait until no other session on the server holds a transaction id.
    A fold's walk marks a deleted key dead only once no snapshot can see its
    row, and a snapshot's horizon is the oldest transaction running anywhere
    on the server, in any database: one held by another database for the
    whole loop leaves every key unmarked (16 pages, as without the walk), for
    its first 40 steps one split (4 pages), measured by holding one."""
    deadline = time.monotonic() + 20 * SLACK
    while True:
        holders = raw_sql(url, "SELECT datname, left(query, 60) FROM pg_stat_activity"
                               " WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()")
        if not holders:
            return
        assert time.monotonic() < deadline, f"other sessions keep transactions open: {holders}"
        time.sleep(0.05)


def test_the_index_of_lg_writes_does_not_grow_with_folded_writes(
        pg_url: str, pg_databases: TestDatabases) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    from cairn.langgraph import CairnSaver

    url = postgres_url(pg_url)
    # the tests' databases are copied and dropped in the background, each copy and drop a
    # transaction: the loop runs once they are done (one of them, slow under load, was the flake)
    pg_databases.wait_idle()
    _wait_for_no_other_transaction(url)
    raw_sql(url, "VACUUM lg_writes")  # the statistics of an empty table: what made the planner scan it
    app = cairn.App(db=url, lease_seconds=5.0)
    try:
        saver = CairnSaver(app, tenant="acme")
        parent: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        version = None
        for n in range(STEPS):
            checkpoint = empty_checkpoint()
            version = saver.get_next_version(version, None)
            checkpoint["channel_values"] = {"n": n}
            checkpoint["channel_versions"] = {"n": version}
            at = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": checkpoint["id"]}}
            # as LangGraph's "async" loop does it: the writes before their checkpoint is stored
            saver.put_writes(at, [("n", n + 1), ("log", [f"step {n}"]), ("branch:to:x", None)],
                             f"task-{n:04d}-{'x' * 30}")
            parent = saver.put(parent, checkpoint, {"source": "loop", "step": n}, {"n": version})
        latest = saver.get_tuple({"configurable": {"thread_id": "t"}})
        assert latest is not None
        assert len(latest.pending_writes or []) == 3
    finally:
        app.close()
    live = int(raw_sql(url, "SELECT count(*) FROM lg_writes")[0][0])
    assert live == 3, "only the latest checkpoint's writes are rows"
    raw_sql(url, "VACUUM lg_writes")
    size = int(raw_sql(url, "SELECT pg_relation_size('lg_writes_pkey')")[0][0])
    # 900 keys of ~130 bytes were inserted: 16 pages when no page is cleaned; 2 when every fold
    # marks the keys before it (measured: 2 in every run on a quiet server). A key is not marked
    # while a transaction older than its delete runs anywhere on the server (autovacuum is off on
    # the tests' cluster; the background copies and drops of databases were the ones, now waited
    # out), and a later fold marks it unless its page split first: ~40 steps of such a transaction
    # cost one split. Half the unreclaimed size stays the bound, for sessions we cannot wait out
    assert size <= 8 * 8192, f"lg_writes_pkey is {size:,} bytes after {STEPS} folds"
