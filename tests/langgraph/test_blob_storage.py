"""PostgreSQL keeps a list channel's long version row in its page, not in
TOAST (migration 0046, ``STORAGE MAIN``): the Fenwick spine's long deltas
(2 KB of digests at version 256) otherwise gave ``lg_blobs`` a TOAST
relation, its maps and its index, 57 KB of a 300-step thread for 2 KB of
digests. SQLite has no TOAST; its overflow pages are not this."""

from __future__ import annotations

from typing import Any

import cairn
from tests.engine.conftest import postgres_url
from tests.langgraph.rawsql import raw_sql


def test_a_long_list_version_stays_in_its_row(pg_url: str) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    from cairn.langgraph import CairnSaver

    url = postgres_url(pg_url)
    app = cairn.App(db=url, lease_seconds=5.0)
    try:
        saver = CairnSaver(app, tenant="acme")
        items = [f"message {i:04d}" for i in range(600)]  # a list written whole: 600 digests, 4,800 bytes
        checkpoint: Any = empty_checkpoint()
        checkpoint["channel_values"] = {"m": items}
        checkpoint["channel_versions"] = {"m": "1"}
        config = saver.put({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, checkpoint,
                           {"source": "input", "step": -1}, {"m": "1"})
        assert raw_sql(url, "SELECT length(refs) FROM lg_blobs") == [(4800,)]
        toast = raw_sql(url, "SELECT pg_relation_size(reltoastrelid) FROM pg_class "
                        "WHERE oid = 'lg_blobs'::regclass")
        assert toast == [(0,)]
        found = CairnSaver(app, tenant="acme").get_tuple(config)
        assert found is not None
        assert found.checkpoint["channel_values"]["m"] == items
    finally:
        app.close()
