"""A saver's memory of a thread against collections by others (issue 24,
2026-12-07 fifth session). A CairnSaver skips writing what it remembers
committing (a value) and builds a list's new version on what it remembers of
the last one (only new items are written). A prune or ``delete_for_runs`` by
another saver, or another process, collects rows nothing names any more; a
checkpoint the first saver then put naming one of those values again was
stored, and unreadable for every reader (``UnreadableCheckpoint``). Each
collection now counts itself in the thread's holder row, a write names the
count its saver's memory was made under, and a stale one is refused before
anything is written (``Stale``): the saver forgets the thread and writes the
checkpoint whole. Each test reads back through a new saver (no memory), on
both backends."""

from __future__ import annotations

from typing import Any

import pytest

import cairn
from cairn.langgraph import CairnSaver
from tests.langgraph.rawsql import raw_sql as _sql

FIRST = "the first message, long enough to be a value row of its own; " * 4
SECOND = "the second message, long enough to be a value row of its own; " * 4
THIRD = "the third message, long enough to be a value row of its own; " * 4


def _saver(app: cairn.App) -> CairnSaver:
    return CairnSaver(app, tenant="acme")


def _put(saver: CairnSaver, config: Any, step: int, log: list[str], run_id: str = "r1") -> Any:
    """Checkpoint ``step`` of thread ``t`` after ``config``, channel ``log`` = ``log``."""
    from langgraph.checkpoint.base import empty_checkpoint

    checkpoint = empty_checkpoint()
    checkpoint["id"] = f"1f0e0000-0000-6000-8000-{step:012d}"
    version = saver.get_next_version(None if step == 0 else f"{step:010d}", None)
    checkpoint["channel_values"] = {"log": list(log)}
    checkpoint["channel_versions"] = {"log": version}
    return saver.put(config or {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, checkpoint,
                     {"source": "loop", "step": step, "run_id": run_id}, {"log": version})


def _log(app: cairn.App, config: Any) -> list[str]:
    """Channel ``log`` of ``config``'s checkpoint, as a new saver reads it."""
    found = _saver(app).get_tuple(config)
    assert found is not None
    return list(found.checkpoint["channel_values"]["log"])


def test_a_value_collected_by_another_savers_prune_is_written_again(app: cairn.App, db_url: str) -> None:
    writer, pruner = _saver(app), _saver(app)
    c0 = _put(writer, None, 0, [FIRST])
    c1 = _put(writer, c0, 1, [SECOND])  # the list replaced: FIRST is named by checkpoint 0 alone
    pruner.prune(["t"])  # keeps checkpoint 1: FIRST's value is collected
    assert _sql(db_url, "SELECT collected FROM lg_threads WHERE thread_id = 't'") == [(1,)]
    c2 = _put(writer, c1, 2, [SECOND, FIRST])  # the writer remembers FIRST as stored
    assert _log(app, c2) == [SECOND, FIRST]
    c3 = _put(writer, c2, 3, [SECOND, FIRST, THIRD])  # and goes on, expecting the count now
    assert _log(app, c3) == [SECOND, FIRST, THIRD]


def test_a_prune_that_collects_nothing_counts_nothing(app: cairn.App, db_url: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a collection that deleted a row counts: one that deleted nothing
    leaves every saver's memory true, and its next write is not refused."""
    writer, pruner = _saver(app), _saver(app)
    c0 = _put(writer, None, 0, [FIRST])
    c1 = _put(writer, c0, 1, [FIRST, SECOND])  # checkpoint 1 names every value and version kept
    pruner.prune(["t"])
    assert _sql(db_url, "SELECT collected FROM lg_threads WHERE thread_id = 't'") == [(0,)]
    refused: list[Any] = []
    monkeypatch.setattr(writer, "_stale", lambda key, exc: refused.append(exc))
    c2 = _put(writer, c1, 2, [FIRST, SECOND, THIRD])
    assert refused == []
    assert _log(app, c2) == [FIRST, SECOND, THIRD]


def test_pending_writes_naming_a_collected_value_are_written_again(app: cairn.App, db_url: str) -> None:
    """A put_writes stores its values whatever its saver remembers (it skips
    none): the same scenario through a node's writes reads back too."""
    writer, pruner = _saver(app), _saver(app)
    c0 = _put(writer, None, 0, [FIRST])
    c1 = _put(writer, c0, 1, [SECOND])
    pruner.prune(["t"])
    writer.put_writes(c1, [("log", [FIRST])], "task")  # a node writes FIRST again
    found = _saver(app).get_tuple(c1)
    assert found is not None
    assert found.pending_writes == [("task", "log", [FIRST])]


def test_a_value_collected_by_another_savers_delete_for_runs_is_written_again(app: cairn.App,
                                                                             db_url: str) -> None:
    writer, deleter = _saver(app), _saver(app)
    c0 = _put(writer, None, 0, [FIRST], run_id="old")
    c1 = _put(writer, c0, 1, [SECOND], run_id="new")
    deleter.delete_for_runs(["old"])  # checkpoint 0 and FIRST's value go
    c2 = _put(writer, c1, 2, [SECOND, FIRST], run_id="new")
    assert _log(app, c2) == [SECOND, FIRST]


def test_a_thread_deleted_by_another_saver_is_written_whole(app: cairn.App, db_url: str) -> None:
    """The writer remembers the list it wrote; the thread is deleted under
    it; its next checkpoint extends that list: every item is stored again."""
    writer, deleter = _saver(app), _saver(app)
    c0 = _put(writer, None, 0, [FIRST])
    c1 = _put(writer, c0, 1, [FIRST, SECOND])
    deleter.delete_thread("t")
    c2 = _put(writer, c1, 2, [FIRST, SECOND, THIRD])
    assert _log(app, c2) == [FIRST, SECOND, THIRD]


def test_what_a_saver_read_before_a_collection_is_not_built_on(app: cairn.App, db_url: str) -> None:
    """A saver that only read the thread (its memory: the list it read) and
    writes after another saver's prune collected that list's items: its
    first write expects nothing and builds on nothing it remembers."""
    writer, reader, pruner = _saver(app), _saver(app), _saver(app)
    c0 = _put(writer, None, 0, [FIRST])
    assert reader.get_tuple(c0) is not None  # the reader now holds [FIRST] as checkpoint 0's list
    c1 = _put(writer, c0, 1, [SECOND])
    pruner.prune(["t"])
    c2 = _put(reader, c1, 2, [FIRST, THIRD])  # the reader takes the thread (writer never wrote since)
    assert _log(app, c2) == [FIRST, THIRD]


def test_a_stale_write_is_refused_whole_before_it_is_made_again(app: cairn.App, db_url: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The refused attempt writes nothing (the store's fence), then the
    saver forgets the thread and the write is made once, whole."""
    from cairn.store.checkpointsql import Stale

    writer, pruner = _saver(app), _saver(app)
    c0 = _put(writer, None, 0, [FIRST])
    c1 = _put(writer, c0, 1, [SECOND])
    pruner.prune(["t"])
    refusals: list[Stale] = []
    stale = writer._stale

    def counted(key: Any, exc: Stale) -> None:
        refusals.append(exc)
        rows = _sql(db_url, "SELECT count(*) FROM lg_checkpoints WHERE checkpoint_id >= "
                            + ("lg_id_key(?)" if "postgres" in db_url else "?"),
                    ("1f0e0000-0000-6000-8000-000000000002",))
        assert rows == [(0,)]  # nothing of the refused attempt
        stale(key, exc)

    monkeypatch.setattr(writer, "_stale", counted)
    c2 = _put(writer, c1, 2, [SECOND, FIRST])
    assert [r.collected for r in refusals] == [1]
    assert _log(app, c2) == [SECOND, FIRST]
