"""A checkpoint's metadata is stored DEFLATEd with the preset dictionary
whatever its length on PostgreSQL (its kind 'zd1:msgpack' stored as '');
LangGraph's ~29 bytes of msgpack take ~10. SQLite keeps it whole. Rows
stored before, their metadata plain msgpack, read the same."""

from __future__ import annotations

import zlib
from typing import Any

import cairn
from cairn.langgraph import ZDICT_1
from tests.langgraph.graphs import counting_loop
from tests.langgraph.rawsql import raw_sql


def _conf() -> Any:
    return {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}


def _metadata(app: cairn.App) -> list[Any]:
    """Every checkpoint's metadata as a new saver reads it: listed, one by one, filtered."""
    from cairn.langgraph import CairnSaver

    listed = list(CairnSaver(app, tenant="acme").list(_conf()))
    one = [CairnSaver(app, tenant="acme").get_tuple(t.config) for t in listed]
    filtered = list(CairnSaver(app, tenant="acme").list(_conf(), filter={"source": "loop"}))
    return [t.metadata for t in [*listed, *one, *filtered] if t]


def test_metadata_is_stored_compressed_and_rows_stored_before_read_the_same(app: cairn.App,
                                                                             db_url: str) -> None:
    from cairn.langgraph import CairnSaver

    graph = counting_loop(3, "x").compile(checkpointer=CairnSaver(app, tenant="acme"))
    graph.invoke({"log": []}, _conf())
    read = _metadata(app)
    assert len(read) > 6
    assert {m["source"] for m in read} >= {"input", "loop"}
    rows = raw_sql(db_url, "SELECT checkpoint_id, metadata_kind, metadata FROM lg_checkpoints")
    if not db_url.startswith("postgresql"):
        assert {kind for _, kind, _ in rows} == {"msgpack"}
        return
    assert {kind for _, kind, _ in rows} == {""}
    for checkpoint_id, _, data in rows:  # as stored before: plain msgpack, its kind the default
        inflate = zlib.decompressobj(-15, zdict=ZDICT_1)
        plain = inflate.decompress(bytes(data))
        assert len(plain) > len(bytes(data))
        raw_sql(db_url, "UPDATE lg_checkpoints SET metadata_kind = NULL, metadata = ? "
                        "WHERE checkpoint_id = ?", (plain, checkpoint_id))
    assert _metadata(app) == read
