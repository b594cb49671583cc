"""Issue 29: the effect barrier on PostgreSQL, seen from the server.

A write tool may touch the outside world only once its intent is on stable
storage. On PostgreSQL that is a commit with ``synchronous_commit`` on (or a
stronger level): it returns once the WAL up to it is flushed. The strace pin
(``test_effect_barrier``) reads SQLite's syscalls; here a trigger on the
history table records, inside each appending transaction, the
``synchronous_commit`` that transaction will commit with: the intent's must
flush, whatever the ordinary appends use.

Two configurations: the store as it opens (every commit synchronous), and a
store whose ordinary commits are asynchronous (``_default_level`` off, the
case ``PostgresStore.append``'s barrier branch exists for). Making the
barrier's commit non-durable fails one of them: the durable level read as
``off`` fails the first, the barrier append's ``durable=True`` dropped fails
the second.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import cairn
from cairn.store.postgres import PostgresStore
from tests.engine.conftest import postgres_url

#: the levels at which a commit returns only once its WAL is flushed locally
FLUSHED = {"on", "local", "remote_write", "remote_apply"}

_RECORDER = """
CREATE TABLE cairn.commit_levels (seq BIGINT, event TEXT, step_kind TEXT, level TEXT);
CREATE FUNCTION cairn.record_commit_level() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO cairn.commit_levels
    VALUES (NEW.seq, NEW.event, NEW.step_kind, current_setting('synchronous_commit'));
    RETURN NEW;
END $$;
CREATE TRIGGER record_commit_level AFTER INSERT ON cairn.history
    FOR EACH ROW EXECUTE FUNCTION cairn.record_commit_level();
"""


@pytest.fixture
def recorded_db(pg_url: str) -> str:
    """The test's database, with the trigger that records each history
    row's commit level."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(_RECORDER)
    return pg_url


def _levels(conninfo: str) -> list[tuple[str, str | None, str]]:
    with psycopg.connect(conninfo) as conn:
        rows = conn.execute("SELECT event, step_kind, level FROM cairn.commit_levels ORDER BY seq").fetchall()
    return [(str(e), k, str(level)) for e, k, level in rows]


def _asynchronous_ordinary_commits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Open stores whose ordinary commits do not wait for the flush: each
    pooled connection is configured with ``synchronous_commit`` off (the
    store's ``_default_level``); durable writes must raise it themselves."""
    configure = PostgresStore._configure

    def asynchronous(self: PostgresStore, conn: Any) -> None:
        self._default_level = "off"
        configure(self, conn)

    monkeypatch.setattr(PostgresStore, "_configure", asynchronous)


@pytest.mark.parametrize("ordinary", ["synchronous", "asynchronous"])
def test_the_intent_is_committed_synchronously(
    recorded_db: str, ordinary: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if ordinary == "asynchronous":
        _asynchronous_ordinary_commits(monkeypatch)
    app = cairn.App(db=postgres_url(recorded_db))
    paid: list[int] = []
    try:
        @app.step(name="plan")
        def plan(amount: int) -> int:
            return amount * 2

        @app.tool(effect="write", name="pay")
        def pay(amount: int) -> int:
            paid.append(amount)
            return amount

        @app.workflow(name="barrier")
        def barrier(ctx: cairn.Context, amount: int) -> int:
            return int(pay(plan(amount)))

        assert app.run(barrier, 21) == 42
    finally:
        app.close()
    assert paid == [42]
    levels = _levels(recorded_db)
    intents = [level for event, _, level in levels if event == "op.intent"]
    assert intents, levels
    assert set(intents) <= FLUSHED, f"the intent's commit does not wait for the WAL flush: {levels}"
    if ordinary == "asynchronous":  # the setup took: ordinary appends did not wait (not required to)
        steps = [level for event, kind, level in levels if event == "step.completed" and kind == "step"]
        assert steps == ["off"], levels
