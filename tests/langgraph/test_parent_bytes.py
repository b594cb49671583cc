"""PostgreSQL stores a checkpoint's parent id packed (migration 0049): a
canonical lowercase UUID (LangGraph's uuid6 ids) in 17 bytes, not 37; any
other id as its UTF-8 bytes behind a tag. Every read gives back the id as it
was written, and rows stored before the migration are rewritten by it and
read the same."""

from __future__ import annotations

from typing import Any

import cairn
from tests.engine.conftest import postgres_url
from tests.langgraph.rawsql import raw_sql

UUID = "1f1f1c55-ddfd-6591-812c-7c10ecff0fa5"
#: each checkpoint's id; the one before it is its parent
IDS = ["plain id", UUID.upper(), UUID, "é ü", UUID + " ", UUID.replace("-", ""),
       "1f1f1c55-ddfd-6591-812c-7c10ecff0fa6"]


def _conf(checkpoint_id: str | None = None) -> Any:
    conf = {"thread_id": "t", "checkpoint_ns": ""}
    return {"configurable": conf if checkpoint_id is None else {**conf, "checkpoint_id": checkpoint_id}}


def _parents(app: cairn.App) -> list[tuple[str, str | None]]:
    """Each checkpoint's parent as a new saver reads it: one by one, then as a listing."""
    from cairn.langgraph import CairnSaver

    def parent(t: Any) -> str | None:
        return None if t.parent_config is None else str(t.parent_config["configurable"]["checkpoint_id"])

    saver = CairnSaver(app, tenant="acme")
    one = [(c, parent(CairnSaver(app, tenant="acme").get_tuple(_conf(c)))) for c in IDS]
    listed = [(t.config["configurable"]["checkpoint_id"], parent(t)) for t in saver.list(_conf())]
    return sorted(one) + sorted(listed)


def test_parent_ids_are_packed_and_read_back_as_written(pg_url: str) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    from cairn.langgraph import CairnSaver

    url = postgres_url(pg_url)
    app = cairn.App(db=url, lease_seconds=5.0)
    try:
        saver = CairnSaver(app, tenant="acme")
        for parent, checkpoint_id in zip([None, *IDS], IDS, strict=False):
            checkpoint = empty_checkpoint()
            checkpoint["id"] = checkpoint_id
            saver.put(_conf(parent), checkpoint, {"source": "input", "step": -1}, {})
        expected = [(c, p) for c, p in zip(IDS, [None, *IDS], strict=False)]
        read = _parents(app)
        assert read == sorted(expected) * 2
        stored = dict(raw_sql(url, "SELECT checkpoint_id, length(parent_id) FROM lg_checkpoints"))
        assert stored[IDS[0]] is None
        assert stored[IDS[3]] == 17  # its parent is a canonical UUID: 0x01 and its 16 bytes
        assert stored[IDS[2]] == 1 + 36  # an upper-case UUID keeps its text
        assert stored[IDS[5]] == 1 + 37  # so do other spellings
        assert stored[IDS[6]] == 1 + 32
        assert stored[IDS[4]] == 1 + len("é ü".encode())
    finally:
        app.close()

    # rows stored before migration 0049 (parent_id text) are rewritten by it and read the same
    raw_sql(url, "ALTER TABLE lg_checkpoints ALTER COLUMN parent_id TYPE text USING lg_id_text(parent_id)")
    raw_sql(url, "DROP FUNCTION lg_id_text(bytea)")
    raw_sql(url, "DROP FUNCTION lg_id_pack(text)")
    raw_sql(url, "DELETE FROM schema_migrations WHERE version = 49")
    assert dict(raw_sql(url, "SELECT checkpoint_id, parent_id FROM lg_checkpoints"))[IDS[3]] == UUID
    again = cairn.App(db=url, lease_seconds=5.0)  # opening it migrates
    try:
        assert raw_sql(url, "SELECT count(*) FROM schema_migrations WHERE version = 49") == [(1,)]
        assert _parents(again) == read
        stored_again = dict(raw_sql(url, "SELECT checkpoint_id, length(parent_id) FROM lg_checkpoints"))
        assert stored_again == stored
    finally:
        again.close()
