"""A LangGraph write in one message on PostgreSQL (issue 24, 2026-12-07): the
fence checked in the server (``lg_hold``, migrations 0051 and 0052) gives the answers of
the client's rule (``checkpointsql.hold_rule``, which SQLite runs), a refused
write commits nothing of its message, and a put folds its parent's writes
stored before it (rows of ``lg_writes``) in its one message when they are the
rows its store inserted, and in two messages, from the rows that moved,
when they are not."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest

import cairn
from cairn.errors import ThreadTaken
from cairn.store.checkpointsql import NO_ROW, Holder, Stale, ThreadKey, hold_rule
from tests.engine.conftest import postgres_url
from tests.langgraph.rawsql import raw_sql as _sql

if TYPE_CHECKING:
    from cairn.langgraph import CairnSaver

#: who holds a thread before a write: nobody, or (owner, epoch, collection count)
HELD: list[tuple[str, int, int] | None] = [None, ("a", 1, 0), ("a", 3, 0), ("b", 3, 0), ("a", 3, 2),
                                           ("", 0, 1), ("", 0, 2)]  # rows a collection made (NOBODY)
#: the writers: every owner, last-held epoch, lease and expected collection count against
#: every holder above
HOLDERS = [Holder(owner, epoch, lease, collected) for owner, epoch, lease, collected in
           itertools.product(("a", "b"), (None, 1, 3), (None, 2, 3, 4), (None, NO_ROW, 0, 2))]


def _saver(app: cairn.App) -> CairnSaver:
    from cairn.langgraph import CairnSaver

    return CairnSaver(app, tenant="acme")


def _expected(held: tuple[str, int, int] | None, holder: Holder, thread: str) -> tuple[Any, ...]:
    """What the client's rule answers, and the holder row it leaves."""
    found = [] if held is None else [held]
    try:
        epoch, take, collected = hold_rule(found, holder, thread)
    except (ThreadTaken, Stale) as exc:
        return "refused", type(exc).__name__, str(exc), held
    return "held", (epoch, collected), (holder.owner, epoch, collected) if take else held


def test_the_fence_answers_as_the_clients_rule_on_both_backends(app: cairn.App, db_url: str) -> None:
    """Every holder row (none, owner a or b at an epoch) against every
    writer (owner, the epoch it last held, a lease or none): the write's
    answer (the epoch held and the collection count, or ThreadTaken or Stale
    and its message) and the holder row after it are ``hold_rule``'s. On
    PostgreSQL that is lg_hold in the server, on SQLite the rule itself; so
    the two agree."""
    rows = _saver(app)._rows
    cases = [(f"t{n}", held, holder) for n, (held, holder) in enumerate(itertools.product(HELD, HOLDERS))]
    planted = [(thread, *held) for thread, held, _ in cases if held is not None]
    _sql(db_url, "INSERT INTO lg_threads (tenant, thread_id, owner, epoch, collected) VALUES "
                 + ", ".join(["('acme', ?, ?, ?, ?)"] * len(planted)),
         tuple(v for row in planted for v in row))
    answers: list[tuple[Any, ...]] = []
    for thread, _, holder in cases:
        try:
            answers.append(("held", rows.lg_put_writes(ThreadKey("acme", thread, ""), holder, "", [], [])))
        except (ThreadTaken, Stale) as exc:
            answers.append(("refused", type(exc).__name__, str(exc)))
    after = {str(t): (str(o), int(e), int(c)) for t, o, e, c in
             _sql(db_url, "SELECT thread_id, owner, epoch, collected FROM lg_threads WHERE tenant = 'acme'")}
    got = [(*answer, after.get(thread)) for answer, (thread, _, _) in zip(answers, cases, strict=True)]
    assert got == [_expected(held, holder, thread) for thread, held, holder in cases]
    # and the rule is the one the module states (a few of the answers, spelled out)
    by_case = {(held, holder): answer for (_, held, holder), answer in zip(cases, got, strict=True)}
    assert by_case[(None, Holder("a", None))] == ("held", (1, 0), ("a", 1, 0))
    assert by_case[(("b", 3, 0), Holder("a", None))] == ("held", (4, 0), ("a", 4, 0))  # never held: took it
    assert by_case[(("a", 3, 0), Holder("a", 1))] == ("held", (3, 0), ("a", 3, 0))
    assert by_case[(("b", 3, 0), Holder("a", 1))][:2] == ("refused", "ThreadTaken")  # held it, lost it
    assert by_case[(("b", 3, 0), Holder("a", 1, lease=2))][:2] == ("refused", "ThreadTaken")  # a later lease
    assert by_case[(("b", 3, 0), Holder("a", 1, lease=3))] == ("held", (3, 0), ("a", 3, 0))
    assert by_case[(("a", 1, 0), Holder("b", 3, lease=4))] == ("held", (4, 0), ("b", 4, 0))
    # a writer whose memory was made at another collection count, or of a thread deleted since
    assert by_case[(("a", 3, 2), Holder("a", 3, collected=0))][:2] == ("refused", "Stale")
    assert by_case[(("a", 3, 2), Holder("a", 3, collected=2))] == ("held", (3, 2), ("a", 3, 2))
    assert by_case[(("a", 3, 2), Holder("a", 3, collected=None))] == ("held", (3, 2), ("a", 3, 2))
    assert by_case[(None, Holder("a", 3, collected=0))][:2] == ("refused", "Stale")  # deleted since
    # a first write expects the count it read, NO_ROW if the thread had no holder row then
    assert by_case[(None, Holder("a", None, collected=0))][:2] == ("refused", "Stale")  # deleted since
    assert by_case[(None, Holder("a", None, collected=NO_ROW))] == ("held", (1, 0), ("a", 1, 0))
    assert by_case[(("b", 3, 0), Holder("a", None, collected=NO_ROW))] == ("held", (4, 0), ("a", 4, 0))
    assert by_case[(("", 0, 1), Holder("a", None, collected=NO_ROW))][:2] == ("refused", "Stale")
    assert by_case[(("", 0, 2), Holder("a", None, collected=2))] == ("held", (1, 2), ("a", 1, 2))
    assert by_case[(("a", 3, 2), Holder("a", 1, lease=3, collected=0))][:2] == ("refused", "Stale")


def test_a_refused_write_commits_nothing_of_its_message(app: cairn.App, db_url: str) -> None:
    """A stale saver's put_writes (values, writes) and put (values, the
    checkpoint) are refused with nothing of them stored: on PostgreSQL the
    message stops at lg_hold, its COMMIT never runs."""
    first, second = _saver(app), _saver(app)
    c0 = _put(first, None, "1f000000-0000-6000-8000-000000000000", ["x"])
    second.hold("t")
    stored = "SELECT (SELECT count(*) FROM lg_values), (SELECT count(*) FROM lg_checkpoints)"
    counts = _sql(db_url, stored)
    with pytest.raises(ThreadTaken, match="'t' was taken by another saver"):
        first.put_writes(c0, [("log", ["never stored " * 20])], "task")
    with pytest.raises(ThreadTaken, match="'t' was taken by another saver"):
        _put(first, c0, "1f000000-0000-6000-8000-000000000001", ["x", "never stored either " * 20])
    assert _sql(db_url, stored) == counts
    assert _sql(db_url, "SELECT count(*) FROM lg_writes")[0][0] == 0
    found = second.get_tuple({"configurable": {"thread_id": "t"}})
    assert found is not None
    assert found.pending_writes == []


def _put(saver: CairnSaver, parent: Any, checkpoint_id: str, log: list[str]) -> Any:
    """Checkpoint ``checkpoint_id`` of thread ``t`` after ``parent`` (a config, or ``None``)."""
    from langgraph.checkpoint.base import empty_checkpoint

    checkpoint = empty_checkpoint()
    checkpoint["id"] = checkpoint_id
    checkpoint["channel_values"] = {"log": list(log)}
    version = f"{int(checkpoint_id[-4:]):010d}.aa"
    checkpoint["channel_versions"] = {"log": version}
    config = parent or {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    return saver.put(config, checkpoint, {"source": "loop", "step": 0, "parents": {}}, {"log": version})


def _at(checkpoint_id: str) -> Any:
    return {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": checkpoint_id}}


IDS = [f"1f000000-0000-6000-8000-00000000000{n}" for n in range(4)]


def _writes_before_their_checkpoint(saver: CairnSaver, db_url: str) -> Any:
    """Checkpoint 0; writes of two tasks (a special one among them) put to
    checkpoint 1 before it is stored (rows of lg_writes, as LangGraph's loop
    leaves them when a node's writes win the race to the thread's lock);
    then checkpoint 1. Returns its config."""
    from langgraph.checkpoint.base import ERROR

    c0 = _put(saver, None, IDS[0], [])
    saver.put_writes(_at(IDS[1]), [("log", ["b"]), ("n", 2)], "task-b", "~path, b")
    saver.put_writes(_at(IDS[1]), [("log", ["a"])], "task-a", "~path, a")
    saver.put_writes(_at(IDS[1]), [(ERROR, "boom")], "task-a", "~path, a")
    c1 = _put(saver, c0, IDS[1], [])
    assert _sql(db_url, "SELECT count(*) FROM lg_writes")[0][0] == 4
    return c1


EXPECTED = [("task-b", "log", ["b"]), ("task-b", "n", 2), ("task-a", "log", ["a"]),
            ("task-a", "__error__", "boom")]


def _folded_writes(app: cairn.App, db_url: str, config: Any) -> list[tuple[str, str, Any]]:
    """The pending writes of ``config`` as a new saver reads them, once they are folded."""
    assert _sql(db_url, "SELECT count(*) FROM lg_writes")[0][0] == 0
    found = _saver(app).get_tuple(config)
    assert found is not None
    return sorted(found.pending_writes or [], key=str)


def test_a_put_folds_the_rows_its_store_inserted_in_one_message(pg_app: cairn.App, pg_url: str,
                                                                 statements: Counter[str]) -> None:
    db_url = postgres_url(pg_url)
    saver = _saver(pg_app)
    c1 = _writes_before_their_checkpoint(saver, db_url)
    statements.clear()
    _put(saver, c1, IDS[2], ["a", "b"])
    assert statements["SELECT held,"] == 1, statements
    assert statements["BEGIN; SELECT"] == 0, statements  # not sent again in two
    assert _folded_writes(pg_app, db_url, c1) == sorted(EXPECTED, key=str)


@pytest.mark.parametrize("behind", ["another process's row", "a row changed", "a row gone"])
def test_a_put_folding_rows_its_store_did_not_insert_is_sent_again_in_two(
        pg_app: cairn.App, pg_url: str, statements: Counter[str], behind: str) -> None:
    """Rows of lg_writes other than those the store inserted (another
    process's, or changed behind its back): the one message is refused
    (LGF01) and rolled back, and the put is sent again in two messages,
    folding exactly the rows that are there."""
    from langgraph.checkpoint.base import ERROR

    db_url = postgres_url(pg_url)
    saver = _saver(pg_app)
    c1 = _writes_before_their_checkpoint(saver, db_url)
    expected = sorted(EXPECTED, key=str)
    if behind == "another process's row":  # a write of task-c, as another process's saver stores it
        _sql(db_url, "INSERT INTO lg_writes SELECT tenant, thread_id, ns, checkpoint_id, 'task-c', 0, "
                     "channel, '', kind, refs FROM lg_writes WHERE task_id = 'task-a' AND idx = 0")
        expected = sorted([*EXPECTED, ("task-c", "log", ["a"])], key=str)
    elif behind == "a row changed":
        _sql(db_url, "UPDATE lg_writes SET task_path = '~path, z' WHERE task_id = 'task-b' AND idx = 1")
    else:
        _sql(db_url, "DELETE FROM lg_writes WHERE task_id = 'task-a' AND idx < 0")
        expected = [w for w in expected if w[1] != ERROR]
    statements.clear()
    _put(saver, c1, IDS[2], ["a", "b"])
    assert statements["SELECT held,"] == 1, statements  # refused, rolled back
    assert statements["BEGIN; SELECT"] == 1, statements  # and sent again in two
    assert _folded_writes(pg_app, db_url, c1) == expected
