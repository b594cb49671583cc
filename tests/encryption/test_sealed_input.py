"""Sealing without copying the caller's records: a run created held
(``create_claimed_run``, what ``App.run`` does) has its input's bytes, a
step's entry (``append``) its payload's, and a finished run
(``finish_run``) its result's, swapped for the sealed ones for the store's
call and put back after, whatever happens. So the caller's record and
payload hold their plaintext again after the call (and after a call that
failed), and the row holds the envelope, which opens to it at its place."""

from __future__ import annotations

from typing import Any

import pytest

from cairn.errors import InvalidArgument, LeaseLost
from cairn.store.auditverify import verify_store
from cairn.store.records import EventType, HistoryEvent, NewRun, Payload, RunStatus
from cairn.store.rekey import version_of
from tests.encryption.test_sealed_store import CANARY, Raw, build, keyring


def test_the_callers_run_keeps_its_plaintext_input_and_the_row_holds_it_sealed(place: str) -> None:
    app = build(place, keyring())
    store: Any = app.store
    plain = f'"{CANARY}-input"'.encode()
    given = Payload(plain)
    new = NewRun("held-1", "canary", "1", "a", None, given)
    claim = store.create_claimed_run(new, "w1", 30.0)
    assert claim is not None
    assert new.input is given
    assert given.data == plain
    assert claim.run.input.data == plain  # the record returned holds the plaintext
    (stored,) = Raw(place)("SELECT input FROM runs WHERE run_id = 'held-1'")
    assert version_of(bytes(stored[0])) == 1
    assert store.get_run("held-1").input.data == plain
    assert store.create_claimed_run(new, "w1", 30.0) is None  # exists already: nothing created
    assert new.input is given
    assert given.data == plain
    app.close()


def test_the_callers_run_keeps_its_plaintext_input_when_the_store_refuses_it(place: str) -> None:
    app = build(place, keyring())
    store: Any = app.store
    plain = f'"{CANARY}-input"'.encode()
    given = Payload(plain)
    new = NewRun("tenant:other:x", "canary", "1", "a", None, given)  # another tenant's id: refused
    with pytest.raises(InvalidArgument, match="reserved"):  # by the store, after the input was sealed
        store.create_claimed_run(new, "w1", 30.0)
    assert new.input is given
    assert given.data == plain
    app.close()


def test_a_steps_entry_keeps_its_plaintext_payload_and_the_row_holds_it_sealed(place: str) -> None:
    app = build(place, keyring())
    store: Any = app.store
    claim = store.create_claimed_run(NewRun("held-3", "canary", "1", "a", None, Payload(b'"in"')), "w1", 30.0)
    plain = f'"{CANARY}-step"'.encode()
    given = Payload(plain)
    seq = claim.next_seq

    def entry(epoch: int, seq: int) -> HistoryEvent:
        return HistoryEvent("held-3", seq, EventType.STEP_COMPLETED, store.clock(), epoch, "w1", 0, "step",
                            "shout", "h", 1, store.clock(), given)

    step = entry(claim.run.epoch, seq)
    store.append("held-3", claim.run.epoch, [step])
    assert step.payload is given
    assert given.data == plain
    (stored,) = Raw(place)("SELECT payload FROM history WHERE run_id = 'held-3' AND seq = :s", s=seq)
    assert version_of(bytes(stored[0])) == 1
    assert [e.payload for e in store.history("held-3") if e.seq == seq] == [Payload(plain)]
    assert verify_store(store).problems == []  # its audit digest: keyed from the plaintext, verified
    stale = entry(claim.run.epoch + 1, seq + 1)  # a lease this holder never had: refused by the store
    with pytest.raises(LeaseLost):
        store.append("held-3", claim.run.epoch + 1, [stale])
    assert stale.payload is given
    assert given.data == plain
    app.close()


def test_a_finished_runs_result_keeps_its_plaintext_and_the_row_holds_it_sealed(place: str) -> None:
    app = build(place, keyring())
    store: Any = app.store
    claim = store.create_claimed_run(NewRun("held-4", "canary", "1", "a", None, Payload(b'"in"')), "w1", 30.0)
    plain = f'"{CANARY}-result"'.encode()
    given = Payload(plain)

    def last(epoch: int) -> HistoryEvent:
        return HistoryEvent("held-4", claim.next_seq, EventType.RUN_COMPLETED, store.clock(), epoch, "w1")

    with pytest.raises(LeaseLost):  # a lease this holder never had: refused by the store
        store.finish_run("held-4", claim.run.epoch + 1, last(claim.run.epoch + 1), RunStatus.COMPLETED,
                         given, None)
    assert given.data == plain  # put back after the refusal
    store.finish_run("held-4", claim.run.epoch, last(claim.run.epoch), RunStatus.COMPLETED, given, None)
    assert given.data == plain  # put back
    (stored,) = Raw(place)("SELECT result FROM runs WHERE run_id = 'held-4'")
    assert version_of(bytes(stored[0])) == 1
    assert store.get_run("held-4").result == Payload(plain)
    assert verify_store(store).problems == []
    app.close()
