"""Bytes a chat loop's journal takes, handed to the store and on disk.

    python -m bench.model_journal              # 10, 40 and 80 turns of 1 KB messages
    python -m bench.model_journal 200 --size 4096
    python -m bench.model_journal --no-postgres

A chat loop sends the whole conversation on every model call. Each turn adds
a user message and the model's answer (both ``--size`` bytes of content).
"messages" is the size of the distinct messages themselves (their JSON), the
least any journal of the conversation can hold; every ratio is over it.

"handed" is every byte the run gave the store: the payload and detail of
each history entry, plus any artifacts they reference. "before" is the same
run as the format before "each message once" stored it: the full request of
every call (``ModelRecord``), computed from the rebuilt requests in place of
the compact entries.

The figure that counts is **on disk**, as growth of the same store over the
run (deterministic up to page rounding, so no repeats):

* SQLite: the database file after ``PRAGMA wal_checkpoint(TRUNCATE)``, plus
  the bytes of the artifact directory; and the file after ``VACUUM`` (pages
  freed by earlier runs reused, every B-tree rebuilt densely);
* PostgreSQL: the sum of ``pg_total_relation_size`` (heap, TOAST, indexes,
  free-space and visibility maps) of every table of Cairn's schema, on a
  private throwaway cluster (``tests/pgcluster.py``) unless
  ``$CAIRN_TEST_POSTGRES_URL`` names a server; never the server on 5432.
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import string
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

import cairn
from cairn.codec import values
from cairn.engine import modelcalls
from cairn.models import Message, ModelRequest, ScriptedModel
from cairn.store.records import HistoryEvent, Payload


@dataclass(frozen=True, slots=True)
class Measure:
    turns: int
    messages: int  # bytes of the distinct messages (JSON)
    before: int  # bytes stored with a full request per call
    after: int  # bytes stored now

    @property
    def ratio(self) -> float:
        return self.after / self.messages


def text(kind: str, n: int, size: int, style: str = "lorem") -> str:
    """``size`` characters of content, distinct per message. ``lorem``
    repeats one phrase (zlib makes a 1 KB message about 60 bytes); ``words``
    draws words from a fixed vocabulary of 3,000 made-up words, which
    compresses about as little as prose (zlib: roughly 2x), so a figure that
    holds for it does not rest on the content being repetitive."""
    head = f"{kind} {n}: "
    if style == "lorem":
        return head + ("lorem ipsum dolor sit amet " * (size // 27 + 1))[: size - len(head)]
    pick = random.Random(f"{kind} {n}")
    out = [head]
    length = len(head)
    while length < size:
        word = pick.choice(_VOCABULARY)
        out.append(word + " ")
        length += len(word) + 1
    return "".join(out)[:size]


def _vocabulary(n: int = 3000) -> tuple[str, ...]:
    pick = random.Random(7)
    return tuple("".join(pick.choice(string.ascii_lowercase) for _ in range(pick.randint(2, 9)))
                 for _ in range(n))


_VOCABULARY = _vocabulary()


def chat_app(app: cairn.App, size: int, style: str = "lorem") -> cairn.Workflow[int]:
    def answer(request: ModelRequest, n: int) -> Message:
        return Message(role="assistant", content=text("assistant", n, size, style))

    model = ScriptedModel(answer, model_id="bench-chat")

    @app.workflow(name="chat")
    def chat(ctx: cairn.Context, turns: int, first: int = 0) -> int:
        messages: list[Message] = []
        for turn in range(first, first + turns):
            messages.append(Message(role="user", content=text("user", turn, size, style)))
            messages.append(ctx.model(model, messages).message)
        return len(messages)

    return chat  # type: ignore[return-value]


def payload_bytes(app: cairn.App, payload: Payload | None) -> int:
    if payload is None:
        return 0
    if payload.data is not None:
        return len(payload.data)
    return len(app.store.get_artifact(payload.ref or ""))


def stored_bytes(app: cairn.App, history: Sequence[HistoryEvent]) -> int:
    """Payload and detail bytes of every entry, artifacts included."""
    return sum(payload_bytes(app, e.payload) + (len(values.encode(e.detail)) if e.detail else 0)
               for e in history)


def measure(app: cairn.App, turns: int, size: int = 1024, run_id: str | None = None, *,
            style: str = "lorem") -> Measure:
    """Run a ``turns``-turn chat loop in ``app`` and measure what it stored."""
    run_id = run_id or f"chat-{turns}"
    workflow = "chat" if "chat" in app.runtime.workflows else chat_app(app, size, style)  # one per app
    app.run(workflow, turns, run_id=run_id)
    history = app.history(run_id)
    after = stored_bytes(app, history)
    rebuilt = modelcalls.records(history, app.runtime.payloads)
    compact = sum(payload_bytes(app, e.payload) for e in history if e.seq in rebuilt)
    full = sum(len(values.encode(record)) for record in rebuilt.values())
    last = rebuilt[max(rebuilt)]
    conversation = [*last.request.messages, last.response.message]
    distinct = {values.encode(m) for m in conversation}
    return Measure(turns, sum(len(m) for m in distinct), after - compact + full, after)


@dataclass(frozen=True, slots=True)
class Disk:
    """On-disk growth of one store over one run (see the module docstring)."""

    backend: str
    measure: Measure
    disk: int  # SQLite: file after checkpoint + artifacts; PostgreSQL: relation sizes
    vacuumed: int | None = None  # SQLite: the file after VACUUM (+ artifacts)

    @property
    def ratio(self) -> float:
        return self.disk / self.measure.messages


def tree_bytes(root: Path) -> int:
    """Bytes of the files under ``root`` (0 if it does not exist)."""
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) if root.exists() else 0


def sqlite_bytes(app: cairn.App, *, vacuum: bool = False) -> int:
    """The SQLite file once the WAL is checkpointed into it (after ``VACUUM``
    if asked), plus the artifact directory."""
    store = app.store
    path: Path = store.path  # type: ignore[attr-defined]
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        if vacuum:
            conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    finally:
        conn.close()
    return path.stat().st_size + tree_bytes(store.artifact_dir)  # type: ignore[attr-defined]


def postgres_bytes(app: cairn.App) -> int:
    """``pg_total_relation_size`` of every table of the store's schema."""
    store = app.store
    with psycopg.connect(store._url, autocommit=True) as conn:  # type: ignore[attr-defined]
        row = conn.execute(
            "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class AS c "
            "JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'r'",
            (store.schema,)).fetchone()  # type: ignore[attr-defined]
    return int(row[0]) if row else 0


def measure_sqlite(app: cairn.App, turns: int, size: int = 1024, run_id: str | None = None, *,
                   style: str = "lorem") -> Disk:
    """``measure`` on a SQLite app, with the file's growth over the run."""
    before, vacuumed = sqlite_bytes(app), sqlite_bytes(app, vacuum=True)
    m = measure(app, turns, size, run_id, style=style)
    return Disk("sqlite", m, sqlite_bytes(app) - before, sqlite_bytes(app, vacuum=True) - vacuumed)


def measure_postgres(app: cairn.App, turns: int, size: int = 1024, run_id: str | None = None, *,
                   style: str = "lorem") -> Disk:
    """``measure`` on a PostgreSQL app, with its tables' growth over the run."""
    before = postgres_bytes(app)
    m = measure(app, turns, size, run_id, style=style)
    return Disk("postgres", m, postgres_bytes(app) - before)


@contextmanager
def postgres_app() -> Iterator[cairn.App]:
    """An app on a new database of a private throwaway cluster, dropped after."""
    from tests import pgcluster
    from tests.backends import libpq_url

    admin = pgcluster.admin_url()
    name = f"cairn_bench_journal_{os.getpid()}"
    try:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        app = cairn.App(db=libpq_url(admin, name))
        try:
            yield app
        finally:
            app.close()
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    finally:
        pgcluster.shutdown()


def warm(app: cairn.App, turns: int, size: int, style: str) -> None:
    """An unmeasured chat whose turns are numbered past any measured one's (no message shared):
    the tables' one-time free-space and visibility maps and first index pages are then paid."""
    if turns:
        workflow = "chat" if "chat" in app.runtime.workflows else chat_app(app, size, style)
        app.run(workflow, turns, 10**6, run_id="warm-up")


def report(rows: Sequence[Disk]) -> None:
    print(f"{'backend':>8} {'turns':>6} {'messages':>10} {'before':>11} {'handed':>10} {'handed/msg':>11} "
          f"{'on disk':>10} {'disk/msg':>9} {'vacuumed/msg':>13}")
    for d in rows:
        m = d.measure
        vac = f"{d.vacuumed / m.messages:>13.2f}" if d.vacuumed is not None else f"{'—':>13}"
        print(f"{d.backend:>8} {m.turns:>6} {m.messages:>10,} {m.before:>11,} {m.after:>10,} "
              f"{m.ratio:>11.2f} "
              f"{d.disk:>10,} {d.ratio:>9.2f} {vac}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("turns", nargs="*", type=int, default=[10, 40, 80])
    parser.add_argument("--size", type=int, default=1024, help="content bytes of each message")
    parser.add_argument("--text", choices=("lorem", "words"), default="lorem",
                        help="message content: one repeated phrase, or words drawn from a vocabulary")
    parser.add_argument("--no-postgres", action="store_true", help="measure SQLite only")
    parser.add_argument("--warm", type=int, default=0, metavar="TURNS",
                        help="first run (unmeasured) a chat of TURNS turns whose messages the measured "
                             "runs do not share, so each figure is of a database already in use")
    args = parser.parse_args(argv)
    rows: list[Disk] = []
    with tempfile.TemporaryDirectory(prefix="cairn-model-journal-") as tmp:
        app = cairn.App(db=f"sqlite:///{Path(tmp) / 'cairn.db'}")
        try:
            warm(app, args.warm, args.size, args.text)
            rows += [measure_sqlite(app, turns, args.size, style=args.text) for turns in args.turns]
        finally:
            app.close()
    if not args.no_postgres:
        with postgres_app() as app:
            warm(app, args.warm, args.size, args.text)
            rows += [measure_postgres(app, turns, args.size, style=args.text) for turns in args.turns]
    report(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
