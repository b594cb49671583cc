"""A LangGraph write checks its fence in its own statements (issue 24,
2026-12-07 afternoon; ``checkpointsql.SQLCheckpoints._lg_operate``): a
writer that held the thread expects the holder row it left, and on SQLite
the checkpoint's insert and the writes' statement change nothing unless the
row is that (no SELECT of the holder a write). Whatever the row became, the
answer is ``hold_rule``'s, on both backends: another saver took it, refused
with nothing written (values included); nobody holds it (deleted), taken
again; its epoch moved under the same owner, written.

On SQLite a ``put_writes`` to a checkpoint not stored yet (LangGraph's
default durability, nearly every super-step) appends its record to the
checkpoint's *pending* row in ``lg_checkpoints`` (no checkpoint: no read lists
it or returns it), which the checkpoint's put fills in; a prune drops such a
row with the writes of checkpoints not stored (as rows of ``lg_writes``) and
collects its values. A super-step is 7.5 statements (13 before)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

import cairn
from cairn.errors import ThreadTaken
from tests.langgraph.rawsql import raw_sql as _sql
from tests.langgraph.test_folded_writes import _put, _writes

if TYPE_CHECKING:
    from cairn.langgraph import CairnSaver

#: a value long enough to be a row of lg_values (not a literal ref)
LONG = "a pending write's value " * 4


def _saver(app: cairn.App) -> CairnSaver:
    from cairn.langgraph import CairnSaver

    return CairnSaver(app, tenant="acme")


def _stored(db_url: str) -> tuple[Any, ...]:
    """What the thread's tables hold that a refused write could have changed."""
    return (_sql(db_url, "SELECT count(*) FROM lg_writes")[0][0],
            _sql(db_url, "SELECT count(*) FROM lg_values")[0][0],
            _sql(db_url, "SELECT count(*) FROM lg_checkpoints")[0][0],
            sorted(bytes(r[0] or b"") for r in _sql(db_url, "SELECT writes FROM lg_checkpoints")))


def test_a_writer_that_lost_the_thread_writes_nothing(app: cairn.App, db_url: str) -> None:
    first, second = _saver(app), _saver(app)
    c1 = _put(first, None, 0)
    first.put_writes(c1, [("log", LONG)], "task-a")  # into c1's row: first put it
    ahead = {"configurable": {**c1["configurable"], "checkpoint_id": "1f0-not-stored"}}
    first.put_writes(ahead, [("log", LONG + "0")], "task-a")  # a row of lg_writes (not stored)
    second.hold("t")
    before = _stored(db_url)
    with pytest.raises(ThreadTaken):
        first.put_writes(c1, [("log", LONG + "1")], "task-b")  # a stored checkpoint (its row)
    with pytest.raises(ThreadTaken):
        first.put_writes(ahead, [("log", LONG + "2")], "task-b")  # a checkpoint not stored
    with pytest.raises(ThreadTaken):
        _put(first, c1, 1)
    with pytest.raises(ThreadTaken):
        first.hold("t")
    assert _stored(db_url) == before
    assert _writes(second, c1) == [("task-a", "log", LONG)]


def test_a_writer_whose_thread_was_freed_takes_it_again(app: cairn.App, db_url: str) -> None:
    first = _saver(app)
    c1 = _put(first, None, 0)
    first.put_writes(c1, [("log", LONG)], "task-a")
    _saver(app).delete_thread("t")  # another saver frees the thread: no holder row
    c1 = _put(first, None, 0)
    first.put_writes(c1, [("log", LONG)], "task-a")
    assert _sql(db_url, "SELECT epoch FROM lg_threads")[0][0] == 1
    assert _writes(_saver(app), c1) == [("task-a", "log", LONG)]


def test_a_writer_whose_epoch_moved_under_it_still_writes(app: cairn.App, db_url: str) -> None:
    first = _saver(app)
    c1 = _put(first, None, 0)
    _sql(db_url, "UPDATE lg_threads SET epoch = epoch + 4")  # its own row, another epoch
    first.put_writes(c1, [("log", LONG)], "task-a")
    c2 = _put(first, c1, 1)
    first.put_writes(c2, [("log", LONG + "!")], "task-b")
    assert _sql(db_url, "SELECT epoch FROM lg_threads")[0][0] == 5
    assert _writes(_saver(app), c1) == [("task-a", "log", LONG)]
    assert _writes(_saver(app), c2) == [("task-b", "log", LONG + "!")]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_writes_before_their_checkpoint_are_its_pending_row(app: cairn.App, db_url: str) -> None:
    from langgraph.checkpoint.base import ERROR

    saver = _saver(app)
    c1 = _put(saver, None, 0)
    c2_id = "1fff0000-0000-6000-8000-000000000002"
    c2 = {"configurable": {**c1["configurable"], "checkpoint_id": c2_id}}
    saver.put_writes(c2, [("log", LONG), ("n", 7)], "task-b", "~path, b")
    saver.put_writes(c2, [("log", "retried")], "task-b", "~path, b")  # a regular write: the first stays
    saver.put_writes(c2, [(ERROR, "boom")], "task-c")
    saver.put_writes(c2, [(ERROR, "boom again")], "task-c")  # a special write: the last stays
    assert _sql(db_url, "SELECT count(*) FROM lg_writes")[0][0] == 0
    pending = _sql(db_url, "SELECT checkpoint_kind FROM lg_checkpoints WHERE checkpoint_id = ?", (c2_id,))
    assert pending == [("",)]
    thread = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    for reader in (saver, _saver(app)):  # a pending row is no checkpoint
        assert reader.get_tuple(c2) is None
        latest = reader.get_tuple(thread)
        assert latest is not None
        assert latest.config == c1
        assert [t.config for t in reader.list(thread)] == [c1]
    expected = [("task-c", ERROR, "boom again"), ("task-b", "log", LONG), ("task-b", "n", 7)]
    assert _put(saver, c1, 1, checkpoint_id=c2_id) == c2
    assert _writes(saver, c2) == expected
    assert _writes(_saver(app), c2) == expected
    saver.put_writes(c2, [("log", "after")], "task-d")  # into the row, after the pending ones
    # read in task path order: task-d (no path) before task-b
    assert _writes(_saver(app), c2) == [expected[0], ("task-d", "log", "after"), *expected[1:]]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_prune_keeps_what_stored_writes_name_and_drops_pending_rows(app: cairn.App, db_url: str) -> None:
    """Values named by a stored checkpoint's writes survive a prune; a pending
    row (writes of a checkpoint not stored) after the latest checkpoint is a
    writer's in flight and is kept with its value; once a later checkpoint is
    stored it is a leftover, dropped by the prune and its value collected."""
    saver = _saver(app)
    c1 = _put(saver, None, 0)
    _saver(app).put_writes(c1, [("log", LONG)], "task-a")  # another saver: it takes the thread
    ahead = {"configurable": {**c1["configurable"], "checkpoint_id": "1fff0000-0000-6000-8000-0000000000ff"}}
    writer = _saver(app)
    writer.put_writes(ahead, [("log", LONG + "ahead")], "task-b")
    assert _sql(db_url, "SELECT count(*) FROM lg_values")[0][0] == 2
    writer.prune(["t"])
    assert _writes(_saver(app), c1) == [("task-a", "log", LONG)]
    assert _sql(db_url, "SELECT count(*) FROM lg_checkpoints")[0][0] == 2  # c1 and the pending row
    assert _sql(db_url, "SELECT count(*) FROM lg_values")[0][0] == 2
    above = {"configurable": {**c1["configurable"], "checkpoint_id": "1fff0000-0000-6000-8000-000000000fff"}}
    _put(writer, c1, 1, checkpoint_id=above["configurable"]["checkpoint_id"])
    writer.prune(["t"])
    assert _sql(db_url, "SELECT count(*) FROM lg_checkpoints")[0][0] == 1
    assert _sql(db_url, "SELECT count(*) FROM lg_values")[0][0] == 0


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_two_super_steps_are_fifteen_statements_on_sqlite(app: cairn.App, db_url: str) -> None:
    """LangGraph's default durability: a super-step's writes, then its
    checkpoint's put. put_writes: BEGIN, its value, its record (the
    checkpoint's pending row), COMMIT; put: BEGIN, its list version (every
    other one: a tail in the checkpoint's row), the checkpoint, COMMIT."""
    from langgraph.checkpoint.base import empty_checkpoint

    saver = _saver(app)
    conn = saver._rows._writer_conn()  # type: ignore[attr-defined]  # the one every write runs on
    config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    sent: list[str] = []
    messages: list[str] = []
    for step in range(5):
        checkpoint = empty_checkpoint()
        checkpoint["id"] = f"1f0e0000-0000-6000-8000-{step:012d}"
        messages = [*messages, f"message {step} " * 10]
        version = saver.get_next_version(None if step == 0 else f"{step:010d}", None)
        checkpoint["channel_values"] = {"log": messages}
        checkpoint["channel_versions"] = {"log": version}
        at = {"configurable": {**config["configurable"], "checkpoint_id": checkpoint["id"]}}
        if step == 3:
            conn.set_trace_callback(sent.append)
        saver.put_writes(at, [("log", [messages[-1]])], "task")
        config = saver.put(config, checkpoint, {"step": step}, {"log": version})
    conn.set_trace_callback(None)
    writes = ["BEGIN IMMEDIATE", "INSERT INTO lg_values", "INSERT INTO lg_checkpoints", "COMMIT"]
    put = ["BEGIN IMMEDIATE", "INSERT INTO lg_checkpoints", "COMMIT"]
    row = [*put[:1], "INSERT INTO lg_blobs", *put[1:]]
    assert [" ".join(s.split()[:3]) for s in sent] in ([*writes, *row, *writes, *put],
                                                       [*writes, *put, *writes, *row])


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_key_verification_and_rotation_pass_a_pending_row(db_url: str) -> None:
    """A pending row holds no checkpoint (its checkpoint and metadata are empty,
    not sealed): re-encryption and its verification leave it to its put."""
    from cairn.api.keys import Keys
    from cairn.langgraph import CairnSaver
    from tests.encryption.test_sealed_store import build, keyring

    app = build(db_url, keyring())
    saver = CairnSaver(app, tenant="a")
    c1 = _put(saver, None, 0)
    ahead = {"configurable": {**c1["configurable"], "checkpoint_id": "1fff0000-0000-6000-8000-0000000000ff"}}
    saver.put_writes(ahead, [("log", LONG)], "task-b")
    keys = Keys(app.store)
    assert all(not r.failures for r in keys.verify()), [r.failures for r in keys.verify()]
    keys.rotate()
    keys.reencrypt(page=3)
    assert all(not r.failures for r in keys.verify()), [r.failures for r in keys.verify()]
    assert _put(saver, c1, 1, checkpoint_id=ahead["configurable"]["checkpoint_id"]) == ahead
    assert _writes(CairnSaver(app, tenant="a"), ahead) == [("task-b", "log", LONG)]
    app.close()
