"""A thread's own compression dictionary (``cairn.lgdictionary``, issue 24:
PostgreSQL's bytes on disk). Once a saver has written ~31 KB of a thread's
values, it compresses the rest with a dictionary made of them, stored as a
row of the thread's values. Each test reads back through a new saver (no
memory of the thread), on both backends, and attacks what the dictionary
adds: a value is only as readable as its dictionary, so the dictionary must
be stored with the first value that uses it, survive every collection that
keeps a value, follow a copy, be made again after a deletion, and be refused
(never used to decode other text) when it is damaged, substituted, missing,
or another thread's or tenant's."""

from __future__ import annotations

import os
import random
import zlib
from collections.abc import Iterator
from typing import Any

import pytest

import cairn
from cairn.errors import UnreadableCheckpoint
from cairn.langgraph import ZDICT_1, CairnSaver
from cairn.lgdictionary import KIND, MARK
from cairn.security.envelope import deflate_raw
from cairn.security.keyring import LocalKeyring
from tests.langgraph.logs import log_of as _log
from tests.langgraph.logs import put_log as _put
from tests.langgraph.rawsql import raw_sql as _sql

#: messages a test thread holds: past the dictionary's ~31 KB, so the last ten or so use it
MESSAGES = 42
_PICK = random.Random(7)
#: a vocabulary as large as a conversation's: a message repeats few of its own words
_WORDS = ["".join(_PICK.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(_PICK.randint(2, 9)))
          for _ in range(3000)]


def _message(n: int, thread: str = "t") -> str:
    """About 1 KB of words from a shared vocabulary, distinct per message."""
    pick = random.Random(f"{thread} {n}")
    return f"{thread} {n}: " + " ".join(pick.choice(_WORDS) for _ in range(160))


def _saver(app: cairn.App, tenant: str = "acme") -> CairnSaver:
    return CairnSaver(app, tenant=tenant)


def _chat(saver: CairnSaver, thread: str = "t", messages: int = MESSAGES, first: int = 0,
          config: Any = None, log: list[str] | None = None) -> tuple[Any, list[str]]:
    """Append ``messages`` messages to ``thread``, one checkpoint each; the last config and log."""
    log = list(log or [])
    for n in range(first, first + messages):
        log.append(_message(n, thread))
        config = _put(saver, config, n, log, thread)
    return config, log


def _dictionaries(db_url: str, thread: str = "t") -> list[tuple[int, bytes]]:
    return [(int(d), bytes(data)) for d, data in _sql(
        db_url, "SELECT digest, data FROM lg_values WHERE thread_id = ? AND kind = ?", (thread, KIND))]


def _compressed_with_it(db_url: str, thread: str = "t") -> int:
    """How many of the thread's values name a dictionary (their bytes start with ``MARK``)."""
    return sum(data[:1] == MARK for data in _values(db_url, thread))


def _values(db_url: str, thread: str = "t") -> list[bytes]:
    """The bytes of the thread's values (not its dictionaries)."""
    return [bytes(d) for (d,) in _sql(
        db_url, "SELECT data FROM lg_values WHERE thread_id = ? AND coalesce(kind, '') <> ?", (thread, KIND))]


def test_a_long_thread_is_compressed_with_its_own_dictionary_and_reads_back(app: cairn.App,
                                                                           db_url: str) -> None:
    config, log = _chat(_saver(app))
    assert len(_dictionaries(db_url)) == 1
    assert _compressed_with_it(db_url) >= 8  # the messages after the first ~31 KB
    assert _log(app, config) == log
    history = list(_saver(app).list({"configurable": {"thread_id": "t"}}))
    assert [len(t.checkpoint["channel_values"]["log"]) for t in history] == list(range(MESSAGES, 0, -1))
    assert history[0].checkpoint["channel_values"]["log"] == log


def test_it_saves_bytes(app: cairn.App, db_url: str) -> None:
    """The point of it: the values after the dictionary take fewer bytes than
    the same messages compressed with the preset dictionary alone."""
    _chat(_saver(app))
    marked = [d for d in _values(db_url) if d[:1] == MARK]
    alone = [len(deflate_raw(_message(n).encode(), 1, ZDICT_1))
             for n in range(MESSAGES - len(marked), MESSAGES)]
    assert sum(map(len, marked)) < 0.9 * sum(alone)


def test_a_second_saver_of_the_thread_takes_the_stored_dictionary(app: cairn.App, db_url: str) -> None:
    config, log = _chat(_saver(app))
    config, log = _chat(_saver(app), first=MESSAGES, config=config, log=log)  # another process goes on
    assert len(_dictionaries(db_url)) == 1
    assert _log(app, config) == log


def test_a_damaged_dictionary_is_refused_naming_the_checkpoint(app: cairn.App, db_url: str) -> None:
    config, _ = _chat(_saver(app))
    [(digest, data)] = _dictionaries(db_url)
    damaged = data[:100] + bytes([data[100] ^ 0x40]) + data[101:]
    _sql(db_url, "UPDATE lg_values SET data = ? WHERE digest = ?", (damaged, digest))
    with pytest.raises(UnreadableCheckpoint, match=r"checkpoint .*dictionary"):
        _log(app, config)


def test_a_substituted_dictionary_is_refused_not_used(app: cairn.App, db_url: str) -> None:
    """A well-formed dictionary of other text, under the digest the values
    name: inflating with it would give other words; its digest is checked."""
    config, _ = _chat(_saver(app))
    [(digest, data)] = _dictionaries(db_url)
    length = len(zlib.decompressobj(-15, zdict=ZDICT_1).decompress(data))
    # as long as the real one: every distance a value's stream names reaches into it
    other = deflate_raw(" ".join(_message(n, "other") for n in range(40)).encode()[:length], 9, ZDICT_1)
    _sql(db_url, "UPDATE lg_values SET data = ? WHERE digest = ?", (other, digest))
    with pytest.raises(UnreadableCheckpoint, match="damaged"):
        _log(app, config)


def test_a_missing_dictionary_is_refused(app: cairn.App, db_url: str) -> None:
    config, _ = _chat(_saver(app))
    _sql(db_url, "DELETE FROM lg_values WHERE kind = ?", (KIND,))
    with pytest.raises(UnreadableCheckpoint, match="not stored"):
        _log(app, config)


def test_another_threads_dictionary_is_not_found(app: cairn.App, db_url: str) -> None:
    """A value moved to another thread names a dictionary that thread does
    not have: looked up in the value's own thread, it is not found."""
    config, _ = _chat(_saver(app))
    _chat(_saver(app), "u", messages=2)  # u has no dictionary
    marked = [d for d in _values(db_url) if d[:1] == MARK]
    u_config = {"configurable": {"thread_id": "u", "checkpoint_ns": "",
                                 "checkpoint_id": "1f0e0000-0000-6000-8000-000000000001"}}
    u_log = _log(app, u_config)
    # every value of u's last checkpoint takes a marked value's bytes
    _sql(db_url, "UPDATE lg_values SET data = ? WHERE thread_id = 'u'", (marked[0],))
    assert len(u_log) == 2
    with pytest.raises(UnreadableCheckpoint, match="not stored"):
        _log(app, u_config)
    assert _log(app, config)  # t itself reads


def test_another_tenants_saver_cannot_read_through_the_dictionary(app: cairn.App, db_url: str) -> None:
    config, _ = _chat(_saver(app))
    assert _saver(app, "globex").get_tuple(config) is None


def test_a_prune_keeps_the_dictionary_of_the_values_it_keeps(app: cairn.App, db_url: str) -> None:
    config, log = _chat(_saver(app))
    _saver(app).prune(["t"])
    assert len(_dictionaries(db_url)) == 1
    assert _log(app, config) == log


def test_a_prune_of_everything_and_a_deletion_take_the_dictionary(app: cairn.App, db_url: str) -> None:
    _chat(_saver(app))
    _chat(_saver(app), "u")
    _saver(app).prune(["t"], strategy="delete")
    _saver(app).delete_thread("u")
    assert _dictionaries(db_url, "t") == []
    assert _dictionaries(db_url, "u") == []
    assert _sql(db_url, "SELECT count(*) FROM lg_values") == [(0,)]


def test_deleting_every_run_of_a_thread_collects_its_dictionary(app: cairn.App, db_url: str) -> None:
    _chat(_saver(app))
    _saver(app).delete_for_runs(["r1"])
    assert _sql(db_url, "SELECT count(*) FROM lg_values WHERE thread_id = 't'") == [(0,)]


def test_a_copy_reads_with_the_copied_dictionary(app: cairn.App, db_url: str) -> None:
    config, log = _chat(_saver(app))
    _saver(app).copy_thread("t", "t2")
    copied = {"configurable": {**config["configurable"], "thread_id": "t2"}}
    assert _log(app, copied) == log
    _saver(app).delete_thread("t")
    assert _log(app, copied) == log


def test_a_writer_whose_thread_was_deleted_stores_its_dictionary_again(app: cairn.App,
                                                                        db_url: str) -> None:
    """The writer remembers its dictionary's row as stored; another saver
    deletes the thread; the writer's next checkpoint, compressed with that
    dictionary, must bring the row back with it (its write is refused as
    stale and made again whole)."""
    writer = _saver(app)
    _chat(writer)
    _saver(app).delete_thread("t")
    assert _dictionaries(db_url) == []
    log2 = [_message(n, "t") for n in range(MESSAGES, MESSAGES + 3)]
    again = _put(writer, None, MESSAGES, log2)
    assert _compressed_with_it(db_url) == 3
    assert len(_dictionaries(db_url)) == 1
    assert _log(app, again) == log2


def test_a_value_encoded_for_one_thread_brings_its_dictionary_to_another(app: cairn.App,
                                                                         db_url: str) -> None:
    """The saver reuses a list item's row by identity (``_encoded``): the same
    object appended in another thread carries its first thread's dictionary."""
    saver = _saver(app)
    _, log = _chat(saver)
    shared = log[-1]
    other = _put(saver, None, 0, [shared], "u")
    assert len(_dictionaries(db_url, "u")) == 1
    assert _log(app, other) == [shared]


@pytest.fixture
def sealed_app(db_url: str) -> Iterator[cairn.App]:
    application = cairn.App(db=db_url, keyring=LocalKeyring({"kek1": os.urandom(32)}, "kek1"),
                            lease_seconds=5.0)
    yield application
    application.close()


def test_a_sealed_thread_has_no_dictionary(sealed_app: cairn.App, db_url: str) -> None:
    """A dictionary of plaintext values beside their ciphertext would give
    away what sealing hides: none is made."""
    config, log = _chat(_saver(sealed_app))
    assert _dictionaries(db_url) == []
    assert _log(sealed_app, config) == log


def test_two_savers_that_each_made_a_dictionary_both_read(app: cairn.App, db_url: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Two savers that made their dictionaries at once (neither found the
    other's stored yet): each value names its own, and a prune keeps both."""
    config, log = _chat(_saver(app))
    second = _saver(app)
    assert second._dictionaries is not None
    monkeypatch.setattr(second._dictionaries, "_find", lambda thread_id, digest: None)
    # the list restarted: the second saver's dictionary is made of other messages
    latest, log2 = _chat(second, first=MESSAGES, config=config)
    assert len(_dictionaries(db_url)) == 2
    assert _log(app, config) == log
    assert _log(app, latest) == log2
    _saver(app).prune(["t"])
    assert _log(app, latest) == log2


def test_a_dictionary_that_inflates_beyond_a_window_is_refused(app: cairn.App, db_url: str) -> None:
    config, _ = _chat(_saver(app))
    [(digest, _)] = _dictionaries(db_url)
    bomb = deflate_raw(bytes(1 << 20), 9, ZDICT_1)
    _sql(db_url, "UPDATE lg_values SET data = ? WHERE digest = ?", (bomb, digest))
    with pytest.raises(UnreadableCheckpoint, match="damaged"):
        _log(app, config)


def test_a_value_whose_dictionary_digest_is_cut_short_is_refused(app: cairn.App, db_url: str) -> None:
    config, _ = _chat(_saver(app))
    marked = [d for d in _values(db_url) if d[:1] == MARK]
    _sql(db_url, "UPDATE lg_values SET data = ? WHERE data = ?", (marked[-1][:5], marked[-1]))
    with pytest.raises(UnreadableCheckpoint, match="cut short"):
        _log(app, config)


def test_a_thread_whose_dictionary_the_saver_let_go_takes_it_again(app: cairn.App, db_url: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A saver keeps the dictionaries of so many threads (``THREADS``): one it
    let go is found stored once the thread has grown enough again, not made anew."""
    monkeypatch.setattr("cairn.lgdictionary.THREADS", 1)
    saver = _saver(app)
    config, log = _chat(saver)
    _chat(saver, "u")  # lets t's dictionary go
    before = _compressed_with_it(db_url)
    config, log = _chat(saver, first=MESSAGES, config=config, log=log)
    assert len(_dictionaries(db_url)) == 1
    assert _compressed_with_it(db_url) > before
    assert _log(app, config) == log


def test_a_thread_sealed_by_adopting_encryption_reads_through_its_sealed_dictionary(
        db_url: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``cairn keys adopt`` seals every value row, the dictionary's too: a
    sealing saver makes no dictionary but opens and reads the one made before."""
    from click.testing import CliRunner

    from cairn.cli.main import main as cli
    from cairn.security.keyring import new_kek_line
    from cairn.store.rekey import version_of

    monkeypatch.setenv("CAIRN_KEYRING", "")
    plain = cairn.App(db=db_url, lease_seconds=5.0)
    config, log = _chat(_saver(plain))
    plain.close()
    ring = tmp_path / "keys"
    ring.write_text(new_kek_line("k1") + "\n")
    done = CliRunner().invoke(cli, ["--db", db_url, "keys", "adopt", "--keyring", f"file:{ring}"])
    assert done.exit_code == 0, done.output
    assert {version_of(data) for _, data in _dictionaries(db_url)} == {1}  # sealed
    sealed = cairn.App(db=db_url, lease_seconds=5.0, keyring=LocalKeyring.from_file(ring))
    try:
        assert _log(sealed, config) == log
        config, log = _chat(_saver(sealed), first=MESSAGES, messages=3, config=config, log=log)
        assert _log(sealed, config) == log
        assert len(_dictionaries(db_url)) == 1
    finally:
        sealed.close()


def test_a_thread_whose_savers_each_write_a_little_still_gets_a_dictionary(app: cairn.App,
                                                                           db_url: str) -> None:
    """A durable run resumed by a new execution every turn writes through a
    new saver each time, which reads the thread first, then stores the node's
    write (``put_writes``: the new message, its one long value), then the
    checkpoint. What it reads counts towards the dictionary as what it writes
    does, so the new message is compressed with one."""
    config: Any = None
    log: list[str] = []
    for n in range(MESSAGES):
        saver = _saver(app)
        if config is not None:
            found = saver.get_tuple(config)
            assert found is not None
            assert found.checkpoint["channel_values"]["log"] == log
            log = found.checkpoint["channel_values"]["log"]  # the objects read, as LangGraph's loop goes on
        message = _message(n)
        if config is not None:
            saver.put_writes(config, [("log", [message])], "task")
        log.append(message)
        config = _put(saver, config, n, log)
    assert len(_dictionaries(db_url)) == 1
    assert _compressed_with_it(db_url) >= 8
    assert _log(app, config) == log


def test_a_dictionary_row_is_sent_once_however_many_values_follow(app: cairn.App, db_url: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The saver remembers the rows it committed lately (``STORED_CACHE``) and
    sends the others again; the dictionary's row comes with every value it
    compressed, so it stays remembered as used, not sent again ~16 KB at a time."""
    monkeypatch.setattr("cairn.langgraph.STORED_CACHE", 8)
    saver = _saver(app)
    sent: list[int] = []
    put = saver._rows.lg_put

    def counted(*args: Any, **kwargs: Any) -> Any:
        sent.extend(r.digest for r in args[5] if r.kind == KIND)
        return put(*args, **kwargs)

    monkeypatch.setattr(saver._rows, "lg_put", counted)
    config, log = _chat(saver, messages=MESSAGES + 20)
    assert len(sent) == 1
    assert _log(app, config) == log
