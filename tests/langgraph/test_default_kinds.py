"""PostgreSQL stores the serializer kinds a saver writes most as NULL
(migration 0048): a checkpoint's 'zd1:msgpack' and its metadata's 'msgpack',
(its compressed metadata's 'zd1:msgpack' as '', branch lgpgid)
a value's 'zd1:msgpack'; every read (one statement, a history page, the
statements of before, a listing) gives them back, rows written before with
their kinds spelled out read the same, and any other kind is stored as it is."""

from __future__ import annotations

from typing import Any

import cairn
from tests.engine.conftest import postgres_url
from tests.langgraph.graphs import counting_loop
from tests.langgraph.rawsql import raw_sql


def _conf(checkpoint_id: str | None = None) -> Any:
    conf = {"thread_id": "t", "checkpoint_ns": ""}
    return {"configurable": conf if checkpoint_id is None else {**conf, "checkpoint_id": checkpoint_id}}


def _everything(app: cairn.App) -> list[Any]:
    """Every checkpoint as a new saver reads it: one by one, then as a listing and a page."""
    from cairn.langgraph import CairnSaver

    saver = CairnSaver(app, tenant="acme")
    listed = list(saver.list(_conf()))
    one = [CairnSaver(app, tenant="acme").get_tuple(t.config) for t in listed]
    filtered = list(CairnSaver(app, tenant="acme").list(_conf(), filter={"source": "loop"}))
    return [(t.checkpoint, t.metadata, t.pending_writes) for t in [*listed, *one, *filtered] if t]


def test_default_kinds_are_null_on_disk_and_read_back(pg_url: str) -> None:
    from cairn.langgraph import CairnSaver

    url = postgres_url(pg_url)
    app = cairn.App(db=url, lease_seconds=5.0)
    try:
        saver = CairnSaver(app, tenant="acme")
        graph = counting_loop(4, "x" * 200).compile(checkpointer=saver)  # log items of 200+ bytes: compressed
        graph.invoke({"log": []}, _conf())
        saver.put_writes(_conf(saver.get_tuple(_conf()).config["configurable"]["checkpoint_id"]),
                         [("log", ["late " * 60])], "task-x")
        kinds = raw_sql(url, "SELECT DISTINCT checkpoint_kind, metadata_kind FROM lg_checkpoints")
        assert kinds == [(None, "")]  # metadata compressed: 'zd1:msgpack' stored as ''
        values = dict(raw_sql(url, "SELECT coalesce(kind, '-'), count(*) FROM lg_values GROUP BY 1"))
        assert values["-"] >= 5  # the long items
        assert set(values) - {"-"} <= {"msgpack", "null"}  # short values keep their kind as text
        read = _everything(app)
        assert len(read) > 10
        assert read[0][0]["channel_values"]["log"][-1] == "x" * 200 + "3"
        # rows written before this migration, their kinds spelled out, read the same
        raw_sql(url, "UPDATE lg_checkpoints SET checkpoint_kind = 'zd1:msgpack', "
                     "metadata_kind = 'zd1:msgpack'")
        raw_sql(url, "UPDATE lg_values SET kind = 'zd1:msgpack' WHERE kind IS NULL")
        assert _everything(app) == read
        # garbage collection decodes the rows too (prune keeps the latest)
        raw_sql(url, "UPDATE lg_checkpoints SET checkpoint_kind = NULL, metadata_kind = ''")
        CairnSaver(app, tenant="acme").prune(["t"])
        latest = CairnSaver(app, tenant="acme").get_tuple(_conf())
        assert latest is not None
        assert (latest.checkpoint, latest.metadata, latest.pending_writes) == read[0]
    finally:
        app.close()
