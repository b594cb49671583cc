"""A list channel's versions between rows of ``lg_blobs`` held as *tails* in
the checkpoint's own row (``cairn.langgraph.TAIL``, branch lgpgrow): on
PostgreSQL and (since 2026-12-07 afternoon) SQLite (``lg_tail_every`` 2)
every other version of a list that grows is its base version and the new
items' digests in the checkpoint, not a row of its own (~225 bytes a
super-step at 3,000 on PostgreSQL). Every read (warm, cold, a history page, the statements of
before), a saver continuing a thread it only read, a checkpoint carrying a
tail it did not write, prune, delete_for_runs and copy_thread give what the
writer wrote; a malformed tail is refused naming its checkpoint."""

from __future__ import annotations

from typing import Any

import pytest

import cairn
from cairn.errors import UnreadableCheckpoint
from tests.langgraph.graphs import counting_loop
from tests.langgraph.rawsql import raw_sql


def _conf(thread: str, checkpoint_id: str | None = None) -> Any:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def _saver(app: cairn.App) -> Any:
    from cairn.langgraph import CairnSaver

    return CairnSaver(app, tenant="acme")


def _logs(saver: Any, thread: str) -> dict[str, list[str]]:
    """Each checkpoint's log, by id, as ``saver`` reads them one by one."""
    ids = [t.config["configurable"]["checkpoint_id"] for t in saver.list(_conf(thread))]
    out = {}
    for c in ids:
        found = saver.get_tuple(_conf(thread, c))
        assert found is not None
        out[c] = found.checkpoint["channel_values"].get("log", [])
    return out


def _tailed(saver: Any, thread: str) -> int:
    """How many of the thread's checkpoints hold a list tail."""
    from cairn.langgraph import TAIL

    n = 0
    for t in saver.list(_conf(thread)):
        row = saver._rows.lg_row(saver._key(t.config), t.config["configurable"]["checkpoint_id"])
        decoded: dict[str, Any] = {}
        saver._versions(row, decoded)
        n += bool(decoded["tails"])
        assert TAIL not in decoded["checkpoint"]
    return n


def test_every_other_list_version_is_a_tail(app: cairn.App, db_url: str) -> None:
    writer = _saver(app)
    counting_loop(12, "a").compile(checkpointer=writer).invoke({"log": []}, _conf("t"))
    rows = int(raw_sql(db_url, "SELECT count(*) FROM lg_blobs WHERE channel = 'log'")[0][0])
    assert rows <= 7  # 13 versions: every other one a tail (SQLite too since 2026-12-07 afternoon)
    assert _tailed(writer, "t") >= 6
    written = _logs(writer, "t")
    assert sorted(len(v) for v in written.values()) == [0, *range(13)]
    assert max(written.values(), key=len) == [f"a{i}" for i in range(12)]
    assert _logs(_saver(app), "t") == written  # a saver holding nothing reads the same
    listed = {t.config["configurable"]["checkpoint_id"]: t.checkpoint["channel_values"].get("log", [])
              for t in _saver(app).list(_conf("t"))}
    assert listed == written  # as a history page


def test_a_saver_continues_a_thread_it_only_read(app: cairn.App) -> None:
    counting_loop(5, "a").compile(checkpointer=_saver(app)).invoke({"log": []}, _conf("t"))
    for more in (6, 7, 8, 11, 12):  # each from a new saver: its list known by a read, tailed or not
        saver = _saver(app)
        saver.get_tuple(_conf("t"))
        counting_loop(more, "a").compile(checkpointer=saver).invoke({"log": []}, _conf("t"))
        found = _saver(app).get_tuple(_conf("t"))
        assert found is not None
        assert found.checkpoint["channel_values"]["log"] == [f"a{i}" for i in range(more)]
    assert _logs(_saver(app), "t") == _logs(saver, "t")


def test_a_checkpoint_that_does_not_write_the_list_carries_its_tail(app: cairn.App, db_url: str) -> None:
    from langgraph.graph import END, START, StateGraph

    from tests.langgraph.graphs import Log

    class State(Log):
        note: str

    g = StateGraph(State)
    g.add_node("grow", lambda s: {"log": [f"x{len(s['log'])}"]})
    g.add_node("note", lambda s: {"note": f"n{len(s['log'])}"})
    g.add_edge(START, "grow")
    g.add_edge("grow", "note")
    g.add_edge("note", END)
    writer = _saver(app)
    graph = g.compile(checkpointer=writer)
    for _ in range(5):
        graph.invoke({"log": []}, _conf("t"))
    if db_url.startswith("postgresql"):
        assert _tailed(writer, "t") > 5  # the "note" steps carry the tail "grow" wrote
    written = _logs(writer, "t")
    assert _logs(_saver(app), "t") == written
    assert max(written.values(), key=len) == [f"x{i}" for i in range(5)]


def test_prune_delete_for_runs_and_copy_keep_what_tails_name(app: cairn.App) -> None:
    saver = _saver(app)
    graph = counting_loop(9, "a").compile(checkpointer=saver)
    graph.invoke({"log": []}, {"configurable": {"thread_id": "t", "run_id": "r1"}})
    counting_loop(12, "a").compile(checkpointer=saver).invoke(
        {"log": []}, {"configurable": {"thread_id": "t", "run_id": "r2"}})
    saver.copy_thread("t", "copy")
    assert _logs(_saver(app), "copy") == _logs(_saver(app), "t")
    saver.prune(["copy"])  # the latest alone: its list whole, whether its version is a tail or a row
    kept = _logs(_saver(app), "copy")
    assert list(kept.values()) == [[f"a{i}" for i in range(12)]]
    before = _logs(_saver(app), "t")
    saver.delete_for_runs(["r2"])  # (the copy's rows too: they are r2's)
    after = _logs(_saver(app), "t")
    assert 0 < len(after) < len(before)
    assert all(before[c] == log for c, log in after.items())


@pytest.mark.parametrize("tails", [
    [], {"log": "v"}, {"log": ["v"]}, {"log": ["v", ["x"]]}, {"log": [1, [2]]}, {"log": ["v", [2**64]]},
    {"n": ["v", [1]]},  # a channel also inline
])
def test_a_malformed_tail_is_refused_naming_its_checkpoint(tails: Any) -> None:
    from cairn.langgraph import _tails
    from cairn.store.checkpointsql import CheckpointRow

    row = CheckpointRow("t", "", "c-1", None, "msgpack", b"", "msgpack", b"")
    with pytest.raises(UnreadableCheckpoint, match=r"checkpoint 'c-1' of thread 't'.*tails are malformed"):
        _tails(tails, {"n": None}, row)
    assert _tails({"log": ["v", [1, -2]]}, {"n": None}, row) == {"log": ("v", [1, -2])}
