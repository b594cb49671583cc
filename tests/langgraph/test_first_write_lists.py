"""What a saver read of a thread before its first write to it (issue 24,
2026-12-08). A first write reads the thread's collection count and forgets
what the saver read before it (docs/design.md, "The two narrower races,
closed"): nothing vouched for it. Forgetting the lists too made every first
write restate each list whole, and a saver a request (each reading the
thread, then writing it: a web handler, a run resumed by a new execution)
stored 8 bytes per item per request, or, where the list read ended in a
tail, every item since its base in every checkpoint. A list read before the
count is now kept when what its next version would name is still stored,
read after the count. These tests attack that check (the list's rows, and its
tail's values, gone in between) and measure the storage it saves, on both
backends, reading back through a new saver."""

from __future__ import annotations

from typing import Any

import pytest

import cairn
from cairn.langgraph import READ_CHAIN, CairnSaver
from cairn.store.checkpointsql import unpack_refs
from tests.langgraph.logs import FIRST, FOURTH, SECOND, THIRD
from tests.langgraph.logs import put_log as _put
from tests.langgraph.rawsql import raw_sql as _sql


def _saver(app: cairn.App) -> CairnSaver:
    return CairnSaver(app, tenant="acme")


def _read(saver: CairnSaver, config: Any) -> list[str]:
    found = saver.get_tuple(config)
    assert found is not None
    return list(found.checkpoint["channel_values"]["log"])


def test_a_list_read_whose_rows_a_prune_took_before_the_first_write_is_restated(app: cairn.App,
                                                                                  db_url: str) -> None:
    writer = _saver(app)
    c0 = _put(writer, None, 0, [FIRST])
    c1 = _put(writer, c0, 1, [FIRST, SECOND])
    _put(writer, c1, 2, [THIRD])  # the list replaced: checkpoint 2 names none of 0's and 1's rows
    reader = _saver(app)
    found = reader.get_tuple(c1)  # read before the reader's first write
    assert found is not None
    log = found.checkpoint["channel_values"]["log"]
    _saver(app).prune(["t"])  # keeps checkpoint 2: the list's versions of 0 and 1 go, FIRST and SECOND too
    forked = _put(reader, c1, 3, [*log, FOURTH])  # a fork of checkpoint 1, made of the items read
    assert _read(_saver(app), forked) == [FIRST, SECOND, FOURTH]


def test_a_list_read_whose_tail_value_went_before_the_first_write_is_restated(app: cairn.App,
                                                                              db_url: str) -> None:
    """The list read ends in a tail (items in the checkpoint's row, after a
    version stored as a row): its base row is still there, one of its values
    is not. The next version, stored against the base, would name it."""
    writer = _saver(app)
    c0 = _put(writer, None, 0, [FIRST])
    c1 = _put(writer, c0, 1, [FIRST, SECOND])
    reader = _saver(app)
    found = reader.get_tuple(c1)
    assert found is not None
    log = found.checkpoint["channel_values"]["log"]
    known = reader._lists[("t", "", "log")]
    tail = unpack_refs(known.refs[known.spine[-1][2] * 8:])
    assert len(tail) == 1  # SECOND, in checkpoint 1's row
    _sql(db_url, "DELETE FROM lg_values WHERE digest = ?", (tail[0],))  # as a collection would
    c2 = _put(reader, c1, 2, [*log, THIRD])
    assert _read(_saver(app), c2) == [FIRST, SECOND, THIRD]


def test_a_list_read_that_is_still_stored_is_not_restated(app: cairn.App, db_url: str) -> None:
    writer = _saver(app)
    config = None
    log: list[str] = []
    for step, message in enumerate((FIRST, SECOND, THIRD)):
        log.append(message)
        config = _put(writer, config, step, list(log))
    reader = _saver(app)
    found = reader.get_tuple(config)
    assert found is not None
    read = found.checkpoint["channel_values"]["log"]
    before = _sql(db_url, "SELECT count(*) FROM lg_values")
    config = _put(reader, config, 3, [*read, FOURTH])
    assert _read(_saver(app), config) == [FIRST, SECOND, THIRD, FOURTH]
    restated = _sql(db_url, "SELECT count(*) FROM lg_blobs WHERE base IS NULL AND thread_id = 't'")
    assert restated == [(1,)]  # the first version alone: the reader's stored against what it read
    assert _sql(db_url, "SELECT count(*) FROM lg_values") == [(before[0][0] + 1,)]


def _list_bytes(db_url: str, thread: str) -> int:
    """The bytes of the thread's list rows and checkpoint rows (where a tail's digests are)."""
    blobs = _sql(db_url, "SELECT coalesce(sum(length(refs)), 0) FROM lg_blobs WHERE thread_id = ?", (thread,))
    rows = _sql(db_url, "SELECT coalesce(sum(length(checkpoint)), 0) FROM lg_checkpoints WHERE thread_id = ?",
                (thread,))
    return int(blobs[0][0]) + int(rows[0][0])


def test_a_saver_a_request_stores_a_list_as_one_saver_does(app: cairn.App, db_url: str) -> None:
    """Thread ``one``: one saver writes 120 checkpoints of a growing list.
    Thread ``each``: a new saver a checkpoint, reading the thread first; with
    ``hold`` (as a Cairn run's execution does) and without. Their list and
    checkpoint bytes stay within 1.5x of one saver's (forgetting the list
    read, without ``hold``: 4.5x; carrying the read tail, with it: 11x)."""
    steps = 120
    messages = [f"message {n}: " + "words " * 30 for n in range(steps)]
    saver = _saver(app)
    config = None
    for n in range(steps):
        config = _put(saver, config, n, messages[:n + 1], "one")
    for thread, hold in (("each", False), ("held", True)):
        config = None
        for n in range(steps):
            saver = _saver(app)
            if hold:
                saver.hold(thread)
            log = [] if config is None else saver.get_tuple(config).checkpoint["channel_values"]["log"]
            config = _put(saver, config, n, [*log, messages[n]], thread)
        assert _read(_saver(app), config) == messages
        assert _list_bytes(db_url, thread) <= 1.5 * _list_bytes(db_url, "one"), thread
        # each saver's version on top of the one it read: a read walks at most READ_CHAIN rows and a few
        depth = _sql(db_url, "SELECT max(depth) FROM lg_blobs WHERE thread_id = ?", (thread,))[0][0]
        assert depth <= READ_CHAIN + 2, (thread, depth)


def test_a_prune_between_the_check_and_the_commit_refuses_the_write(app: cairn.App, db_url: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The check passes; a prune then takes what the kept list names before
    the write commits. The write expects the count read before the check:
    it is refused as stale and made again whole."""
    writer = _saver(app)
    c0 = _put(writer, None, 0, [FIRST])
    c1 = _put(writer, c0, 1, [FIRST, SECOND])
    _put(writer, c1, 2, [THIRD])
    reader = _saver(app)
    found = reader.get_tuple(c1)
    assert found is not None
    log = found.checkpoint["channel_values"]["log"]
    present = reader._rows.lg_present

    def then_pruned(*args: Any, **kwargs: Any) -> bool:
        answer = present(*args, **kwargs)
        assert answer  # the list's rows are there now
        _saver(app).prune(["t"])  # and go before the write commits
        return answer

    monkeypatch.setattr(reader._rows, "lg_present", then_pruned)
    forked = _put(reader, c1, 3, [*log, FOURTH])
    assert _read(_saver(app), forked) == [FIRST, SECOND, FOURTH]
