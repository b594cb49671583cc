"""A list channel's version is stored as the items it added over its base
only while the base is stored and its chain stays below ``max_depth``; else
it is stored whole, so a read walks at most ``max_depth`` rows
(``SQLCheckpoints.lg_put``). SQLite reads the base's depth in the insert
itself since 2026-12-07 (issue 24: one statement a version, not two), as
PostgreSQL's ``lg_put_blobs_many`` does."""

from __future__ import annotations

import uuid
from typing import Any

import cairn
from cairn.store.checkpointsql import BlobRow, CheckpointRow, Holder, ThreadKey, pack_refs
from tests.langgraph.rawsql import raw_sql


def test_a_version_is_a_delta_below_max_depth_and_whole_at_it_or_without_its_base(
        app: cairn.App, db_url: str) -> None:
    store: Any = app.store
    key = ThreadKey("acme", "t", "")
    holder = Holder("me", None)
    parent = None
    puts = [("1", None), ("2", "1"), ("3", "2"), ("4", "3"), ("5", "4"), ("6", "missing"), ("7", "7")]
    for n, (version, base) in enumerate(puts, start=1):
        checkpoint_id = str(uuid.UUID(int=n))
        refs = pack_refs(range(n))  # n items; the last one is what this version added
        row = CheckpointRow("t", "", checkpoint_id, parent, "msgpack", b"\x80", "msgpack", b"\x80")
        blob = BlobRow("m", version, "list", refs, base, pack_refs([n - 1]))
        epoch, collected = store.lg_put(key, holder, row, None, [blob], [], max_depth=3)
        holder = Holder("me", epoch, collected=collected)
        parent = checkpoint_id
    stored = raw_sql(db_url, "SELECT version, base, depth, length(refs) FROM lg_blobs ORDER BY version")
    assert stored == [
        ("1", None, 0, 8),
        ("2", "1", 1, 8),  # its added item
        ("3", "2", 2, 8),
        ("4", None, 0, 32),  # its base's chain is as deep as max_depth allows: whole
        ("5", "4", 1, 8),
        ("6", None, 0, 48),  # its base is not stored: whole
        ("7", None, 0, 56),  # its own version named as its base: whole
    ]
