"""Literal refs (``cairn.store.checkpointsql.literal``), on both backends: a
value of at most 5 bytes of msgpack (a counter) is held in the ref that
would name its row, so a counter channel and the pending write that sets it
store no row of ``lg_values``; they read back, through the one-statement
read (PostgreSQL) and a fresh saver; rows written before (the counter a row,
named by its digest) read as before; a real digest never takes a literal's
tag; under encryption no value is a literal, and a literal planted in a
sealed thread is refused, not read."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pytest

import cairn
from cairn.errors import UnreadableCheckpoint
from cairn.store.checkpointsql import WriteRow, fold_writes, is_literal, literal, literal_bytes, pack_refs
from tests.langgraph.rawsql import raw_sql as _sql
from tests.langgraph.test_read_one import _statements

if TYPE_CHECKING:
    from cairn.langgraph import CairnSaver


def _saver(app: cairn.App) -> CairnSaver:
    from cairn.langgraph import CairnSaver

    return CairnSaver(app, tenant="acme")


def _step(saver: CairnSaver, parent: Any, n: int, version: str) -> Any:
    """A checkpoint of thread ``t`` holding counter ``n``, and the pending
    write of a task setting the next one."""
    from langgraph.checkpoint.base import empty_checkpoint

    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"n": n, "messages": ["hello " * 40]}
    checkpoint["channel_versions"] = {"n": version, "messages": "0000000001.aaaaaa"}
    config = parent or {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    stored = saver.put(config, checkpoint, {"source": "loop", "step": n}, {"n": version,
                                                                          "messages": "0000000001.aaaaaa"})
    saver.put_writes(stored, [("n", n + 1)], "task-1")
    return stored


def _value_rows(db_url: str) -> int:
    return int(_sql(db_url, "SELECT count(*) FROM lg_values")[0][0])


def test_a_literal_round_trips_and_a_longer_value_is_none() -> None:
    for data in (b"", b"\x01", b"\xcd\x0b\xb8", b"\xce\x00\x01\x00\x00"):
        d = literal(data)
        assert d is not None
        assert is_literal(d)
        assert -2**63 <= d < 2**63
        assert literal_bytes(d) == data
    assert literal(b"123456") is None
    assert literal_bytes(12345) is None
    bad = literal(b"\x01")
    assert bad is not None
    assert literal_bytes(bad | 0xFF) is None  # bytes past its length: not a literal


def test_a_real_digest_never_has_a_literals_tag() -> None:
    from cairn.langgraph import digest

    tagged = [i for i in range(300_000) if is_literal(digest("msgpack", i.to_bytes(4, "big")))]
    assert tagged == []


def test_a_counter_and_its_write_store_no_value_row(app: cairn.App, db_url: str) -> None:
    saver = _saver(app)
    first = _step(saver, None, 1, "0000000001.aaaaaa")
    rows = _value_rows(db_url)  # the message
    at = first
    for n in range(2, 12):
        at = _step(saver, at, n, f"{n:010d}.aaaaaa")
    assert _value_rows(db_url) == rows
    for reader in (saver, _saver(app)):  # this saver, and one holding nothing
        for n, config in ((1, first), (11, at)):
            ran = _statements(reader)
            found = reader.get_tuple(config)
            if db_url.startswith("postgresql"):  # a literal is no value left to fetch again
                assert ran == ["lg_read_one"]
            assert found is not None
            assert found.checkpoint["channel_values"]["n"] == n
            assert found.pending_writes == [("task-1", "n", n + 1)]
        latest = reader.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": ""}})
        assert latest is not None
        assert latest.checkpoint["channel_values"]["n"] == 11
        ran = _statements(reader)
        assert [t.checkpoint["channel_values"]["n"] for t in reader.list(
            {"configurable": {"thread_id": "t"}}, limit=3)] == [11, 10, 9]
        if db_url.startswith("postgresql"):  # not read again, in a snapshot, for a literal it did not find
            assert ran.count("lg_page_reads") == 1, ran
        ran = _statements(reader)
        assert [t.checkpoint["channel_values"]["n"] for t in reader.list(
            {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, limit=3)] == [11, 10, 9]
        if db_url.startswith("postgresql"):  # a history page: one statement, a literal not taken as missing
            assert ran == ["lg_read_page"], ran


def test_rows_written_before_literals_read_as_before(app: cairn.App, db_url: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import cairn.langgraph as lg

    old = _saver(app)
    monkeypatch.setattr(lg, "literal", lambda data: None)  # a saver from before: every value a row
    first = _step(old, None, 1, "0000000001.aaaaaa")
    second = _step(old, first, 2, "0000000002.aaaaaa")
    assert _value_rows(db_url) == 4  # the message, 1, 2 and 3
    monkeypatch.undo()
    new = _saver(app)
    third = _step(new, second, 3, "0000000003.aaaaaa")  # carries on from the old rows
    assert _value_rows(db_url) == 4
    for n, config in ((1, first), (2, second), (3, third)):
        found = new.get_tuple(config)
        assert found is not None
        assert found.checkpoint["channel_values"]["n"] == n
        assert found.pending_writes == [("task-1", "n", n + 1)]
    new.prune(["t"], strategy="keep_latest")  # the old values nothing names are collected
    found = new.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": ""}})
    assert found is not None
    assert found.checkpoint["channel_values"]["n"] == 3
    assert found.pending_writes == [("task-1", "n", 4)]


def test_a_literal_planted_in_a_sealed_thread_is_refused(db_url: str) -> None:
    from cairn.langgraph import CairnSaver
    from cairn.security.keyring import LocalKeyring

    app = cairn.App(db=db_url, keyring=LocalKeyring({"kek1": os.urandom(32)}, "kek1"), lease_seconds=5.0)
    try:
        saver = CairnSaver(app, tenant="acme")
        stored = _step(saver, None, 1, "0000000001.aaaaaa")
        assert _value_rows(db_url) == 3  # sealed: the counter and the write are rows, not literals
        planted = literal(b"\x07")
        assert planted is not None
        # the write as a row (SQLite) or folded in its checkpoint's row (PostgreSQL appends it there)
        _sql(db_url, "UPDATE lg_writes SET refs = ?", (pack_refs([planted]),))
        record = fold_writes([WriteRow("task-1", 0, "n", "", "value", pack_refs([planted]))])
        _sql(db_url, "UPDATE lg_checkpoints SET writes = ? WHERE writes IS NOT NULL", (record,))
        with pytest.raises(UnreadableCheckpoint, match="names a value that is not stored"):
            CairnSaver(app, tenant="acme").get_tuple(stored)
    finally:
        app.close()


def test_none_is_the_literal_of_no_bytes(app: cairn.App, db_url: str) -> None:
    """LangGraph serializes ``None`` as ``("null", b"")``: a plain ``None`` (the
    bench graph's ``branch:to:<node>`` channel and the write that sets it) is the
    literal of no bytes, no row and no digest in ``refs``; a ``None`` item of a
    list stays a row, as every item does."""
    from langgraph.checkpoint.base import empty_checkpoint

    saver = _saver(app)
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"branch": None, "items": ["x"]}
    checkpoint["channel_versions"] = {"branch": "1", "items": "1"}
    stored = saver.put({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, checkpoint,
                       {"source": "loop", "step": 0}, {"branch": "1", "items": "1"})
    saver.put_writes(stored, [("branch", None)], "task-1")
    assert [str(k) for (k,) in _sql(db_url, "SELECT kind FROM lg_values")] == ["msgpack"]  # "x" alone
    if db_url.startswith("postgresql"):  # the row names no value of its own to fetch
        assert _sql(db_url, "SELECT length(refs) FROM lg_checkpoints") == [(0,)]
    found = _saver(app).get_tuple(stored)  # a fresh saver: through the one-statement read on PostgreSQL
    assert found is not None
    assert found.checkpoint["channel_values"] == {"branch": None, "items": ["x"]}
    assert found.pending_writes == [("task-1", "branch", None)]
    checkpoint["channel_values"] = {"branch": None, "items": ["x", None]}
    checkpoint["channel_versions"] = {"branch": "1", "items": "2"}
    child = saver.put(stored, checkpoint, {"source": "loop", "step": 1}, {"items": "2"})
    assert sorted(str(k) for (k,) in _sql(db_url, "SELECT kind FROM lg_values")) == ["msgpack", "null"]
    found = _saver(app).get_tuple(child)
    assert found is not None
    assert found.checkpoint["channel_values"] == {"branch": None, "items": ["x", None]}
