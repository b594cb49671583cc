"""A checkpoint read in one statement (issue 24: get_state on PostgreSQL took
three round trips). Since migration 0045 a row names, in columns the server
reads, its channel versions stored as rows (``names``) and the digests of the
values it names itself (``refs``: inline channels, folded writes), so
``lg_read_one`` fetches the row, its chains, writes and values at once. Rows
written before (both NULL) are read as before; every read gives the tuple
the three-statement read gives."""

from __future__ import annotations

import random
from typing import Any

import pytest

import cairn
from cairn.store import checkpointsql
from cairn.store.checkpointsql import pack_refs
from tests.engine.conftest import postgres_url
from tests.langgraph.rawsql import raw_sql


def _conf(thread: str, checkpoint_id: str | None = None) -> Any:
    conf: dict[str, Any] = {"thread_id": thread}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def _run(saver: Any, steps: int = 9) -> list[str]:
    """A loop of ``steps`` super-steps, then pending writes on its latest
    checkpoint (rows of ``lg_writes``: no child folds them); its checkpoint ids."""
    from tests.langgraph.graphs import counting_loop

    counting_loop(steps, "a").compile(checkpointer=saver).invoke({"log": []}, _conf("t"))
    ids = [t.config["configurable"]["checkpoint_id"] for t in saver.list(_conf("t"))]
    saver.put_writes(_conf("t", ids[0]), [("log", ["late"]), ("__error__", "boom")], "task-x")
    return ids


def _statements(saver: Any) -> list[str]:
    """The names of the statements the saver's store runs from here on."""
    names: list[str] = []
    rows = saver._rows
    query = rows._query

    def counted(tx: Any, name: str, params: Any) -> Any:
        names.append(name)
        return query(tx, name, params)

    rows._query = counted
    return names


def _as_before(saver: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the saver's store read as it did before ``lg_read_one``."""
    monkeypatch.setattr(type(saver._rows), "_lg_read_one", lambda self, *a: checkpointsql._OLDER)


def _same(a: Any, b: Any) -> None:
    assert a is not None
    assert b is not None
    assert a.config == b.config
    assert a.parent_config == b.parent_config
    assert a.checkpoint == b.checkpoint
    assert a.metadata == b.metadata
    assert a.pending_writes == b.pending_writes


@pytest.fixture
def pg_app(pg_url: str) -> Any:
    application = cairn.App(db=postgres_url(pg_url), lease_seconds=5.0)
    yield application
    application.close()


def test_get_state_on_postgresql_is_one_statement(pg_app: cairn.App) -> None:
    from cairn.langgraph import CairnSaver

    saver = CairnSaver(pg_app, tenant="acme")
    ids = _run(saver)
    for cold in (False, True):  # a saver holding the list, and one that holds nothing
        reader = CairnSaver(pg_app, tenant="acme") if cold else saver
        for checkpoint_id in (None, ids[0], ids[len(ids) // 2], ids[-1]):
            ran = _statements(reader)
            found = reader.get_tuple(_conf("t", checkpoint_id))
            assert found is not None
            assert ran == ["lg_read_one"], (cold, checkpoint_id, ran)
    latest = saver.get_tuple(_conf("t"))
    assert latest is not None
    assert latest.config["configurable"]["checkpoint_id"] == ids[0]
    assert ("task-x", "log", ["late"]) in latest.pending_writes


def test_one_statement_reads_what_three_read(pg_app: cairn.App, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every checkpoint (folded writes, rows of lg_writes, lists held or not)
    reads the same in one statement as in the three of before."""
    from cairn.langgraph import CairnSaver

    writer = CairnSaver(pg_app, tenant="acme")
    ids = _run(writer)
    one_warm = [writer.get_tuple(_conf("t", c)) for c in ids]
    one_cold = [CairnSaver(pg_app, tenant="acme").get_tuple(_conf("t", c)) for c in ids]
    _as_before(writer, monkeypatch)
    before = [CairnSaver(pg_app, tenant="acme").get_tuple(_conf("t", c)) for c in ids]
    for a, b, c in zip(one_warm, one_cold, before, strict=True):
        _same(a, c)
        _same(b, c)
    assert any(t is not None and t.pending_writes for t in before[1:])  # folded writes were read


def test_the_server_leaves_out_the_values_of_a_list_the_reader_holds(pg_app: cairn.App) -> None:
    from cairn.langgraph import CairnSaver
    from cairn.store.checkpointsql import ThreadKey, unpack_refs

    saver = CairnSaver(pg_app, tenant="acme")
    _run(saver, steps=30)
    key = ThreadKey("acme", "t", "")
    latest = saver._rows.lg_read(key, None, saver._versions)
    assert latest is not None
    items = set(unpack_refs(b"".join(r for _, r in latest.chains["log"])))
    assert len(items) == 30
    assert items <= set(latest.values)
    held = saver._rows.lg_read(key, None, saver._versions, lambda channel, refs: True,
                               lists={"log": b"".join(r for _, r in latest.chains["log"]) + pack_refs([7])})
    assert held is not None
    assert not items & set(held.values), "the held list's items were sent"
    # a reader whose copy does not start with the list's digests gets them
    other = saver._rows.lg_read(key, None, saver._versions, lambda channel, refs: False,
                                lists={"log": pack_refs([7])})
    assert other is not None
    assert items <= set(other.values)


def test_a_held_list_the_reader_no_longer_holds_is_read_again(pg_app: cairn.App) -> None:
    """The server left a list's values out as the caller's, but the caller's
    copy changed before it looked (``known`` says no): the read is done again."""
    from cairn.langgraph import CairnSaver
    from cairn.store.checkpointsql import ThreadKey, unpack_refs

    saver = CairnSaver(pg_app, tenant="acme")
    _run(saver)
    key = ThreadKey("acme", "t", "")
    whole = saver._rows.lg_read(key, None, saver._versions)
    assert whole is not None
    refs = b"".join(r for _, r in whole.chains["log"])
    ran = _statements(saver)
    snap = saver._rows.lg_read(key, None, saver._versions, lambda channel, r: False, lists={"log": refs})
    assert snap is not None
    assert set(unpack_refs(refs)) <= set(snap.values)
    assert ran[0] == "lg_read_one"
    assert len(ran) > 1


def test_rows_written_before_the_columns_read_as_before(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A row of the format before migration 0045 (no ``names``, no ``refs``:
    as the migration leaves the rows it finds) reads the same, in the
    statements of before; on SQLite (no such columns) reads are unchanged."""
    from cairn.langgraph import CairnSaver

    app = cairn.App(db=db_url, lease_seconds=5.0)
    try:
        saver = CairnSaver(app, tenant="acme")
        ids = _run(saver)
        now = [CairnSaver(app, tenant="acme").get_tuple(_conf("t", c)) for c in ids]
        if db_url.startswith("postgresql"):
            raw_sql(db_url, "UPDATE lg_checkpoints SET names = NULL, refs = NULL")
            reader = CairnSaver(app, tenant="acme")
            ran = _statements(reader)
            old = [reader.get_tuple(_conf("t", c)) for c in ids]
            assert ran.count("lg_read_one") == len(ids)
            assert "lg_page_reads" in ran
        else:
            old = [CairnSaver(app, tenant="acme").get_tuple(_conf("t", c)) for c in ids]
        for a, b in zip(now, old, strict=True):
            _same(a, b)
    finally:
        app.close()


def test_lg_digests_unpacks_as_the_saver_packs(pg_app: cairn.App, pg_url: str) -> None:
    pick = random.Random(24)
    digests = [0, -1, 1, 2**63 - 1, -2**63, 255, -256, *(pick.randrange(-2**63, 2**63) for _ in range(200))]
    url = postgres_url(pg_url)
    found = raw_sql(url, "SELECT d FROM lg_digests(?) AS d", (pack_refs(digests),))
    assert [int(r[0]) for r in found] == digests
    assert raw_sql(url, "SELECT count(*) FROM lg_digests(?)", (b"",)) == [(0,)]


def test_a_history_page_on_postgresql_is_one_statement(pg_app: cairn.App,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``get_state_history(limit=10)`` (the saver's ``list``): one
    ``lg_read_page`` a page of LIST_PAGE, held lists or not, and the same
    tuples as the statements of before (``lg_list_thread``, ``lg_page_reads``,
    ``lg_page_values``)."""
    from langgraph.checkpoint.base.id import uuid6

    from cairn.langgraph import LIST_PAGE, CairnSaver

    writer = CairnSaver(pg_app, tenant="acme")
    _run(writer, steps=40)
    # writes put before their checkpoint is: rows of lg_writes (no child folds them yet)
    latest = writer.get_tuple(_conf("t"))
    assert latest is not None
    early = str(uuid6())
    writer.put_writes({"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": early}},
                      [("log", ["early"])], "task-e")
    writer.put(latest.config, {**latest.checkpoint, "id": early}, latest.metadata, {})
    ids = [t.config["configurable"]["checkpoint_id"] for t in writer.list(_conf("t"))]
    assert ids[0] == early
    assert len(ids) >= 2 * LIST_PAGE + 5
    page = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}  # as get_state_history asks
    # (before, limit, statements): a page of LIST_PAGE a statement; unbounded, until one is short
    cases = ((None, 10, 1), (ids[5], 10, 1), (None, None, len(ids) // LIST_PAGE + 1),
             (ids[3], 2 * LIST_PAGE + 1, 3))
    for cold in (False, True):
        reader = CairnSaver(pg_app, tenant="acme") if cold else writer
        for before, limit, statements in cases:
            ran = _statements(reader)
            got = list(reader.list(page, before=None if before is None else _conf("t", before), limit=limit))
            start = 0 if before is None else ids.index(before) + 1
            want = ids[start:] if limit is None else ids[start:start + limit]
            assert [t.config["configurable"]["checkpoint_id"] for t in got] == want
            assert ran == ["lg_read_page"] * statements, (cold, before, limit, ran)
    now = list(CairnSaver(pg_app, tenant="acme").list(page))
    warm = list(writer.list(page))
    _as_before(writer, monkeypatch)
    monkeypatch.setattr(type(writer._rows), "lg_read_page", lambda self, *a: None)
    reader = CairnSaver(pg_app, tenant="acme")
    ran = _statements(reader)
    before = list(reader.list(page))
    assert "lg_read_page" not in ran
    assert "lg_page_reads" in ran
    assert len(now) == len(warm) == len(before) == len(ids)
    for a, b, c in zip(now, warm, before, strict=True):
        _same(a, c)
        _same(b, c)
    assert ("task-e", "log", ["early"]) in before[0].pending_writes  # rows of lg_writes
    assert any(t.pending_writes for t in before[1:])  # folded writes


def test_a_history_page_checks_what_the_listed_read_checks(pg_app: cairn.App, pg_url: str) -> None:
    """Through ``lg_read_page``: another tenant's thread is not listed, rows
    written before migration 0045 read the same in the statements of before,
    and a missing value or a damaged checkpoint is an error naming the
    checkpoint (never a page with a default in it)."""
    from cairn.errors import UnreadableCheckpoint
    from cairn.langgraph import CairnSaver

    url = postgres_url(pg_url)
    page = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    writer = CairnSaver(pg_app, tenant="acme")
    ids = _run(writer, steps=30)
    other = CairnSaver(pg_app, tenant="globex")
    ran = _statements(other)
    assert list(other.list(page, limit=10)) == []
    assert ran == ["lg_read_page"]  # found nothing, not a fallback
    # the server leaves out the values of a list the reader holds; one it no longer holds is read as before
    key = checkpointsql.ThreadKey("acme", "t", "")
    whole = writer._rows.lg_read(key, None, writer._versions)
    assert whole is not None
    refs = b"".join(r for _, r in whole.chains["log"])
    items = set(checkpointsql.unpack_refs(refs))
    held = writer._rows.lg_read_page(key, None, 10, lambda row: (writer._versions, lambda c, r: True),
                                     None, {"log": refs})
    assert held is not None
    assert len(held) == 10
    by_writes = {d for snap in held for w in snap.writes for d in checkpointsql.unpack_refs(w.refs)}
    # and a row's own list tail (cairn.langgraph.TAIL) names its items, sent with the row
    by_rows = by_writes | {d for snap in held for d in writer._versions(snap.row).inline}
    assert items - by_rows  # items only the list names (the page's folded writes name the later ones)
    assert not (items - by_rows) & set(held[0].values), "the held list's items were sent"
    assert writer._rows.lg_read_page(key, None, 10, lambda row: (writer._versions, lambda c, r: False),
                                     None, {"log": refs}) is None
    # a row whose names disagree with its checkpoint reads as before
    raw_sql(url, "UPDATE lg_checkpoints SET names = 'log, 0000000001.x' WHERE checkpoint_id = lg_id_key(?)",
            (ids[6],))
    reader = CairnSaver(pg_app, tenant="acme")
    ran = _statements(reader)
    for a, b in zip(list(CairnSaver(pg_app, tenant="acme").list(page, limit=10)), reader.list(page, limit=10),
                    strict=True):
        _same(a, b)
    assert ran[0] == "lg_read_page", ran
    assert "lg_page_reads" in ran, ran
    now = list(CairnSaver(pg_app, tenant="acme").list(page, limit=10))
    raw_sql(url, "UPDATE lg_checkpoints SET names = NULL, refs = NULL WHERE checkpoint_id = lg_id_key(?)",
            (ids[4],))
    reader = CairnSaver(pg_app, tenant="acme")
    ran = _statements(reader)
    old = list(reader.list(page, limit=10))
    assert ran[0] == "lg_read_page", ran
    assert "lg_page_reads" in ran, ran
    for a, b in zip(now, old, strict=True):
        _same(a, b)
    raw_sql(url, "CREATE TABLE kept_values AS SELECT * FROM lg_values")
    raw_sql(url, "DELETE FROM lg_values")
    with pytest.raises(UnreadableCheckpoint, match=f"'{ids[0]}'.* names a value that is not stored"):
        list(CairnSaver(pg_app, tenant="acme").list(page, limit=10))
    raw_sql(url, "INSERT INTO lg_values SELECT * FROM kept_values")
    assert len(list(CairnSaver(pg_app, tenant="acme").list(page, limit=10))) == 10
    raw_sql(url, "UPDATE lg_checkpoints SET checkpoint = ? WHERE checkpoint_id = lg_id_key(?)",
            (b"\xc1\xff damaged", ids[0]))
    with pytest.raises(UnreadableCheckpoint, match=f"checkpoint '{ids[0]}'"):
        list(CairnSaver(pg_app, tenant="acme").list(page, limit=10))


def test_the_one_statement_reads_are_prepared_at_their_first_execution(pg_url: str) -> None:
    """psycopg prepares a statement at its sixth execution on a connection;
    before that each execution of a one-statement read was parsed, analysed
    and planned whole (a history page: 15-17 ms against 7-9 once prepared,
    2026-12-07). ``lg_read_one`` and ``lg_read_page`` are prepared at their
    first: after one of each, the store's one connection holds both."""
    from cairn.langgraph import CairnSaver
    from cairn.store.postgres import PostgresStore

    store = PostgresStore(postgres_url(pg_url), pool_size=1)  # every statement on one connection
    try:
        saver = CairnSaver(store, tenant="acme")
        from tests.langgraph.graphs import counting_loop

        counting_loop(3, "a").compile(checkpointer=saver).invoke({"log": []}, _conf("t"))  # one get_tuple
        assert CairnSaver(store, tenant="acme").get_tuple(_conf("t")) is not None
        page = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}  # a history page: lg_read_page
        assert len(list(CairnSaver(store, tenant="acme").list(page, limit=2))) == 2
        with store._conn() as conn:
            after = conn.execute("SELECT count(*) FROM pg_prepared_statements"
                                 " WHERE statement LIKE 'WITH RECURSIVE c AS%'").fetchone()
        assert after == (2,)
    finally:
        store.close()
