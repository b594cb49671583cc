"""What a chat loop's journal takes on disk, and that its payloads read back.

The figure is bytes, not time: the growth of the database over an 80-turn
chat of 1 KB messages (SQLite: the file once the WAL is checkpointed into it,
plus artifacts; PostgreSQL: ``pg_total_relation_size`` of every table,
TOAST and indexes included), over the bytes of the distinct messages. Two
contents: ``lorem`` (one repeated phrase: compression alone fits it in the
rows) and ``words`` (a vocabulary of made-up words, which compresses about as
little as prose: its entries stay larger than a SQLite history row keeps in
its page, so SQLite moves them out of line).

The history entries are the ones the store contract reads back, so the
payload must be the same bytes whatever the store did with them: compressed,
moved to ``history_payloads``, or escaped because it starts with a NUL byte
(which, since migration 0014/0021, marks a packed payload).
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from bench.model_journal import measure_postgres, measure_sqlite
from psycopg.conninfo import conninfo_to_dict

import cairn
from cairn.store.postgres import PostgresStore
from cairn.store.records import EventType, HistoryEvent, NewRun, Payload, RunStatus
from cairn.store.sqlite import SQLiteStore
from tests.backends import libpq_url

TURNS = 80
LIMIT = 1.3


@pytest.fixture(params=["sqlite", "postgres"])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[cairn.App]:
    if request.param == "postgres":
        conninfo = request.getfixturevalue("pg_url")
        opened = cairn.App(db=libpq_url(conninfo, conninfo_to_dict(conninfo)["dbname"]))
        assert isinstance(opened.store, PostgresStore)
    else:
        opened = cairn.App(db=f"sqlite:///{tmp_path / 'cairn.db'}")
    yield opened
    opened.close()


def backend(app: cairn.App) -> str:
    return "sqlite" if isinstance(app.store, SQLiteStore) else "postgres"


@pytest.mark.parametrize("style", ["lorem", "words"])
def test_an_80_turn_chat_takes_at_most_1_3x_its_message_bytes_on_disk(app: cairn.App, style: str) -> None:
    measure = measure_sqlite if backend(app) == "sqlite" else measure_postgres
    measure(app, 2, run_id="warm-up", style=style)  # every table and index has its first pages
    d = measure(app, TURNS, style=style)
    assert d.measure.messages > 160 * 1024
    assert d.disk <= LIMIT * d.measure.messages, (
        f"{backend(app)}, {style}: the database grew by {d.disk:,} bytes ({d.ratio:.2f}x) for "
        f"{d.measure.messages:,} bytes of messages")


PAYLOADS = [
    b"\x00\x01 a payload that starts like a compressed one",
    b"\x00\x02 like a link",
    b"\x00",
    b"",
    b"{}",
    random.Random(1).randbytes(2048),  # large and incompressible: out of line on SQLite
    b'{"text": "' + b"lorem ipsum " * 400 + b'"}',  # large and compressible
]


def new_run(run_id: str) -> NewRun:
    return NewRun(run_id=run_id, workflow="w", workflow_version="1", tenant="default", thread_id=None,
                  input=Payload(data=b"null"))


@pytest.mark.parametrize("data", PAYLOADS, ids=range(len(PAYLOADS)))
def test_a_payload_reads_back_as_written(app: cairn.App, data: bytes) -> None:
    """Whatever the store packs (compression, a link, an escape), the store
    API reads back the very bytes it was given: through ``history``, a
    published event, and a claim's history (what replay reads); appended
    alone (SQLite's one-statement path) and two at a time (a transaction)."""
    store = app.store
    store.create_run(new_run("r1"))
    claim = store.claim_run("r1", "w1", 30, 3)
    assert claim is not None
    epoch, seq = claim.run.epoch, claim.next_seq

    def entry(n: int) -> HistoryEvent:
        return HistoryEvent(run_id="r1", seq=seq + n, event=EventType.STEP_COMPLETED, at=store.clock(),
                            epoch=epoch, position=n, step_kind="event", name=f"k{n}",
                            payload=Payload(data=data))

    store.append("r1", epoch, [entry(0)])
    store.append("r1", epoch, [entry(1), entry(2)])
    assert [e.payload for e in store.history("r1")[-3:]] == [Payload(data=data)] * 3
    latest = store.latest_event("r1", "k1")
    assert latest is not None
    assert latest.payload == Payload(data=data)
    assert store.reclaim_owned("w1") == 1
    claims = store.claim_runs("w2", ["w"], 1, 30, 3)  # what a worker's claim reads
    assert len(claims) == 1
    again = claims[0]
    assert again.run.status is RunStatus.RUNNING
    assert [e.payload for e in again.history if e.seq >= seq][:3] == [Payload(data=data)] * 3


def test_pruning_a_run_deletes_the_payloads_it_moved_out_of_its_rows(tmp_path: Path) -> None:
    app = cairn.App(db=f"sqlite:///{tmp_path / 'cairn.db'}")
    try:
        measure_sqlite(app, 5, style="words")
        with sqlite3.connect(tmp_path / "cairn.db") as conn:
            assert conn.execute("SELECT COUNT(*) FROM history_payloads").fetchone()[0] >= 5
        assert app.store.prune_runs(older_than=app.store.clock() + 1e6) == 1
        with sqlite3.connect(tmp_path / "cairn.db") as conn:
            assert conn.execute("SELECT COUNT(*) FROM history_payloads").fetchone()[0] == 0
    finally:
        app.close()


def test_an_older_database_keeps_its_payloads_that_start_with_a_nul_byte(tmp_path: Path) -> None:
    """Before 0014 a payload was stored as it is; one that starts with a NUL
    byte (possible through the store API) now starts like a tag, so the
    migration escapes it and it reads back the same."""
    path = tmp_path / "old.db"
    store = SQLiteStore(path)
    store.create_run(new_run("r1"))
    store.close()
    with sqlite3.connect(path) as conn:  # the database as 0013 left it
        conn.execute("DROP TRIGGER history_payload_gone")
        conn.execute("DROP TABLE history_payloads")
        conn.execute("DELETE FROM schema_migrations WHERE version = 14")
        conn.execute("UPDATE history SET payload = ? WHERE run_id = 'r1'", (b"\x00\x00raw",))
    store = SQLiteStore(path)
    try:
        assert store.history("r1")[0].payload == Payload(data=b"\x00\x00raw")
    finally:
        store.close()


def test_an_older_postgres_database_keeps_its_payloads_that_start_with_a_nul_byte(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    store.create_run(new_run("r1"))
    store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:  # the database as 0020 left it
        conn.execute("SET search_path TO cairn")
        conn.execute("DELETE FROM schema_migrations WHERE version = 21")
        conn.execute("UPDATE history SET payload = %s WHERE run_id = 'r1'", (b"\x00\x00raw",))
    store = PostgresStore(pg_url)
    try:
        assert store.history("r1")[0].payload == Payload(data=b"\x00\x00raw")
    finally:
        store.close()
