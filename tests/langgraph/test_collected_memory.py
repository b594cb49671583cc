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

import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest

import cairn
from cairn.langgraph import CairnSaver
from cairn.store.checkpointsql import Stale
from tests.langgraph.logs import FIRST, SECOND, THIRD
from tests.langgraph.logs import log_of as _log
from tests.langgraph.logs import put_log as _put
from tests.langgraph.rawsql import raw_sql as _sql


def _saver(app: cairn.App) -> CairnSaver:
    return CairnSaver(app, tenant="acme")


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
    """A put_writes skips the values its saver remembers committing, as a put
    does (a thread's dictionary row comes with each value compressed with
    it): the same scenario through a node's writes is refused as stale, made
    whole, and reads back."""
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


# -- the two narrower races (2026-12-07, seventh session) -------------------------------
# A read made before a collection that returns after the saver's next write, and a first
# write whose reads of the thread race a collection: both let a saver build on rows the
# collection took. The first fails with the read's memory kept whatever forgets happened
# while it ran (``CairnSaver._capture``); the second with a first write that expects no
# count (``CairnSaver._expecting``).


def _put_channels(saver: CairnSaver, config: Any, step: int, values: dict[str, Any],
                  versions: dict[str, str], written: dict[str, str], thread: str = "t") -> Any:
    """Checkpoint ``step`` of ``thread`` after ``config`` naming ``versions``,
    holding ``values``, having written the channels of ``written``."""
    from langgraph.checkpoint.base import empty_checkpoint

    checkpoint = empty_checkpoint()
    checkpoint["id"] = f"1f0e0000-0000-6000-8000-{step:012d}"
    checkpoint["channel_values"] = dict(values)
    checkpoint["channel_versions"] = dict(versions)
    return saver.put(config or {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}, checkpoint,
                     {"source": "loop", "step": step, "run_id": "r1"}, written)


class Notes(NamedTuple):
    """Checkpoints 0 (``log`` [FIRST], ``note`` SECOND) and 1 (``note``
    THIRD) of a thread: SECOND is named by checkpoint 0 alone."""

    c0: Any
    c1: Any
    log_v: str
    note_v: str
    note_v1: str


def _notes(writer: CairnSaver, thread: str = "t") -> Notes:
    note_v, log_v = writer.get_next_version(None, None), writer.get_next_version(None, None)
    c0 = _put_channels(writer, None, 0, {"log": [FIRST], "note": SECOND},
                       {"log": log_v, "note": note_v}, {"log": log_v, "note": note_v}, thread=thread)
    note_v1 = writer.get_next_version(note_v, None)
    c1 = _put_channels(writer, c0, 1, {"log": [FIRST], "note": THIRD}, {"log": log_v, "note": note_v1},
                       {"note": note_v1}, thread=thread)
    return Notes(c0, c1, log_v, note_v, note_v1)


def _refusals(saver: CairnSaver, monkeypatch: pytest.MonkeyPatch) -> list[Stale]:
    """The ``Stale`` refusals ``saver``'s writes meet from here on (each still handled)."""
    refusals: list[Stale] = []
    stale = saver._stale
    monkeypatch.setattr(saver, "_stale", lambda key, exc: (refusals.append(exc), stale(key, exc)))
    return refusals


def _before_transaction(saver: CairnSaver, monkeypatch: pytest.MonkeyPatch, race: Callable[[], None]) -> None:
    """Run ``race`` once, in ``saver``'s next put, after it read its parent's
    row and before its transaction begins."""
    waited = saver._await_writes

    def racing(parent: Any) -> None:
        monkeypatch.setattr(saver, "_await_writes", waited)
        race()
        waited(parent)

    monkeypatch.setattr(saver, "_await_writes", racing)


def test_a_read_returning_after_a_collection_and_a_write_is_not_built_on(
        app: cairn.App, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader reads checkpoint 0 ([FIRST]); its snapshot is taken before
    another saver's prune collects FIRST, and it returns after the reader's
    first write, which counted the prune. What the read remembers must not
    vouch for FIRST being stored: the reader's next list that starts with
    the item it read stores FIRST again."""
    writer, reader, pruner = _saver(app), _saver(app), _saver(app)
    c0 = _put(writer, None, 0, [FIRST])
    c1 = _put(writer, c0, 1, [SECOND])  # FIRST is named by checkpoint 0 alone
    made = reader._tuple

    def late(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(reader, "_tuple", made)
        pruner.prune(["t"])  # after the read's snapshot, before it is remembered
        _put(reader, c1, 2, [SECOND, THIRD])  # the reader's first write: it holds the count now
        return made(*args, **kwargs)

    monkeypatch.setattr(reader, "_tuple", late)
    found = reader.get_tuple(c0)
    assert found is not None
    first = found.checkpoint["channel_values"]["log"][0]  # the item object the read decoded
    c3 = _put(reader, {"configurable": {"thread_id": "t", "checkpoint_ns": "",
                                        "checkpoint_id": "1f0e0000-0000-6000-8000-000000000002"}},
              3, [first, THIRD])
    assert _log(app, c3) == [FIRST, THIRD]


def test_a_first_write_whose_parent_read_races_a_collection_is_refused_and_made_whole(
        app: cairn.App, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader's first write forks from checkpoint 0 and carries its
    channel ``note`` (not written by the put: read from checkpoint 0's row).
    Another saver's prune collects checkpoint 0 and its note between that
    read and the write's commit. A first write that expected no count was
    stored naming the collected note (unreadable for every reader); it now
    expects the count it read before anything else, is refused, and is made
    again whole: the note, gone with its checkpoint, reads as never written."""
    writer, reader, pruner = _saver(app), _saver(app), _saver(app)
    n = _notes(writer)
    refusals = _refusals(reader, monkeypatch)
    _before_transaction(reader, monkeypatch, lambda: pruner.prune(["t"]))
    log_v2 = reader.get_next_version(n.log_v, None)
    c2 = _put_channels(reader, n.c0, 2, {"log": [FIRST, THIRD]}, {"log": log_v2, "note": n.note_v},
                       {"log": log_v2})
    assert [r.collected for r in refusals] == [1]
    found = _saver(app).get_tuple(c2)
    assert found is not None
    assert found.checkpoint["channel_values"] == {"log": [FIRST, THIRD]}


def test_a_read_made_while_a_first_write_reads_the_count_is_not_built_on(
        app: cairn.App, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A first write reads the thread's count, then forgets the thread, in
    that order. A read of checkpoint 0 made meanwhile, whose snapshot came
    before another saver's prune (which the count then includes), is not
    built on: with the forget first and the count after, the reader kept
    checkpoint 0's record, and its later fork from checkpoint 0 carried the
    note the prune took (unreadable)."""
    writer, reader, pruner = _saver(app), _saver(app), _saver(app)
    n = _notes(writer)
    store = reader._rows
    counted, made = store.lg_collected, reader._tuple

    def pruned_late(*args: Any, **kwargs: Any) -> Any:  # after the read's snapshot
        monkeypatch.setattr(reader, "_tuple", made)
        pruner.prune(["t"])
        return made(*args, **kwargs)

    def count(key: Any) -> int:  # the reader's first write reads the count: a read races it
        monkeypatch.setattr(store, "lg_collected", counted)
        monkeypatch.setattr(reader, "_tuple", pruned_late)
        assert reader.get_tuple(n.c0) is not None
        return counted(key)

    monkeypatch.setattr(store, "lg_collected", count)
    log_v2 = reader.get_next_version(n.log_v, None)
    _put_channels(reader, n.c1, 2, {"log": [FIRST, THIRD], "note": THIRD},
                  {"log": log_v2, "note": n.note_v1}, {"log": log_v2})
    log_v3 = reader.get_next_version(log_v2, None)
    c3 = _put_channels(reader, n.c0, 3, {"log": [THIRD]}, {"log": log_v3, "note": n.note_v}, {"log": log_v3})
    found = _saver(app).get_tuple(c3)
    assert found is not None
    assert found.checkpoint["channel_values"] == {"log": [THIRD]}


def test_a_record_read_before_a_collection_and_a_write_is_not_carried(
        app: cairn.App, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """As a list, so a checkpoint's record (its inline channels): the reader
    reads checkpoint 0, another saver's prune takes it and its note after the
    read's snapshot, the reader's first write lands, then the read returns.
    The reader's fork from checkpoint 0 must not carry the note it read."""
    writer, reader, pruner = _saver(app), _saver(app), _saver(app)
    n = _notes(writer)
    made = reader._versions
    log_v2 = reader.get_next_version(n.log_v, None)

    def late(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(reader, "_versions", made)

        def meanwhile() -> None:  # another thread: SQLite's read transaction is still open here
            pruner.prune(["t"])
            _put_channels(reader, n.c1, 2, {"log": [FIRST, THIRD], "note": THIRD},
                          {"log": log_v2, "note": n.note_v1}, {"log": log_v2})

        other = threading.Thread(target=meanwhile)
        other.start()
        other.join()
        return made(*args, **kwargs)

    monkeypatch.setattr(reader, "_versions", late)  # as the read decodes the row it fetched
    assert reader.get_tuple(n.c0) is not None
    log_v3 = reader.get_next_version(log_v2, None)
    c3 = _put_channels(reader, n.c0, 3, {"log": [THIRD]}, {"log": log_v3, "note": n.note_v}, {"log": log_v3})
    found = _saver(app).get_tuple(c3)
    assert found is not None
    assert found.checkpoint["channel_values"] == {"log": [THIRD]}


def test_values_a_write_committed_before_a_collection_another_write_counted_are_sent_again(
        app: cairn.App, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer's pending write on checkpoint 0 (not the latest) commits
    FIRST; another saver's prune then takes those writes and FIRST, and the
    writer's next write, refused (``Stale``), forgets the thread and is made
    whole, all before the first write remembers FIRST as committed. The
    writer's next checkpoint naming FIRST must send it again."""
    writer, pruner = _saver(app), _saver(app)
    c0 = _put(writer, None, 0, [SECOND])
    c1 = _put(writer, c0, 1, [SECOND, THIRD])
    made = writer._committed

    def late(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(writer, "_committed", made)
        pruner.prune(["t"])  # checkpoint 0 and its pending write go, and FIRST with them
        _put(writer, c1, 2, [SECOND, THIRD])  # refused once (the count), then made whole
        return made(*args, **kwargs)

    monkeypatch.setattr(writer, "_committed", late)
    writer.put_writes(c0, [("log", [FIRST])], "task")
    c3 = _put(writer, {"configurable": {"thread_id": "t", "checkpoint_ns": "",
                                        "checkpoint_id": "1f0e0000-0000-6000-8000-000000000002"}},
              3, [SECOND, THIRD, FIRST])
    assert _log(app, c3) == [SECOND, THIRD, FIRST]


def test_a_first_write_to_a_copy_racing_a_prune_of_the_copy_is_refused_and_made_whole(
        app: cairn.App, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``copy_thread`` target has rows and no holder row. A prune of it
    counted nothing (it updated the row that is not there), so a first write
    there whose parent read raced that prune was stored naming the note the
    prune took. The collection now makes a row owned by nobody, which counts."""
    from cairn.store.checkpointsql import NOBODY

    writer, reader, pruner = _saver(app), _saver(app), _saver(app)
    n = _notes(writer, thread="src")
    writer.copy_thread("src", "t")
    assert _sql(db_url, "SELECT count(*) FROM lg_threads WHERE thread_id = 't'") == [(0,)]
    refusals = _refusals(reader, monkeypatch)

    def prune() -> None:
        pruner.prune(["t"])
        assert _sql(db_url, "SELECT owner, collected FROM lg_threads WHERE thread_id = 't'") == [(NOBODY, 1)]

    _before_transaction(reader, monkeypatch, prune)
    log_v2 = reader.get_next_version(n.log_v, None)
    at = {"configurable": {**n.c0["configurable"], "thread_id": "t"}}
    c2 = _put_channels(reader, at, 2, {"log": [FIRST, THIRD]}, {"log": log_v2, "note": n.note_v},
                       {"log": log_v2})
    assert [r.collected for r in refusals] == [1]
    found = _saver(app).get_tuple(c2)
    assert found is not None
    assert found.checkpoint["channel_values"] == {"log": [FIRST, THIRD]}
    assert _sql(db_url, "SELECT owner <> '' FROM lg_threads WHERE thread_id = 't'") == [(True,)]


def test_a_first_write_whose_parent_read_races_a_deletion_is_refused_and_made_whole(
        app: cairn.App, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """As a prune, a deletion of the thread between a first write's read of
    its parent and its commit: the write expected the count of a holder row
    that is gone, is refused, and is made again whole, carrying nothing of the
    deleted parent (it was stored naming the deleted note, unreadable)."""
    writer, reader, deleter = _saver(app), _saver(app), _saver(app)
    n = _notes(writer)
    refusals = _refusals(reader, monkeypatch)
    _before_transaction(reader, monkeypatch, lambda: deleter.delete_thread("t"))
    log_v2 = reader.get_next_version(n.log_v, None)
    c2 = _put_channels(reader, n.c0, 2, {"log": [FIRST, THIRD]}, {"log": log_v2, "note": n.note_v},
                       {"log": log_v2})
    assert [r.collected for r in refusals] == [None]
    found = _saver(app).get_tuple(c2)
    assert found is not None
    assert found.checkpoint["channel_values"] == {"log": [FIRST, THIRD]}


def test_past_its_forget_numbers_a_saver_forgets_everything(app: cairn.App, db_url: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A saver keeps when it last forgot each thread for ``GENS_KEPT``
    threads; the next forget forgets everything at once (a new number for
    all), so no read or write in flight on any thread remembers what it
    learnt before it: an entry dropped alone could be taken for never forgotten."""
    import cairn.langgraph as lg

    monkeypatch.setattr(lg, "GENS_KEPT", 2)
    saver = _saver(app)
    before = saver._capture("t")  # as a read of thread t begins, before any forget of it
    c0 = _put(saver, None, 0, [FIRST])  # thread t: a first write, a forget
    assert saver._capture("t") != before
    assert saver._lists  # what the write learnt is kept
    for thread in ("u", "v"):  # two more first writes: the third forget goes past GENS_KEPT
        _put(saver, {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}, 0, [SECOND])
    assert saver._capture("t") != before
    assert not any(k[0] == "t" for k in saver._lists)
    c1 = _put(saver, c0, 1, [FIRST, THIRD])  # and it writes on, whole
    assert _log(app, c1) == [FIRST, THIRD]
