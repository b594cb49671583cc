"""A checkpoint naming a channel version that no row holds, on both
backends. A version the checkpoint's put found stored (written by it or an
earlier put) whose row is later gone (deleted behind the saver's back, a
damaged database) is an ``UnreadableCheckpoint`` naming the checkpoint and
the channel, in ``get_tuple`` and in a listing, never the channel read as
empty. A version the put never found stored (a hand-made checkpoint naming
one; LangGraph's loop never does) is recorded as empty by the put, so it
reads as LangGraph's own savers read it: the channel absent."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

import cairn
from cairn.errors import UnreadableCheckpoint
from tests.langgraph.rawsql import raw_sql as _sql

if TYPE_CHECKING:
    from cairn.langgraph import CairnSaver


def _saver(app: cairn.App) -> CairnSaver:
    from cairn.langgraph import CairnSaver

    return CairnSaver(app, tenant="acme")


def _put(saver: CairnSaver, parent: Any, values: dict[str, Any], versions: dict[str, str],
         new: dict[str, str]) -> Any:
    from langgraph.checkpoint.base import empty_checkpoint

    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = values
    checkpoint["channel_versions"] = dict(versions)
    config = parent or {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    return saver.put(config, checkpoint, {"source": "loop", "step": 0}, new)


def test_a_deleted_version_row_is_refused_naming_the_checkpoint(app: cairn.App, db_url: str) -> None:
    saver = _saver(app)
    first = _put(saver, None, {"m": ["a", "b"]}, {"m": "1"}, {"m": "1"})
    # the child carries the list's version from its parent: it names the same row
    child = _put(saver, first, {"m": ["a", "b"], "n": 7}, {"m": "1", "n": "2"}, {"n": "2"})
    reader = _saver(app)  # holds nothing of the thread: reads every row
    found = reader.get_tuple(child)
    assert found is not None
    assert found.checkpoint["channel_values"] == {"m": ["a", "b"], "n": 7}
    assert _sql(db_url, "DELETE FROM lg_blobs WHERE channel = 'm' RETURNING version") == [("1",)]
    for config in (first, child):
        checkpoint_id = config["configurable"]["checkpoint_id"]
        named = f"checkpoint '{checkpoint_id}' of thread 't': its channel 'm' at version '1' is not stored"
        with pytest.raises(UnreadableCheckpoint, match=named):
            _saver(app).get_tuple(config)
    with pytest.raises(UnreadableCheckpoint, match="its channel 'm' at version '1' is not stored"):
        list(_saver(app).list({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}))
    with pytest.raises(UnreadableCheckpoint, match="its channel 'm' at version '1' is not stored"):
        _saver(app).get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": ""}})


def test_a_version_never_stored_reads_as_an_empty_channel(app: cairn.App, db_url: str) -> None:
    saver = _saver(app)
    # "x" is named at a version no put wrote, and no parent names it
    first = _put(saver, None, {"m": ["a"]}, {"m": "1", "x": "5"}, {"m": "1"})
    # a fresh saver's child: the parent's record (read, not held) accounts for x
    child = _put(_saver(app), first, {"m": ["a"], "y": "why"}, {"m": "1", "x": "5", "y": "3"}, {"y": "3"})
    for config in (first, child):
        found = _saver(app).get_tuple(config)
        assert found is not None
        assert "x" not in found.checkpoint["channel_values"]
        assert found.checkpoint["channel_versions"]["x"] == "5"
    if db_url.startswith("postgresql"):  # what the server reads of the rows: x is no row to look up
        names = {str(n) for (n,) in _sql(db_url, "SELECT names FROM lg_checkpoints")}
        assert names == {"m\x1f1"}
    listed = list(_saver(app).list({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}))
    assert [t.checkpoint["channel_values"] for t in listed] == [{"m": ["a"], "y": "why"}, {"m": ["a"]}]


def test_a_list_version_the_saver_holds_costs_no_look_up(app: cairn.App, db_url: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A carried version the parent's record or the saver's held list accounts
    for is not looked up (the bench graph's loop: no statement more a put)."""
    saver = _saver(app)
    first = _put(saver, None, {"m": ["a"]}, {"m": "1"}, {"m": "1"})
    asked: list[Any] = []
    monkeypatch.setattr(type(saver._rows), "lg_stored", lambda self, key, versions: asked.append(versions))
    child = _put(saver, first, {"m": ["a"], "n": 1}, {"m": "1", "n": "2"}, {"n": "2"})
    assert asked == []
    found = _saver(app).get_tuple(child)
    assert found is not None
    assert found.checkpoint["channel_values"] == {"m": ["a"], "n": 1}
