"""LangGraph checkpoints under encryption at rest, on both backends: with a
keyring the saver seals what its tables hold of the graph's data (values,
checkpoints, metadata), so a canary in the state is nowhere in the lg_*
rows (the control without a keyring finds it); a value's digest is keyed,
so a guessed value cannot be confirmed from the table; a sealed value or
checkpoint moved to another digest, thread, checkpoint or tenant does not
open (an error naming the checkpoint or thread, never a wrong state); and
a saver that cannot seal is refused on an encrypted database."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import pytest

import cairn
from cairn.errors import ConfigError, InvalidArgument, UnreadableCheckpoint
from cairn.security.keyring import LocalKeyring
from tests.encryption.test_sealed_store import CANARY, hits
from tests.langgraph.rawsql import raw_sql as _sql

TABLES = ("lg_checkpoints", "lg_blobs", "lg_writes", "lg_values", "lg_threads")


def _at_rest(db_url: str) -> bytes:
    """Every column of every row of the lg_* tables, as bytes."""
    out = []
    for table in TABLES:
        for row in _sql(db_url, f"SELECT * FROM {table}"):
            out += [bytes(v) if isinstance(v, (bytes, memoryview)) else str(v).encode() for v in row]
    return b"\0".join(out)


@pytest.fixture
def ring() -> LocalKeyring:
    return LocalKeyring({"kek1": os.urandom(32)}, "kek1")


@pytest.fixture
def sealed_app(db_url: str, ring: LocalKeyring) -> Iterator[cairn.App]:
    application = cairn.App(db=db_url, keyring=ring, lease_seconds=5.0)
    yield application
    application.close()


def _chat(app: cairn.App, tenant: str, thread: str, steps: int = 3) -> Any:
    """A graph appending a message with the canary each step, run on ``thread``."""
    from cairn.langgraph import CairnSaver
    from tests.langgraph.graphs import counting_loop

    saver = CairnSaver(app, tenant=tenant)
    counting_loop(steps, f"{CANARY} says hello, step ").compile(checkpointer=saver).invoke(
        {"log": []}, {"configurable": {"thread_id": thread}})
    return saver


@pytest.mark.parametrize("sealed", [True, False], ids=["sealed", "plain-control"])
def test_a_canary_in_a_graphs_state_is_nowhere_in_the_lg_tables(db_url: str, ring: LocalKeyring,
                                                                 sealed: bool) -> None:
    app = cairn.App(db=db_url, keyring=ring if sealed else None, lease_seconds=5.0)
    try:
        saver = _chat(app, "acme", "t", steps=4)
        latest = saver.get_tuple({"configurable": {"thread_id": "t"}})
        assert latest is not None
        assert latest.checkpoint["channel_values"]["log"][3].startswith(CANARY)
        assert len([*saver.list({"configurable": {"thread_id": "t"}})]) == 6
    finally:
        app.close()
    found = hits(_at_rest(db_url))
    assert bool(found) is not sealed, found


def test_a_values_digest_is_keyed(sealed_app: cairn.App) -> None:
    """Whoever reads lg_values cannot confirm a guess: the digest of the
    guessed value, as an unkeyed saver computes it, is not in the table."""
    from cairn.langgraph import digest

    saver = _chat(sealed_app, "acme", "t")
    guessed = saver._dump(f"{CANARY} says hello, step 1")
    where = {"tenant": "acme", "thread_id": "t"}
    stored = {int(d) for d, _ in saver._rows._select("lg_thread_digests", where)}
    assert saver._digest(*guessed) in stored  # the keyed digest names it
    assert digest(*guessed) not in stored


def test_sealed_rows_moved_elsewhere_do_not_open(sealed_app: cairn.App, db_url: str) -> None:
    from cairn.langgraph import CairnSaver

    saver = _chat(sealed_app, "acme", "t")
    _chat(sealed_app, "acme", "u")  # the same messages on another thread: the same keyed digests
    _chat(sealed_app, "evil", "t")  # and on another tenant's thread of the same name
    config: Any = {"configurable": {"thread_id": "t"}}
    ids = [t.config["configurable"]["checkpoint_id"] for t in saver.list(config)]
    assert saver.get_tuple(config) is not None

    def fresh() -> Any:
        return CairnSaver(sealed_app, tenant="acme")  # nothing cached: every value read from the table

    def refused(match: str) -> None:
        try:
            got = fresh().get_tuple(config)
        except UnreadableCheckpoint as exc:
            found = str(exc)
        else:
            raise AssertionError(f"read, not refused ({match!r}): {got}")
        assert re.search(match, found), found

    # a value moved to another digest of its thread
    (big,) = _sql(db_url, "SELECT digest, data FROM lg_values WHERE tenant = 'acme' AND thread_id = 't' "
                          "ORDER BY length(data) DESC LIMIT 1")
    others = _sql(db_url, "SELECT digest, data FROM lg_values WHERE tenant = 'acme' AND thread_id = 't' "
                          "AND digest <> ? ORDER BY length(data) DESC", (big[0],))
    original = bytes(big[1])
    _sql(db_url, "UPDATE lg_values SET data = ? WHERE tenant = 'acme' AND thread_id = 't' AND digest = ?",
         (bytes(others[0][1]), big[0]))
    refused("refused")
    # the same value (same digest) as sealed for thread u of the tenant
    (moved,) = _sql(db_url, "SELECT data FROM lg_values WHERE tenant = 'acme' AND thread_id = 'u' "
                            "AND digest = ?", (big[0],))
    _sql(db_url, "UPDATE lg_values SET data = ? WHERE tenant = 'acme' AND thread_id = 't' AND digest = ?",
         (bytes(moved[0]), big[0]))
    refused("thread 't'")
    # as sealed for another tenant (its own key): its digest differs, so its latest value is taken
    (theirs,) = _sql(db_url, "SELECT data FROM lg_values WHERE tenant = 'evil' AND thread_id = 't' "
                             "ORDER BY length(data) DESC LIMIT 1")
    _sql(db_url, "UPDATE lg_values SET data = ? WHERE tenant = 'acme' AND thread_id = 't' AND digest = ?",
         (bytes(theirs[0]), big[0]))
    refused("refused")
    # plaintext in place of the envelope
    _sql(db_url, "UPDATE lg_values SET data = ? WHERE tenant = 'acme' AND thread_id = 't' AND digest = ?",
         (b"\x93\x01\x02\x03", big[0]))
    refused("refused")
    _sql(db_url, "UPDATE lg_values SET data = ? WHERE tenant = 'acme' AND thread_id = 't' AND digest = ?",
         (original, big[0]))
    assert fresh().get_tuple(config) is not None  # restored: it opens again

    # a checkpoint's sealed bytes moved to another checkpoint of the thread
    (latest, older) = ids[0], ids[1]
    (row,) = _sql(db_url, "SELECT checkpoint, metadata FROM lg_checkpoints WHERE tenant = 'acme' "
                          "AND thread_id = 't' AND checkpoint_id = lg_id_key(?)", (older,))
    _sql(db_url, "UPDATE lg_checkpoints SET checkpoint = ? WHERE tenant = 'acme' AND thread_id = 't' "
                 "AND checkpoint_id = lg_id_key(?)", (bytes(row[0]), latest))
    refused(f"checkpoint {latest!r} of thread 't'.*refused its checkpoint")
    # or to the same checkpoint id of thread u
    (theirs_row,) = _sql(db_url, "SELECT lg_id_text(checkpoint_id) FROM lg_checkpoints WHERE tenant = 'acme' "
                                 "AND thread_id = 'u' ORDER BY checkpoint_id DESC LIMIT 1")
    _sql(db_url, "UPDATE lg_checkpoints SET checkpoint_id = lg_id_key(?) "
                 "WHERE tenant = 'acme' AND thread_id = 't' "
                 "AND checkpoint_id = lg_id_key(?)", (theirs_row[0], latest))
    _sql(db_url, "UPDATE lg_checkpoints SET checkpoint = (SELECT c.checkpoint FROM lg_checkpoints AS c "
                 "WHERE c.tenant = 'acme' AND c.thread_id = 'u' AND c.checkpoint_id = lg_id_key(?)) "
                 "WHERE tenant = 'acme' AND thread_id = 't' AND checkpoint_id = lg_id_key(?)",
         (theirs_row[0], theirs_row[0]))
    refused("refused its checkpoint")
    # metadata moved between checkpoints: the listing refuses it
    _sql(db_url, "UPDATE lg_checkpoints SET metadata = ? WHERE tenant = 'acme' AND thread_id = 't' "
                 "AND checkpoint_id = lg_id_key(?)", (bytes(row[1]), ids[2]))
    with pytest.raises(UnreadableCheckpoint, match="refused its metadata"):
        [*fresh().list(config)]


def test_a_saver_that_cannot_seal_is_refused_on_an_encrypted_tenant(sealed_app: cairn.App,
                                                                   db_url: str) -> None:
    _chat(sealed_app, "acme", "t")
    from cairn.langgraph import CairnSaver

    with pytest.raises(ConfigError, match="this database is encrypted"):
        CairnSaver(db_url, tenant="acme")  # opening the store without the keyring is refused already
    inner = sealed_app.store.inner  # type: ignore[attr-defined]
    with pytest.raises(InvalidArgument, match="tenant 'acme' of this database is encrypted"):
        CairnSaver(inner, tenant="acme")  # the store under the sealing one would write plaintext
    CairnSaver(inner, tenant="other")  # a tenant with no data key yet is plain


def test_copy_thread_under_encryption_reseals_for_the_target(sealed_app: cairn.App, db_url: str) -> None:
    from cairn.langgraph import CairnSaver

    saver = _chat(sealed_app, "acme", "t")
    saver.copy_thread("t", "copy")
    fresh = CairnSaver(sealed_app, tenant="acme")
    a = [(t.checkpoint["channel_values"], t.pending_writes, t.metadata.get("step"))
         for t in fresh.list({"configurable": {"thread_id": "t"}})]
    b = [(t.checkpoint["channel_values"], t.pending_writes, t.metadata.get("step"))
         for t in fresh.list({"configurable": {"thread_id": "copy"}})]
    assert a == b
    assert len(a) == 5
    assert not hits(_at_rest(db_url))


def test_a_durable_langgraph_run_is_sealed_too(sealed_app: cairn.App, db_url: str) -> None:
    """A graph run as a Cairn workflow (``cairn.lgdurable``: thread ``lg:<run id>``
    of the run's tenant) runs under encryption, and its checkpoints are sealed
    (before, its saver refused the sealing store)."""
    from tests.langgraph.graphs import counting_loop

    workflow = sealed_app.langgraph(counting_loop(3, f"{CANARY} at ").compile(), name="count")
    final = sealed_app.run(workflow, {"log": []}, run_id="r1")
    assert final["log"] == [f"{CANARY} at 0", f"{CANARY} at 1", f"{CANARY} at 2"]
    assert _sql(db_url, "SELECT count(*) FROM lg_checkpoints WHERE thread_id = 'lg:r1'")[0][0] > 0
    assert not hits(_at_rest(db_url))


def test_a_thread_written_across_a_key_rotation_reads_whole(sealed_app: cairn.App) -> None:
    """Values sealed (and digested) with data key 1, then more with key 2 on
    the same thread (a digest is keyed by the key that sealed it, so the
    list's old items keep their key-1 digests): a fresh saver reads every
    checkpoint whole."""
    from cairn.langgraph import CairnSaver
    from tests.langgraph.graphs import counting_loop

    saver = CairnSaver(sealed_app, tenant="acme")
    config: Any = {"configurable": {"thread_id": "t"}}
    counting_loop(3, "a").compile(checkpointer=saver).invoke({"log": []}, config)
    keys = sealed_app.store.keys  # type: ignore[attr-defined]
    first = keys.writer("acme")[0]
    # (first may be 2: two threads sealing a tenant's first values at once can each add a key,
    # DataKeys.writer calls add outside its lock)
    assert keys.add("acme") == first + 1
    counting_loop(6, "a").compile(checkpointer=saver).invoke({"log": []}, config)  # on from a2
    fresh = CairnSaver(sealed_app, tenant="acme")
    whole = [f"a{i}" for i in range(6)]
    states = [t.checkpoint["channel_values"].get("log", []) for t in fresh.list(config)]
    assert states[0] == whole
    assert {len(s) for s in states} == set(range(7)), states  # each length, from the input to the end
    assert all(s == whole[:len(s)] for s in states), states
