"""The binary record of folded writes (``checkpointsql.FOLD_TAG_2``, branch
lgpgrow): PostgreSQL folds a checkpoint's pending writes into it, and SQLite
since 2026-12-07 (issue 24; it kept the JSON record, ``FOLD_TAG``, which still
reads); it gives back every field as written, reads
after and before JSON records in one row (rows written before keep theirs),
and a damaged one is refused naming its checkpoint."""

from __future__ import annotations

from typing import Any

import pytest

import cairn
from cairn.errors import UnreadableCheckpoint
from cairn.store.checkpointsql import (
    FOLD_TAG,
    FOLD_TAG_2,
    WriteRow,
    fold_writes,
    pack_refs,
    unfold_writes,
    write_order,
)
from tests.langgraph.rawsql import raw_sql as _sql
from tests.langgraph.test_folded_writes import _new_saver, _put, _writes

UUID = "5e6468b3-50a2-764c-72e7-1ad1992525e5"
WRITES = [
    WriteRow(UUID, 0, "messages", "~__pregel_pull, talk", "list", pack_refs([-5, 2**63 - 1])),
    WriteRow(UUID, 1, "n", "~__pregel_pull, talk", "value", pack_refs([7])),
    WriteRow(UUID, -3, "__interrupt__", "", "value", b""),
    WriteRow("TASK-not-canonical", 2, "ünï", "~path, é", "value", pack_refs([-(2**63)])),
    WriteRow(UUID.upper(), 300, "x", "", "list", pack_refs(range(40))),
]


def test_a_compact_record_gives_back_every_write_as_written() -> None:
    record = fold_writes(WRITES, compact=True)
    assert record.startswith(FOLD_TAG_2)
    assert unfold_writes(record, "t", "c") == sorted(WRITES, key=write_order)
    step = [WriteRow(UUID, 0, "messages", "~__pregel_pull, talk", "list", pack_refs([0x68F96A11E926313A])),
            WriteRow(UUID, 1, "n", "~__pregel_pull, talk", "value", bytes.fromhex("000000000101c3a5")),
            WriteRow(UUID, 2, "branch:to:talk", "~__pregel_pull, talk", "value",
                     bytes.fromhex("000000000000c3a5"))]
    # a bench super-step's writes (measured in a run: 107 bytes as JSON, 55 compact)
    assert len(fold_writes(step, compact=True)) <= 0.6 * len(fold_writes(step))


def test_json_and_compact_records_read_together_in_one_row() -> None:
    first, later = WRITES[:2], WRITES[2:]
    for data in (fold_writes(first) + fold_writes(later, compact=True),
                 fold_writes(first, compact=True) + fold_writes(later)):
        assert unfold_writes(data, "t", "c") == sorted(WRITES, key=write_order)


@pytest.mark.parametrize("body", [
    b"\x00\x00\x01n\x00\x05value\x00",  # the previous task's id, with no write before it
    b"\x07",  # no such task id marker
    b"\x02\x04task\x00\x01n\x00\x05value\x03abc",  # refs not a whole number of digests
    b"\x02\x04task\x00\x01n\x00\x05value\x10" + bytes(8),  # refs shorter than their length says
    b"\x02\x02\xff\xfe\x00\x01n\x00\x05value\x00",  # a task id that is not UTF-8
    b"\x02\x04task" + b"\xff" * 12,  # a number with no end
    b"\x01" + bytes(10),  # a task's UUID cut short
    b"\x02\x09task",  # a text shorter than its length says
    b"",  # no write at all
])
def test_a_damaged_compact_record_is_refused_naming_its_checkpoint(body: bytes) -> None:
    import zlib

    from cairn.store.checkpointsql import FOLD_DICTIONARY_2

    deflate = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, zdict=FOLD_DICTIONARY_2)
    record = FOLD_TAG_2 + deflate.compress(body) + deflate.flush()
    with pytest.raises(UnreadableCheckpoint, match="checkpoint 'c' of thread 't': cannot read its folded"):
        unfold_writes(record, "t", "c")
    with pytest.raises(UnreadableCheckpoint, match="cannot read its folded"):
        unfold_writes(record[:-1], "t", "c")  # truncated


def _record(db_url: str, checkpoint_id: str) -> bytes:
    found = _sql(db_url, "SELECT writes FROM lg_checkpoints WHERE checkpoint_id = lg_id_key(?)",
                 (checkpoint_id,))
    return bytes(found[0][0])


def test_both_backends_fold_into_the_compact_record_and_read_json_ones(app: cairn.App, db_url: str) -> None:
    saver = _new_saver(app)
    c1 = _put(saver, None, 0)
    saver.put_writes(c1, [("n", 10**12), ("log", ["a"])], "task-b", "~path, b")
    saver.put_writes(c1, [("n", 2)], "task-a")
    _put(saver, c1, 1)
    c1_id = c1["configurable"]["checkpoint_id"]
    record = _record(db_url, c1_id)
    assert record.startswith(FOLD_TAG_2)
    expected = [("task-a", "n", 2), ("task-b", "n", 10**12), ("task-b", "log", ["a"])]
    assert _writes(_new_saver(app), c1) == expected
    # a row folded before (a JSON record) reads the same
    as_json = fold_writes(unfold_writes(record, "t", c1_id))
    assert as_json.startswith(FOLD_TAG)
    _sql(db_url, "UPDATE lg_checkpoints SET writes = ? WHERE checkpoint_id = lg_id_key(?)", (as_json, c1_id))
    assert _writes(_new_saver(app), c1) == expected
    thread: Any = {"configurable": {"thread_id": "t"}}
    assert [t.pending_writes for t in _new_saver(app).list(thread)][-1] == expected
