"""Issue 9 item 7: one damaged row does not stop the world.

Rows are damaged the way an attacker or a bad restore would: raw SQL that
writes JSON that does not parse into ``history.detail``, or a status or an
entry type no version of Cairn knows. A claim used to fail as a whole
(a traceback every poll, every run stuck behind the damaged oldest one);
now the damaged run is quarantined with a reason and the others run. And
inspection (``cairn runs``, ``cairn show``) shows the raw value, marked,
instead of crashing.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from cairn.cli.main import main
from cairn.store.contract import Store
from cairn.store.postgres import PostgresStore
from cairn.store.records import EventType, RunFilter, RunStatus
from cairn.store.sqlite import SQLiteStore
from tests.store.contract.helpers import LEASE, WF, FakeClock, new_run

_PG_URLS: dict[int, str] = {}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> Iterator[Store]:
    opened: Store
    if request.param == "postgres":
        url = request.getfixturevalue("pg_url")
        opened = PostgresStore(url, clock=clock)
        _PG_URLS[id(opened)] = url
    else:
        opened = SQLiteStore(tmp_path / "d.db", clock=clock)
    yield opened
    _PG_URLS.pop(id(opened), None)
    opened.close()


def vandalise(store: Store, statement: str, *params: Any) -> None:
    """Run ``statement`` (``{t}`` for the table prefix, ``%s`` placeholders) behind the store's back."""
    if isinstance(store, SQLiteStore):
        with sqlite3.connect(store.path) as conn:
            conn.execute(statement.replace("{t}", "").replace("%s", "?"), params)
    else:
        assert isinstance(store, PostgresStore)
        with psycopg.connect(_PG_URLS[id(store)], autocommit=True) as conn:
            conn.execute(statement.replace("{t}", f"{store.schema}."), params)


def three_runs(store: Store, clock: FakeClock) -> None:
    for run_id in ("oldest", "r2", "r3"):  # "oldest" is first in line
        store.create_run(new_run(run_id))
        clock.advance(1)


DAMAGES = {  # statement, value, what the quarantine reason names
    "detail": ("UPDATE {t}history SET detail = %s WHERE run_id = %s", "{not json",
               "the detail of history entry 1 is not valid JSON"),
    "event": ("UPDATE {t}history SET event = %s WHERE run_id = %s", "step.exploded", "'step.exploded'"),
    "status": ("UPDATE {t}runs SET status = %s WHERE run_id = %s", "zombie", "unknown status 'zombie'"),
    "budget": ("UPDATE {t}runs SET budget = %s WHERE run_id = %s", "{nope", "budget is not valid JSON"),
    "error": ("UPDATE {t}runs SET error = %s WHERE run_id = %s", "[[", "error is not valid JSON"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_run_is_quarantined_and_the_others_are_claimed(
    store: Store, clock: FakeClock, damage: str
) -> None:
    three_runs(store, clock)
    statement, value, reason = DAMAGES[damage]
    vandalise(store, statement, value, "oldest")
    claims = store.claim_runs("w1", [WF], 10, LEASE, 3)  # used to raise, for every poll of every worker
    assert sorted(c.run.run_id for c in claims) == ["r2", "r3"]
    damaged = store.get_run("oldest")
    assert damaged is not None
    assert damaged.status is RunStatus.QUARANTINED
    assert damaged.error is not None
    assert damaged.error["type"] == "DamagedRow"
    assert "damaged" in damaged.error["message"]
    assert reason in damaged.error["message"]  # names what is wrong
    assert damaged.recoveries == 0  # not a crash of its workers
    last = store.history("oldest")[-1]
    assert last.event is EventType.RUN_QUARANTINED
    assert store.claim_runs("w2", [WF], 10, LEASE, 3) == []  # it stays out of every later claim


def test_a_single_claim_of_a_damaged_run_quarantines_it(store: Store, clock: FakeClock) -> None:
    three_runs(store, clock)
    vandalise(store, "UPDATE {t}history SET detail = %s WHERE run_id = %s", "[1,", "r2")
    assert store.claim_run("r2", "w1", LEASE, 3) is None
    run = store.get_run("r2")
    assert run is not None
    assert run.status is RunStatus.QUARANTINED


def test_reads_show_damaged_values_marked_instead_of_failing(store: Store, clock: FakeClock) -> None:
    three_runs(store, clock)
    vandalise(store, "UPDATE {t}runs SET status = %s WHERE run_id = %s", "zombie", "r2")
    vandalise(store, "UPDATE {t}history SET event = %s, detail = %s WHERE run_id = %s",
              "run.exploded", "{oops", "r3")
    listed = {r.run_id: r.status.value for r in store.list_runs(RunFilter())}
    assert listed["r2"] == "?zombie"
    assert listed["oldest"] == "pending"
    record = store.get_run("r2")
    assert record is not None
    assert record.status.value == "?zombie"
    assert record.status is not RunStatus.PENDING
    assert not record.status.terminal
    (entry,) = store.history("r3")
    assert entry.event.value == "?run.exploded"
    assert entry.detail == {"damaged": "{oops"}


def test_cairn_runs_and_show_survive_damaged_rows(tmp_path: Path) -> None:
    db = tmp_path / "cli.db"
    store = SQLiteStore(db)
    store.create_run(new_run("good"))
    store.create_run(new_run("bad"))
    store.close()
    vandalise(SQLiteStore(db), "UPDATE {t}runs SET status = %s WHERE run_id = %s", "zombie", "bad")
    vandalise(SQLiteStore(db), "UPDATE {t}history SET event = %s, detail = %s WHERE run_id = %s",
              "run.exploded", "{oops", "bad")
    runner = CliRunner()
    listed = runner.invoke(main, ["--db", str(db), "runs"])
    assert listed.exit_code == 0, listed.output
    assert "?zombie" in listed.output
    assert "good" in listed.output
    shown = runner.invoke(main, ["--db", str(db), "show", "bad"])
    assert shown.exit_code == 0, shown.output
    assert "?zombie" in shown.output
    events = runner.invoke(main, ["--db", str(db), "events", "bad"])
    assert events.exit_code == 0, events.output
    assert "?run.exploded" in events.output


def test_usage_counts_nothing_for_a_damaged_detail(store: Store, clock: FakeClock) -> None:
    """``run_usage`` sums in SQL; a model entry whose detail does not parse
    counts nothing (and fails neither the read nor the others' sums)."""
    from tests.store.contract.helpers import ev

    store.create_run(new_run("r1"))
    c = store.claim_run("r1", "w1", LEASE, 3)
    assert c is not None
    seq = c.next_seq
    store.append("r1", c.run.epoch, [
        ev(clock, "r1", seq, c.run.epoch, position=0, step_kind="model",
           detail={"usage": {"total_tokens": 5}}),
        ev(clock, "r1", seq + 1, c.run.epoch, position=1, step_kind="model",
           detail={"usage": {"total_tokens": 7}, "cost": 1.5}),
        ev(clock, "r1", seq + 2, c.run.epoch, position=2, step_kind="tool"),
    ])
    vandalise(store, "UPDATE {t}history SET detail = %s WHERE run_id = %s AND seq = %s", "{oops", "r1", seq)
    totals = store.run_usage("r1")
    assert (totals.tokens, totals.cost, totals.tool_calls, totals.last_seq) == (7, 1.5, 1, seq + 2)
