"""The SQLite hot path's fence without a read of history (``SQLiteStore._tails``).

A step's append reads no ``history`` row when the store appended the run's
last entry itself under the same epoch: it checks in Python that ``seq``
follows that entry and clamps ``at`` to its time, and relies on the run row's
fence and the primary key for the rest. Each test here tries to make it
accept what the full statement (``insert_event_fenced``) refuses.
"""

from __future__ import annotations

import base64
import json
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from cairn.errors import LeaseLost
from cairn.store.records import EventType, HistoryEvent, Payload, RunStatus
from cairn.store.rows import LINK_TAG
from cairn.store.sqlite import SQLiteStore
from tests.store.contract.helpers import FakeClock, claim, ev, new_run


def running(tmp_path: Path, clock: FakeClock) -> tuple[SQLiteStore, int, int]:
    store = SQLiteStore(tmp_path / "t.db", clock=clock)
    store.create_run(new_run("r1"))
    got = claim(store, "r1")
    return store, got.run.epoch, got.next_seq


def seqs(store: SQLiteStore) -> list[int]:
    return [e.seq for e in store.history("r1")]


def test_a_gap_after_a_known_entry_is_refused(tmp_path: Path) -> None:
    clock = FakeClock()
    store, epoch, seq = running(tmp_path, clock)
    store.append("r1", epoch, [ev(clock, "r1", seq, epoch)])
    with pytest.raises(LeaseLost):
        store.append("r1", epoch, [ev(clock, "r1", seq + 2, epoch, position=1)])
    assert seqs(store)[-1] == seq
    store.close()


def test_an_entry_another_writer_took_meanwhile_is_refused(tmp_path: Path) -> None:
    """The store knows the last entry it wrote; another connection appended
    right after it: the next append at that seq is a lost lease, not a
    silent overwrite or a duplicate."""
    clock = FakeClock()
    store, epoch, seq = running(tmp_path, clock)
    store.append("r1", epoch, [ev(clock, "r1", seq, epoch)])
    other = sqlite3.connect(store.path, isolation_level=None)
    other.execute("INSERT INTO history (run_id, seq, tenant, event, at, epoch) VALUES ('r1', ?, 'default', "
                  "'run.budget_changed', ?, ?)", (seq + 1, clock(), epoch))
    other.close()
    with pytest.raises(LeaseLost):
        store.append("r1", epoch, [ev(clock, "r1", seq + 1, epoch, position=1)])
    assert [e.event for e in store.history("r1")][-1] is EventType.RUN_BUDGET_CHANGED
    store.close()


def test_a_takeover_fences_out_the_store_that_knows_the_last_entry(tmp_path: Path) -> None:
    clock = FakeClock()
    store, epoch, seq = running(tmp_path, clock)
    store.append("r1", epoch, [ev(clock, "r1", seq, epoch)])
    rival = SQLiteStore(store.path, clock=clock)
    clock.advance(1000)  # the lease expired: another worker takes the run over
    taken = claim(rival, "r1", worker="w2")
    assert taken.run.epoch > epoch
    with pytest.raises(LeaseLost):
        store.append("r1", epoch, [ev(clock, "r1", seq + 1, epoch, position=1)])
    rival.append("r1", taken.run.epoch, [ev(clock, "r1", taken.next_seq, taken.run.epoch, worker="w2",
                                              position=1)])
    assert seqs(store) == list(range(1, taken.next_seq + 1))
    rival.close()
    store.close()


def test_an_entry_rolled_back_is_not_taken_for_the_last_one(tmp_path: Path) -> None:
    """A batch whose second entry is refused rolls back its first: the store
    must not follow the entry that was never committed (that would leave a
    gap in the history)."""
    clock = FakeClock()
    store, epoch, seq = running(tmp_path, clock)
    with pytest.raises(LeaseLost):
        store.append("r1", epoch, [ev(clock, "r1", seq, epoch), ev(clock, "r1", seq + 5, epoch, position=1)])
    with pytest.raises(LeaseLost):  # seq + 1 would follow the rolled-back entry
        store.append("r1", epoch, [ev(clock, "r1", seq + 1, epoch, position=1)])
    store.append("r1", epoch, [ev(clock, "r1", seq, epoch)])
    assert seqs(store) == list(range(1, seq + 1))
    store.close()


def test_time_stays_monotonic_on_the_path_without_a_read(tmp_path: Path) -> None:
    clock = FakeClock()
    store, epoch, seq = running(tmp_path, clock)
    clock.advance(5)
    store.append("r1", epoch, [ev(clock, "r1", seq, epoch)])
    for n in range(1, 4):  # the clock steps back before every append, each on the fast path
        clock.advance(-100)
        store.append("r1", epoch, [ev(clock, "r1", seq + n, epoch, position=n)])
    ats = [e.at for e in store.history("r1")]
    assert ats == sorted(ats)
    assert ats[-1] == ats[-4]
    store.close()


def test_an_ended_claim_forgets_its_last_entry(tmp_path: Path) -> None:
    """Once the claim ended (here: a release), an append of the old epoch
    is refused by the run row, whatever the store remembered."""
    clock = FakeClock()
    store, epoch, seq = running(tmp_path, clock)
    store.append("r1", epoch, [ev(clock, "r1", seq, epoch)])
    store.release_run("r1", epoch, ev(clock, "r1", seq + 1, epoch, EventType.RUN_RELEASED))
    with pytest.raises(LeaseLost):
        store.append("r1", epoch, [ev(clock, "r1", seq + 2, epoch, position=1)])
    record = store.get_run("r1")
    assert record is not None
    assert record.status is RunStatus.PENDING
    store.close()


# -- a payload that goes to history_payloads, in one statement (the ``cairn_spilled`` view) --------


def spilled(clock: FakeClock, seq: int, epoch: int, **extra: Any) -> HistoryEvent:
    """A step's entry whose payload stays larger than a history row keeps, even compressed."""
    data = json.dumps(base64.b64encode(random.Random(seq).randbytes(3000)).decode()).encode()
    return ev(clock, "r1", seq, epoch, position=seq, payload=Payload(data=data), **extra)


def payload_rows(store: SQLiteStore) -> int:
    with store._read() as conn:
        return int(conn.execute("SELECT count(*) FROM history_payloads").fetchone()[0])


def test_a_spilled_entry_after_a_known_one_is_one_statement(tmp_path: Path) -> None:
    """No transaction (no BEGIN, no COMMIT): the view's trigger writes the
    payload and the entry linking to it; both read back whole."""
    clock = FakeClock()
    store, epoch, seq = running(tmp_path, clock)
    store.append("r1", epoch, [ev(clock, "r1", seq, epoch)])
    statements: list[str] = []
    store._writer_conn().set_trace_callback(statements.append)
    entry = spilled(clock, seq + 1, epoch)
    store.append("r1", epoch, [entry])
    store._writer_conn().set_trace_callback(None)
    # one statement (the trace repeats it for each statement of its trigger): no BEGIN, no COMMIT
    assert {" ".join(s.split()[:3]) for s in statements} == {"INSERT INTO cairn_spilled"}
    assert payload_rows(store) == 1
    [read] = store.history_at("r1", [seq + 1])
    assert read.payload == entry.payload
    with store._read() as conn:
        (stored,) = conn.execute("SELECT payload FROM history WHERE run_id = 'r1' AND seq = ?",
                                 (seq + 1,)).fetchone()
    assert stored.startswith(LINK_TAG)
    store.close()


def test_a_takeover_fences_out_a_spilled_entry_and_leaves_no_payload(tmp_path: Path) -> None:
    clock = FakeClock()
    store, epoch, seq = running(tmp_path, clock)
    store.append("r1", epoch, [ev(clock, "r1", seq, epoch)])
    rival = SQLiteStore(store.path, clock=clock)
    clock.advance(1000)
    taken = claim(rival, "r1", worker="w2")
    with pytest.raises(LeaseLost):
        store.append("r1", epoch, [spilled(clock, seq + 1, epoch)])
    assert payload_rows(store) == 0
    assert seqs(store) == list(range(1, taken.next_seq))
    rival.close()
    store.close()


def test_a_spilled_entry_at_a_seq_taken_meanwhile_is_refused_and_leaves_no_payload(tmp_path: Path) -> None:
    clock = FakeClock()
    store, epoch, seq = running(tmp_path, clock)
    store.append("r1", epoch, [ev(clock, "r1", seq, epoch)])
    other = sqlite3.connect(store.path, isolation_level=None)
    other.execute("INSERT INTO history (run_id, seq, tenant, event, at, epoch) VALUES ('r1', ?, 'default', "
                  "'run.budget_changed', ?, ?)", (seq + 1, clock(), epoch))
    other.close()
    with pytest.raises(LeaseLost):
        store.append("r1", epoch, [spilled(clock, seq + 1, epoch)])
    assert payload_rows(store) == 0
    assert [e.event for e in store.history("r1")][-1] is EventType.RUN_BUDGET_CHANGED
    store.close()


def test_a_spilled_entry_is_fenced_by_the_run_row_even_at_a_free_seq(tmp_path: Path) -> None:
    """The run row's epoch moved on and nothing took the next seq (a
    takeover's own entries would; here only the row changed): the view's
    trigger refuses the entry on the row alone, and keeps no payload."""
    clock = FakeClock()
    store, epoch, seq = running(tmp_path, clock)
    store.append("r1", epoch, [ev(clock, "r1", seq, epoch)])
    other = sqlite3.connect(store.path, isolation_level=None)
    other.execute("UPDATE runs SET epoch = epoch + 1 WHERE run_id = 'r1'")
    other.close()
    with pytest.raises(LeaseLost):
        store.append("r1", epoch, [spilled(clock, seq + 1, epoch)])
    assert payload_rows(store) == 0
    assert seqs(store)[-1] == seq
    store.close()
