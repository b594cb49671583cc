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

from typing import Any

import cairn
from tests.engine.conftest import postgres_url
from tests.langgraph.rawsql import raw_sql

STEPS = 300


def test_the_index_of_lg_writes_does_not_grow_with_folded_writes(pg_url: str) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    from cairn.langgraph import CairnSaver

    url = postgres_url(pg_url)
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
    # marks the keys before it; a key not marked when a concurrent snapshot (an autovacuum's
    # ANALYZE of this database) still saw its row is marked by a later fold, unless its page
    # split first: half the unreclaimed size is the bound
    assert size <= 8 * 8192, f"lg_writes_pkey is {size:,} bytes after {STEPS} folds"
