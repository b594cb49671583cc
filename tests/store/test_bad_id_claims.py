"""Issue 30 item 1: one bad run id never stops the claims of every tenant.

A run id with a NUL cannot be created any more (``runids.check_id``), but a
row may hold one: written before the rule, or behind Cairn's back. SQLite's
JSON functions end text at a NUL, so the claim's batch statements could not
find that row, an assert failed, the whole claim rolled back, and it did so
every poll: every other tenant's runs stayed ``pending`` for good. Now the
row is set aside as damaged (quarantined, as a row that does not parse is)
and the batch goes on. SQLite only: PostgreSQL's text cannot hold a NUL, so
no such row can exist there (and creating one is refused on both backends:
``tests/engine/test_bad_ids.py``, and below).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from cairn.errors import InvalidArgument
from cairn.store.contract import Store
from cairn.store.postgres import PostgresStore
from cairn.store.records import EventType, RunFilter, RunStatus
from cairn.store.sqlite import SQLiteStore
from tests.store.contract.helpers import LEASE, WF, FakeClock, new_run

BAD = "bad\x00id"


def _rename(path: Path, old: str, new: str) -> None:
    """Give run ``old`` the id ``new`` behind the store's back."""
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA foreign_keys = OFF")
        for table in ("runs", "history"):
            conn.execute(f"UPDATE {table} SET run_id = ? WHERE run_id = ?", (new, old))


def test_a_run_id_with_a_nul_is_set_aside_and_every_other_run_is_claimed(tmp_path: Path) -> None:
    fake = FakeClock()
    path = tmp_path / "d.db"
    store = SQLiteStore(path, clock=fake)
    store.create_run(new_run("placeholder", tenant="t1"))  # first in line
    fake.advance(1)
    store.create_run(new_run("good", tenant="t2"))
    store.create_run(new_run("also-good", tenant="t1"))
    _rename(path, "placeholder", BAD)
    claims = store.claim_runs("w1", [WF], 10, LEASE, 3)  # used to fail an assert, every poll
    assert sorted(c.run.run_id for c in claims) == ["also-good", "good"]
    damaged = store.get_run(BAD)
    assert damaged is not None
    assert damaged.status is RunStatus.QUARANTINED
    assert damaged.error is not None
    assert damaged.error["type"] == "DamagedRow"
    assert "NUL" in damaged.error["message"]
    assert store.history(BAD)[-1].event is EventType.RUN_QUARANTINED
    assert store.claim_runs("w2", [WF], 10, LEASE, 3) == []  # it stays out of every later claim
    store.close()


def test_a_single_claim_of_it_sets_it_aside_too(tmp_path: Path) -> None:
    path = tmp_path / "d.db"
    store = SQLiteStore(path, clock=FakeClock())
    store.create_run(new_run("placeholder"))
    _rename(path, "placeholder", BAD)
    assert store.claim_run(BAD, "w1", LEASE, 3) is None
    record = store.get_run(BAD)
    assert record is not None
    assert record.status is RunStatus.QUARANTINED
    store.close()


@pytest.fixture(params=["sqlite", "postgres"])
def either(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    opened: Store
    if request.param == "postgres":
        opened = PostgresStore(request.getfixturevalue("pg_url"), clock=FakeClock())
    else:
        opened = SQLiteStore(tmp_path / "e.db", clock=FakeClock())
    yield opened
    opened.close()


def test_the_store_refuses_to_create_it_on_every_backend(either: Store) -> None:
    with pytest.raises(InvalidArgument, match="run id"):
        either.create_run(new_run(BAD))
    assert either.list_runs(RunFilter()) == []
