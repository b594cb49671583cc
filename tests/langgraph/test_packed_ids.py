"""PostgreSQL stores checkpoint ids packed: a parent id (migration 0049) and
the id in the keys of lg_checkpoints and lg_writes (0050). A canonical
lowercase UUID (LangGraph's uuid6 ids) takes 17 bytes, not 37; any other id
is its bytes behind a tag, and a key keeps the order of its text (lg_id_key).
Every read gives back the id as it was written, a thread's checkpoints list in
the order of their ids' bytes whatever their forms, and rows stored before the
migrations are rewritten by them and read the same."""

from __future__ import annotations

import random
import uuid
from typing import Any

import cairn
from cairn.store.checkpointsql import pack_id, pack_id_key
from tests.engine.conftest import postgres_url
from tests.langgraph.rawsql import raw_sql

UUID = "1f1f1c55-ddfd-6591-812c-7c10ecff0fa5"
#: each checkpoint's id; the one before it is its parent
IDS = ["plain id", UUID.upper(), UUID, "é ü", UUID + " ", UUID.replace("-", ""),
       "1f1f1c55-ddfd-6591-812c-7c10ecff0fa6"]


def _conf(checkpoint_id: str | None = None) -> Any:
    conf = {"thread_id": "t", "checkpoint_ns": ""}
    return {"configurable": conf if checkpoint_id is None else {**conf, "checkpoint_id": checkpoint_id}}


def _parents(app: cairn.App) -> list[tuple[str, str | None]]:
    """Each checkpoint's parent as a new saver reads it: one by one, then as a listing."""
    from cairn.langgraph import CairnSaver

    def parent(t: Any) -> str | None:
        return None if t.parent_config is None else str(t.parent_config["configurable"]["checkpoint_id"])

    saver = CairnSaver(app, tenant="acme")
    one = [(c, parent(CairnSaver(app, tenant="acme").get_tuple(_conf(c)))) for c in IDS]
    listed = [(t.config["configurable"]["checkpoint_id"], parent(t)) for t in saver.list(_conf())]
    return sorted(one) + sorted(listed)


def test_parent_ids_are_packed_and_read_back_as_written(pg_url: str) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    from cairn.langgraph import CairnSaver

    url = postgres_url(pg_url)
    app = cairn.App(db=url, lease_seconds=5.0)
    try:
        saver = CairnSaver(app, tenant="acme")
        for parent, checkpoint_id in zip([None, *IDS], IDS, strict=False):
            checkpoint = empty_checkpoint()
            checkpoint["id"] = checkpoint_id
            saver.put(_conf(parent), checkpoint, {"source": "input", "step": -1}, {})
        expected = [(c, p) for c, p in zip(IDS, [None, *IDS], strict=False)]
        read = _parents(app)
        assert read == sorted(expected) * 2
        listed = [t.config["configurable"]["checkpoint_id"] for t in saver.list(_conf())]
        assert listed == sorted(IDS, key=lambda i: i.encode(), reverse=True)
        stored = dict(raw_sql(url, "SELECT lg_id_text(checkpoint_id), length(parent_id) "
                                   "FROM lg_checkpoints"))
        keys = dict(raw_sql(url, "SELECT lg_id_text(checkpoint_id), length(checkpoint_id) "
                                 "FROM lg_checkpoints"))
        assert keys[UUID] == 17  # a canonical UUID: 0x01 and its 16 bytes
        assert keys["plain id"] == 17 + len("plain id")  # above every UUID: 0x01, the greatest below, itself
        assert stored[IDS[0]] is None
        assert stored[IDS[3]] == 17  # its parent is a canonical UUID: 0x01 and its 16 bytes
        assert stored[IDS[2]] == 1 + 36  # an upper-case UUID keeps its text
        assert stored[IDS[5]] == 1 + 37  # so do other spellings
        assert stored[IDS[6]] == 1 + 32
        assert stored[IDS[4]] == 1 + len("é ü".encode())
    finally:
        app.close()

    # rows stored before migrations 0049 and 0050 (ids as text) are rewritten by them and read the same
    raw_sql(url, 'ALTER TABLE lg_checkpoints ALTER COLUMN checkpoint_id TYPE text COLLATE "C" '
                 "USING lg_id_text(checkpoint_id)")
    raw_sql(url, "ALTER TABLE lg_writes ALTER COLUMN checkpoint_id TYPE text USING lg_id_text(checkpoint_id)")
    raw_sql(url, "ALTER TABLE lg_checkpoints ALTER COLUMN parent_id TYPE text USING lg_id_text(parent_id)")
    for function in ("lg_id_text(bytea)", "lg_id_pack(text)", "lg_id_key(text)", "lg_id_key_other(text)"):
        raw_sql(url, f"DROP FUNCTION {function}")
    raw_sql(url, "DELETE FROM schema_migrations WHERE version IN (49, 50)")
    assert dict(raw_sql(url, "SELECT checkpoint_id, parent_id FROM lg_checkpoints"))[IDS[3]] == UUID
    again = cairn.App(db=url, lease_seconds=5.0)  # opening it migrates
    try:
        assert raw_sql(url, "SELECT count(*) FROM schema_migrations WHERE version IN (49, 50)") == [(2,)]
        assert _parents(again) == read
        stored_again = dict(raw_sql(url, "SELECT lg_id_text(checkpoint_id), length(parent_id) "
                                         "FROM lg_checkpoints"))
        assert stored_again == stored
        assert dict(raw_sql(url, "SELECT lg_id_text(checkpoint_id), length(checkpoint_id) "
                                 "FROM lg_checkpoints")) == keys
        relisted = [t.config["configurable"]["checkpoint_id"]
                    for t in CairnSaver(again, tenant="acme").list(_conf())]
        assert relisted == listed
    finally:
        again.close()


def _mixed_ids() -> list[str]:
    """Ids of every form near UUIDs: UUIDs, their prefixes, one character
    changed to its neighbours or to what sorts between the hex digits and the
    dash, a suffix added, upper case, and ids below and above every UUID."""
    pick = random.Random(24)
    ids = {"", "a", "0", "-", "/", ":", "`", "g", "~", "zzz", "é", "ü-ä", "00000000", "00000000-",
           "00000000/", "0000000-", "00000000-0000-0000-0000-000000000000",
           "00000000-0000-0000-0000-00000000000",
           "ffffffff-ffff-ffff-ffff-ffffffffffff", "ffffffff-ffff-ffff-ffff-ffffffffffff0",
           "ffffffff-ffff-ffff-ffff-fffffffffffg"}
    for _ in range(150):
        u = str(uuid.UUID(int=pick.getrandbits(128)))
        if pick.random() < 0.3:  # many sharing a prefix
            u = "1f1f1c55" + u[8:]
        ids.update({u, u.upper(), u + pick.choice(["x", "0", "-", " ", "é", "\x7f"])})
        k = pick.randrange(37)
        ids.add(u[:k])
        for ch in "-/:`g.,A0f9a~é\x01 ":
            ids.update({u[:k] + ch + u[k + 1:], u[:k] + ch})
    return sorted(ids)


def test_packed_keys_order_as_their_text_whatever_their_forms(pg_url: str) -> None:
    """lg_id_key orders ids as their text's bytes ("C", the order of 0041),
    distinct ids pack distinct, and lg_id_text reads back each one."""
    url = postgres_url(pg_url)
    ids = _mixed_ids()
    listed = "SELECT i FROM unnest(?::text[]) AS i ORDER BY "
    by_text = [r[0] for r in raw_sql(url, listed + 'i COLLATE "C"', (ids,))]
    by_key = [r[0] for r in raw_sql(url, listed + "lg_id_key(i)", (ids,))]
    assert by_key == by_text
    assert by_text == sorted(ids, key=lambda i: i.encode())
    # the saver packs the ids it gives the statements as the migrations packed the rows (0049, 0050)
    packed = raw_sql(url, "SELECT i, lg_id_key(i), lg_id_pack(i) FROM unnest(?::text[]) AS i", (ids,))
    assert [(i, bytes(k), bytes(p)) for i, k, p in packed] == [(i, pack_id_key(i), pack_id(i))
                                                             for i, _, _ in packed]
    assert sorted(ids, key=pack_id_key) == by_text
    assert raw_sql(url, "SELECT count(DISTINCT lg_id_key(i)), "
                        "count(*) FILTER (WHERE lg_id_text(lg_id_key(i)) = i), "
                        "count(*) FILTER (WHERE lg_id_text(lg_id_pack(i)) = i) FROM unnest(?::text[]) AS i",
                   (ids,)) == [(len(ids), len(ids), len(ids))]


def test_the_packing_functions_are_inlined_into_a_statement(pg_url: str) -> None:
    """lg_id_text, lg_id_pack and lg_id_key are STABLE and not STRICT, so the
    planner inlines them (a call of its own cost ~50 us a column a statement)."""
    url = postgres_url(pg_url)
    explain = ("EXPLAIN VERBOSE SELECT lg_id_text(checkpoint_id), lg_id_pack(thread_id), "
               "lg_id_key(thread_id) FROM lg_checkpoints")
    plan = "\n".join(r[0] for r in raw_sql(url, explain))
    assert "CASE" in plan, plan
    for function in ("lg_id_text(", "lg_id_pack(", "lg_id_key("):
        assert function not in plan, plan
