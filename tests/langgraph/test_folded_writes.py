"""Pending writes folded into their checkpoint's row (``cairn.store.checkpointsql``,
migrations 0030 / 0043), on both backends: a put moves its parent's rows of
``lg_writes`` into the parent's row, and every read returns the same pending
writes, in the same order, as before the fold; a write put after the fold is
read with the folded ones; a put refused by the fence moves nothing; garbage
collection keeps the values only folded writes name; a damaged or hostile
folded record is refused naming its checkpoint, nothing executed.

A ``put_writes`` to a stored checkpoint appends its record to the row itself
(PostgreSQL's ``lg_put_writes_many``, SQLite's ``lg_put_record``: no row of
``lg_writes`` inserted, then deleted by the fold): the reads are the same. On
SQLite a ``put_writes`` to a checkpoint not stored appends to the checkpoint's
*pending* row (no row of ``lg_writes`` since 2026-12-07 afternoon), which its
put fills in."""

from __future__ import annotations

import os
import pickle
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import cairn
from cairn.errors import ThreadTaken, UnreadableCheckpoint
from tests.langgraph.rawsql import raw_sql as _sql

if TYPE_CHECKING:
    from cairn.langgraph import CairnSaver


def _put(saver: CairnSaver, parent: Any, n: int, run_id: str = "r1", checkpoint_id: str | None = None) -> Any:
    """A checkpoint of thread ``t`` after ``parent`` (a config, or ``None``), channel ``n`` = ``n``."""
    from langgraph.checkpoint.base import empty_checkpoint

    checkpoint = empty_checkpoint()
    if checkpoint_id is not None:
        checkpoint["id"] = checkpoint_id
    checkpoint["channel_values"] = {"n": n}
    version = saver.get_next_version(None if n == 0 else f"{n:010d}", None)
    checkpoint["channel_versions"] = {"n": version}
    config = parent or {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    return saver.put(config, checkpoint, {"source": "loop", "step": n, "run_id": run_id}, {"n": version})


def _writes(saver: CairnSaver, config: Any) -> list[tuple[str, str, Any]]:
    found = saver.get_tuple(config)
    assert found is not None
    return list(found.pending_writes or [])


def _side_rows(db_url: str, checkpoint_id: str) -> int:
    return int(_sql(db_url, "SELECT count(*) FROM lg_writes WHERE checkpoint_id = lg_id_key(?)",
                    (checkpoint_id,))[0][0])


def _folded(db_url: str, checkpoint_id: str) -> Any:
    return _sql(db_url, "SELECT writes FROM lg_checkpoints WHERE checkpoint_id = lg_id_key(?)",
                (checkpoint_id,))[0][0]


def _deflated(data: bytes) -> bytes:
    """``data`` as a folded record deflates it (with the record's dictionary)."""
    from cairn.store.checkpointsql import FOLD_DICTIONARY

    deflate = zlib.compressobj(6, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, zdict=FOLD_DICTIONARY)
    return deflate.compress(data) + deflate.flush()


def _new_saver(app: cairn.App) -> CairnSaver:
    from cairn.langgraph import CairnSaver

    return CairnSaver(app, tenant="acme")


def test_a_put_folds_its_parents_writes_and_reads_return_them_unchanged(app: cairn.App, db_url: str) -> None:
    from langgraph.checkpoint.base import ERROR

    saver = _new_saver(app)
    c1 = _put(saver, None, 0)
    saver.put_writes(c1, [("n", 1), ("log", ["a", "b"])], "task-b", "~path, b")
    saver.put_writes(c1, [("n", 2)], "task-a", "~path, a")
    saver.put_writes(c1, [(ERROR, "boom")], "task-c")  # a special write (negative index)
    before = _writes(saver, c1)
    assert len(before) == 4
    assert _side_rows(db_url, c1["configurable"]["checkpoint_id"]) == 0
    assert _folded(db_url, c1["configurable"]["checkpoint_id"]) is not None
    c2 = _put(saver, c1, 1)
    c1_id = c1["configurable"]["checkpoint_id"]
    assert _side_rows(db_url, c1_id) == 0, "the parent's writes left lg_writes"
    assert _folded(db_url, c1_id) is not None, "and are in the parent's row"
    assert _writes(saver, c1) == before
    assert _writes(_new_saver(app), c1) == before  # a reader that holds nothing of the thread
    thread = {"configurable": {"thread_id": "t"}}
    listed = {t.config["configurable"]["checkpoint_id"]: t.pending_writes for t in saver.list(thread)}
    assert listed == {c1_id: before, c2["configurable"]["checkpoint_id"]: []}


def test_a_write_put_after_the_fold_is_read_with_the_folded_ones(app: cairn.App, db_url: str) -> None:
    saver = _new_saver(app)
    c1 = _put(saver, None, 0)
    saver.put_writes(c1, [("n", 1)], "task-b")
    _put(saver, c1, 1)
    saver.put_writes(c1, [("n", 2)], "task-a")  # after the fold: one more record in the row
    c1_id = c1["configurable"]["checkpoint_id"]
    assert _side_rows(db_url, c1_id) == 0
    expected = [("task-a", "n", 2), ("task-b", "n", 1)]  # in the read order: by task id
    assert _writes(saver, c1) == expected
    _put(saver, c1, 2)  # a second child (a fork) folds nothing more: the parent is folded
    assert _side_rows(db_url, c1_id) == 0
    assert _writes(_new_saver(app), c1) == expected


def test_a_put_refused_by_the_fence_moves_none_of_its_parents_writes(app: cairn.App, db_url: str) -> None:
    first, second = _new_saver(app), _new_saver(app)
    c1 = _put(first, None, 0)
    first.put_writes(c1, [("n", 1)], "task")
    second.hold("t")  # another process takes the thread
    c1_id = c1["configurable"]["checkpoint_id"]
    stored = _side_rows(db_url, c1_id), _folded(db_url, c1_id)
    assert stored[0] == 0
    with pytest.raises(ThreadTaken):
        _put(first, c1, 1)
    assert (_side_rows(db_url, c1_id), _folded(db_url, c1_id)) == stored
    assert _writes(second, c1) == [("task", "n", 1)]


def test_writes_of_a_parent_that_is_not_stored_stay_where_they_are(app: cairn.App, db_url: str) -> None:
    """A put naming a parent with no row (LangGraph's loop never does; a caller
    may) has nowhere to fold its writes into: they stay rows of ``lg_writes``
    (SQLite: the parent's pending row, which no read lists)."""
    saver = _new_saver(app)
    ghost = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "ghost"}}
    saver.put_writes(ghost, [("n", 1)], "task")
    child = _put(saver, ghost, 1)
    if db_url.startswith("postgresql"):
        assert _side_rows(db_url, "ghost") == 1
    else:
        assert (_side_rows(db_url, "ghost"), _folded(db_url, "ghost") is not None) == (0, True)
    assert saver.get_tuple(ghost) is None
    assert [t.config for t in saver.list({"configurable": {"thread_id": "t"}})] == [child]


def test_values_only_folded_writes_name_survive_a_collection(app: cairn.App) -> None:
    saver = _new_saver(app)
    c1 = _put(saver, None, 0, run_id="r1")
    saver.put_writes(c1, [("note", "named by this write alone")], "task")
    c2 = _put(saver, c1, 1, run_id="r1")
    _put(saver, c2, 2, run_id="r2")
    saver.delete_for_runs(["r2"])  # collects the values nothing names any more
    assert _writes(_new_saver(app), c1) == [("task", "note", "named by this write alone")]


@pytest.mark.parametrize("record", [b"W1 not zlib", b"junk", b"W1" + _deflated(b'{"a": 1}')])
def test_a_damaged_folded_record_is_refused_naming_its_checkpoint(app: cairn.App, db_url: str,
                                                                 record: bytes) -> None:
    saver = _new_saver(app)
    c1 = _put(saver, None, 0)
    saver.put_writes(c1, [("n", 1)], "task")
    c2 = _put(saver, c1, 1)
    _put(saver, c2, 2, run_id="r2")
    _sql(db_url, "UPDATE lg_checkpoints SET writes = ? WHERE writes IS NOT NULL", (record,))
    c1_id = c1["configurable"]["checkpoint_id"]
    match = f"checkpoint '{c1_id}' of thread 't': cannot read its folded pending writes"
    with pytest.raises(UnreadableCheckpoint, match=match):
        _new_saver(app).get_tuple(c1)
    with pytest.raises(UnreadableCheckpoint, match=match):
        list(_new_saver(app).list(c1))
    with pytest.raises(UnreadableCheckpoint, match=match):  # nor is a collection blind to it
        saver.delete_for_runs(["r2"])


def test_a_pickle_in_a_folded_record_is_refused_and_not_run(app: cairn.App, db_url: str,
                                                            tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.mkdir, (str(marker),))

    saver = _new_saver(app)
    c1 = _put(saver, None, 0)
    saver.put_writes(c1, [("n", 1)], "task")
    _put(saver, c1, 1)
    hostile = b"W1" + pickle.dumps(Evil())
    _sql(db_url, "UPDATE lg_checkpoints SET writes = ? WHERE writes IS NOT NULL", (hostile,))
    with pytest.raises(UnreadableCheckpoint, match="cannot read its folded pending writes"):
        _new_saver(app).get_tuple(c1)
    assert not marker.exists()


def test_writes_put_one_by_one_read_as_rows_of_lg_writes_keep_them(app: cairn.App, db_url: str) -> None:
    """Records appended one per ``put_writes`` read as rows of ``lg_writes``
    kept them: a task's regular write as first written, its special write as
    last written, in the read order."""
    from langgraph.checkpoint.base import ERROR

    saver = _new_saver(app)
    c1 = _put(saver, None, 0)
    saver.put_writes(c1, [("n", 1)], "task-c")
    saver.put_writes(c1, [("n", 9)], "task-c")  # a retried task: the first write is kept
    saver.put_writes(c1, [(ERROR, "one")], "task-a")
    saver.put_writes(c1, [(ERROR, "two")], "task-a")  # a special write: the last is kept
    saver.put_writes(c1, [("n", 3), ("log", ["x"])], "task-b")
    expected = [("task-a", ERROR, "two"), ("task-b", "n", 3), ("task-b", "log", ["x"]), ("task-c", "n", 1)]
    assert _writes(saver, c1) == expected
    assert _writes(_new_saver(app), c1) == expected
    c1_id = c1["configurable"]["checkpoint_id"]
    assert _side_rows(db_url, c1_id) == 0
    _put(saver, c1, 1)
    assert _writes(_new_saver(app), c1) == expected  # as they were: the parent's row holds them


def test_rows_of_lg_writes_from_before_are_read_and_folded(app: cairn.App, db_url: str) -> None:
    """Rows of ``lg_writes`` a saver wrote before writes went into the row
    (databases in the field) are read, and folded by the next put, as before."""
    from cairn.store.checkpointsql import pack_refs

    saver = _new_saver(app)
    c1 = _put(saver, None, 0)
    c1_id = c1["configurable"]["checkpoint_id"]
    # its value row (longer than a literal: checkpointsql.literal); then the write as the old code stored it
    saver.put_writes(c1, [("n", 10**12)], "task-a")
    digest = saver._digest(*saver._dump(10**12))
    found = _writes(_new_saver(app), c1)
    _sql(db_url, "DELETE FROM lg_writes")
    _sql(db_url, "UPDATE lg_checkpoints SET writes = NULL")
    if db_url.startswith("postgresql"):
        _sql(db_url, "UPDATE lg_checkpoints SET refs = NULL, names = NULL")
    _sql(db_url, "INSERT INTO lg_writes (tenant, thread_id, ns, checkpoint_id, task_id, idx, channel, "
                 "task_path, kind, refs) "
                 "VALUES ('acme', 't', '', lg_id_key(?), 'task-a', 0, 'n', '', 'value', ?)",
         (c1_id, pack_refs([digest])))
    assert found == [("task-a", "n", 10**12)]
    assert _writes(_new_saver(app), c1) == found
    assert _writes(saver, c1) == found  # rows this writer did not put: read all the same
    _put(_new_saver(app), c1, 1)  # a process after the upgrade: its first write takes the thread, and folds
    assert _side_rows(db_url, c1_id) == 0
    assert _folded(db_url, c1_id) is not None
    assert _writes(_new_saver(app), c1) == found


def test_writes_put_before_their_checkpoint_are_folded(app: cairn.App, db_url: str) -> None:
    """A ``put_writes`` that comes before its checkpoint is stored (LangGraph's
    loop, durability "async", nearly always does) leaves rows of ``lg_writes``;
    on SQLite the checkpoint's own put folds them into its row (a writer that
    held the thread already too), and a write put after it goes into the row;
    on both backends every read returns them, a task's regular write as first written."""
    import uuid

    saver = _new_saver(app)
    c0 = _put(saver, None, 0)  # the saver holds the thread from here
    c1_id = str(uuid.uuid4())
    early = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": c1_id}}
    saver.put_writes(early, [("n", 5)], "task-a")
    sqlite = not db_url.startswith("postgresql")
    assert _side_rows(db_url, c1_id) == (0 if sqlite else 1)  # SQLite: the checkpoint's pending row
    assert saver.get_tuple(early) is None
    c1 = _put(saver, c0, 1, checkpoint_id=c1_id)
    if sqlite:  # filled in by its own put
        assert (_side_rows(db_url, c1_id), _folded(db_url, c1_id) is not None) == (0, True)
    saver.put_writes(c1, [("n", 7)], "task-b")
    saver.put_writes(c1, [("n", 6)], "task-a")  # a retried task: its regular write is kept as first written
    _put(saver, c1, 2)
    if sqlite:
        assert (_side_rows(db_url, c1_id), _folded(db_url, c1_id) is not None) == (0, True)
    assert _writes(saver, c1) == _writes(_new_saver(app), c1) == [("task-a", "n", 5), ("task-b", "n", 7)]


def test_a_write_put_as_a_row_and_again_into_the_record_is_read_once(app: cairn.App, db_url: str) -> None:
    """A task's writes put before its checkpoint was stored (rows of
    ``lg_writes``) and again after (into the checkpoint's record), as a
    retried task does: a read returns each write once, as ``lg_writes`` keeps
    one (a regular write as first written, a special one as last written).
    On PostgreSQL the rows stay beside the record (the fold moves rows only
    into a row that holds no record yet), so the read merges the two; until
    2026-12-07 it returned both, and LangGraph would have applied a retried
    task's write twice on resuming."""
    import uuid

    saver = _new_saver(app)
    c0 = _put(saver, None, 0)
    c1_id = str(uuid.uuid4())
    early = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": c1_id}}
    saver.put_writes(early, [("n", 5), ("__error__", "first")], "task-a")
    c1 = _put(saver, c0, 1, checkpoint_id=c1_id)
    saver.put_writes(c1, [("n", 6), ("__error__", "second")], "task-a")
    expected = [("task-a", "__error__", "second"), ("task-a", "n", 5)]
    assert sorted(_writes(saver, c1)) == sorted(_writes(_new_saver(app), c1)) == expected
    _put(saver, c1, 2)
    assert sorted(_writes(saver, c1)) == sorted(_writes(_new_saver(app), c1)) == expected


def test_a_checkpoint_put_again_keeps_its_pending_writes(app: cairn.App, db_url: str) -> None:
    """A put of a checkpoint stored already (the same id) keeps the writes its
    row holds, and adds those put as rows before it (SQLite's ``own_writes``)."""
    import uuid

    saver = _new_saver(app)
    c0 = _put(saver, None, 0)
    c1_id = str(uuid.uuid4())
    c1 = _put(saver, c0, 1, checkpoint_id=c1_id)
    saver.put_writes(c1, [("n", 5)], "task-a")  # into the row
    other = _new_saver(app)  # a writer that does not know c1 stored: rows of lg_writes
    other.put_writes(c1, [("n", 7)], "task-b")
    _put(other, c0, 1, checkpoint_id=c1_id)  # c1 again
    assert _writes(_new_saver(app), c1) == [("task-a", "n", 5), ("task-b", "n", 7)]


def test_a_damaged_record_after_a_good_one_is_refused_naming_its_checkpoint(app: cairn.App,
                                                                           db_url: str) -> None:
    saver = _new_saver(app)
    c1 = _put(saver, None, 0)
    saver.put_writes(c1, [("n", 1)], "task")
    _put(saver, c1, 1)
    c1_id = c1["configurable"]["checkpoint_id"]
    _sql(db_url, "UPDATE lg_checkpoints SET writes = ? WHERE checkpoint_id = lg_id_key(?)",
         (bytes(_folded(db_url, c1_id)) + b"W1\x00junk", c1_id))
    with pytest.raises(UnreadableCheckpoint, match=c1["configurable"]["checkpoint_id"]):
        _writes(_new_saver(app), c1)
