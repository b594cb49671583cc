"""A checkpoint's plain channel versions inline in its own row
(``cairn.langgraph.INLINE``), on both backends: a channel whose value is not
a list is no row of ``lg_blobs`` but a digest in the checkpoint (written, or
carried from its parent, whether the saver holds the parent or reads it); a
checkpoint stored before (no inline record, its channels rows) reads as
before and is a parent like any; garbage collection keeps the values only an
inline record names; a malformed record is refused naming its checkpoint."""

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
         new: dict[str, str], run_id: str = "r1") -> Any:
    """A checkpoint of thread ``t`` after ``parent`` (a config, or ``None``)."""
    from langgraph.checkpoint.base import empty_checkpoint

    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = values
    checkpoint["channel_versions"] = dict(versions)
    config = parent or {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    return saver.put(config, checkpoint, {"source": "loop", "step": 0, "run_id": run_id}, new)


def _values(saver: CairnSaver, config: Any) -> dict[str, Any]:
    found = saver.get_tuple(config)
    assert found is not None
    return dict(found.checkpoint["channel_values"])


def _rewrite(db_url: str, saver: CairnSaver, config: Any, change: Any) -> None:
    """Store checkpoint ``config`` again with ``change(checkpoint)`` applied to
    its decoded checkpoint (as the saver encodes it)."""
    from cairn.langgraph import packed, unpacked
    from cairn.store.checkpointsql import CheckpointRow

    checkpoint_id = config["configurable"]["checkpoint_id"]
    # (PostgreSQL stores the default kind as NULL: migration 0048)
    kind, data = _sql(db_url, "SELECT coalesce(checkpoint_kind, 'zd1:msgpack'), checkpoint "
                      "FROM lg_checkpoints WHERE checkpoint_id = lg_id_key(?)", (checkpoint_id,))[0]

    row = CheckpointRow("t", "", checkpoint_id, None, kind, bytes(data), "", b"")
    checkpoint = saver.serde.loads_typed(unpacked(kind, bytes(data), row, "checkpoint"))
    change(checkpoint)
    kind, data = packed(*saver.serde.dumps_typed(checkpoint))
    _sql(db_url, "UPDATE lg_checkpoints SET checkpoint_kind = ?, checkpoint = ? "
                 "WHERE checkpoint_id = lg_id_key(?)",
         (kind, data, checkpoint_id))


def test_plain_channels_are_inline_and_a_list_is_rows(app: cairn.App, db_url: str) -> None:
    from tests.langgraph.graphs import counting_loop

    saver = _saver(app)
    config: Any = {"configurable": {"thread_id": "t"}}
    counting_loop(5, "a").compile(checkpointer=saver).invoke({"log": []}, config)
    # the list channel's versions are rows; branch:to:step, __start__ are not
    assert {r[0] for r in _sql(db_url, "SELECT DISTINCT channel FROM lg_blobs")} == {"log"}
    history = [*_saver(app).list(config)]
    assert [t.checkpoint["channel_values"].get("log") for t in history][:2] == [
        ["a0", "a1", "a2", "a3", "a4"], ["a0", "a1", "a2", "a3"]]
    latest = history[0].checkpoint
    assert "_cv" not in latest  # LangGraph never sees the record
    # a super-step's state read back as LangGraph holds it, channels in the checkpoint's order
    middle = history[2]
    assert list(middle.checkpoint["channel_values"]) == [
        c for c in middle.checkpoint["channel_versions"] if c in middle.checkpoint["channel_values"]]
    assert "branch:to:step" in middle.checkpoint["channel_values"]
    # a copy reads the same once the source is gone (its values were copied with it)
    saver.copy_thread("t", "u")
    saver.delete_thread("t")
    copied = _saver(app).get_tuple({"configurable": {"thread_id": "u"}})
    assert copied is not None
    assert copied.checkpoint["channel_values"] == latest["channel_values"]


@pytest.mark.parametrize("cold", [False, True], ids=["held", "read"])
def test_a_carried_channel_is_its_parents_value(app: cairn.App, cold: bool) -> None:
    saver = _saver(app)
    c1 = _put(saver, None, {"a": 1, "b": "kept"}, {"a": "1", "b": "1"}, {"a": "1", "b": "1"})
    writer = _saver(app) if cold else saver  # cold: the parent's record is read, not held
    c2 = _put(writer, c1, {"a": 2, "b": "kept"}, {"a": "2", "b": "1"}, {"a": "2"})
    c3 = _put(writer, c2, {"a": 3, "b": "kept"}, {"a": "3", "b": "1"}, {"a": "3"})
    assert _values(_saver(app), c3) == {"a": 3, "b": "kept"}
    assert _values(_saver(app), c1) == {"a": 1, "b": "kept"}


def test_a_checkpoint_stored_before_inline_versions_reads_as_before(app: cairn.App, db_url: str) -> None:
    from cairn.langgraph import digest

    saver = _saver(app)
    big = 10**12  # longer than a literal (checkpointsql.literal): a value row, as every value was
    c1 = _put(saver, None, {"a": big, "b": "old, a row"}, {"a": "1", "b": "1"}, {"a": "1", "b": "1"})
    # as stored before: no inline record, each channel a row of lg_blobs
    _rewrite(db_url, saver, c1, lambda c: c.pop("_cv"))
    for channel, value in (("a", big), ("b", "old, a row")):
        d = digest(*saver.serde.dumps_typed(value))
        _sql(db_url, "INSERT INTO lg_blobs (tenant, thread_id, ns, channel, version, kind, base, depth, "
             "refs) VALUES ('acme', 't', '', ?, '1', 'value', NULL, 0, ?)",
             (channel, d.to_bytes(8, "little", signed=True)))
    assert _values(_saver(app), c1) == {"a": big, "b": "old, a row"}
    # a checkpoint after it carries nothing inline from it: its channel is found as a row
    c2 = _put(_saver(app), c1, {"a": 2, "b": "old, a row"}, {"a": "2", "b": "1"}, {"a": "2"})
    assert _values(_saver(app), c2) == {"a": 2, "b": "old, a row"}
    _saver(app).prune(["t"])  # the legacy row c2 still names survives a collection
    assert _values(_saver(app), c2) == {"a": 2, "b": "old, a row"}


def test_values_only_an_inline_record_names_survive_a_collection(app: cairn.App) -> None:
    saver = _saver(app)
    c1 = _put(saver, None, {"a": 1, "b": "named inline alone"}, {"a": "1", "b": "1"},
              {"a": "1", "b": "1"}, run_id="r1")
    c2 = _put(saver, c1, {"a": 2, "b": "named inline alone"}, {"a": "2", "b": "1"}, {"a": "2"}, run_id="r2")
    saver.delete_for_runs(["r1"])  # c1, which wrote b, is gone; c2 carries it
    assert _values(_saver(app), c2) == {"a": 2, "b": "named inline alone"}
    saver.prune(["t"])
    assert _values(_saver(app), c2) == {"a": 2, "b": "named inline alone"}


@pytest.mark.parametrize("record", ["junk", {"a": "not a digest"}, {"a": 2**63}, {1: None}])
def test_a_malformed_inline_record_is_refused_naming_its_checkpoint(app: cairn.App, db_url: str,
                                                                   record: Any) -> None:
    saver = _saver(app)
    c1 = _put(saver, None, {"a": 1}, {"a": "1"}, {"a": "1"})
    _put(saver, c1, {"a": 2}, {"a": "2"}, {"a": "2"}, run_id="r2")
    _rewrite(db_url, saver, c1, lambda c: c.update(_cv=record))
    match = (f"checkpoint '{c1['configurable']['checkpoint_id']}' of thread 't': refused its checkpoint: "
             "its inline channel versions are malformed")
    with pytest.raises(UnreadableCheckpoint, match=match):
        _saver(app).get_tuple(c1)
    with pytest.raises(UnreadableCheckpoint, match=match):
        list(_saver(app).list(c1))
    with pytest.raises(UnreadableCheckpoint, match=match):  # nor is a collection blind to it
        saver.delete_for_runs(["r2"])


def test_another_tenant_reads_nothing_of_an_inline_thread(app: cairn.App) -> None:
    from cairn.langgraph import CairnSaver

    c1 = _put(_saver(app), None, {"a": 1}, {"a": "1"}, {"a": "1"})
    assert CairnSaver(app, tenant="other").get_tuple(c1) is None


def test_a_checkpoint_is_stored_without_its_id_and_read_with_it(app: cairn.App, db_url: str) -> None:
    """The row's key holds the checkpoint's id, so the stored checkpoint does
    not (34 compressed bytes a super-step in the bench graph); a read gives it
    back where LangGraph has it. A checkpoint stored before, with its id,
    reads as stored, beside newer ones in one thread."""
    from cairn.langgraph import unpacked
    from cairn.store.checkpointsql import CheckpointRow

    saver = _saver(app)
    c1 = _put(saver, None, {"n": 10, "log": ["a"]}, {"n": "1", "log": "1"}, {"n": "1", "log": "1"})
    c2 = _put(saver, c1, {"n": 11, "log": ["a", "b"]}, {"n": "2", "log": "2"}, {"n": "2", "log": "2"})
    for kind, data, checkpoint_id in _sql(db_url, "SELECT coalesce(checkpoint_kind, 'zd1:msgpack'), "
                                          "checkpoint, lg_id_text(checkpoint_id) FROM lg_checkpoints"):
        row = CheckpointRow("t", "", checkpoint_id, None, kind, bytes(data), "", b"")
        assert "id" not in saver.serde.loads_typed(unpacked(kind, bytes(data), row, "checkpoint"))
    # c1 as the code before stored it: with its id (one it never had, to tell them apart)
    _rewrite(db_url, saver, c1, lambda c: c.update(id="as-stored"))
    for config, expected in ((c1, "as-stored"), (c2, c2["configurable"]["checkpoint_id"])):
        found = _saver(app).get_tuple(config)
        assert found is not None
        assert found.checkpoint["id"] == expected
    found = _saver(app).get_tuple(c2)
    assert found is not None
    assert list(found.checkpoint)[:3] == ["v", "ts", "id"]
    listed = [t.checkpoint for t in _saver(app).list({"configurable": {"thread_id": "t"}})]
    assert [c["id"] for c in listed] == [c2["configurable"]["checkpoint_id"], "as-stored"]
    assert [c["channel_values"] for c in listed] == [{"n": 11, "log": ["a", "b"]}, {"n": 10, "log": ["a"]}]
