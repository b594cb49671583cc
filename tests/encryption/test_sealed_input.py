"""Sealing without copying the caller's records: a run created held
(``create_claimed_run``, what ``App.run`` does) has its input, and a step's
entry (``append``) its payload, swapped for the sealed one for the store's
call and put back after, whatever happens. So the caller's record holds its
plaintext again after the call (and after a call that failed), and the row
holds the envelope, which opens to it at its place."""

from __future__ import annotations

from typing import Any

import pytest

from cairn.errors import InvalidArgument, LeaseLost
from cairn.store.auditverify import verify_store
from cairn.store.records import EventType, HistoryEvent, NewRun, Payload
from cairn.store.rekey import version_of
from tests.encryption.test_sealed_store import CANARY, Raw, build, keyring


def test_the_callers_run_keeps_its_plaintext_input_and_the_row_holds_it_sealed(place: str) -> None:
    app = build(place, keyring())
    store: Any = app.store
    given = Payload(f'"{CANARY}-input"'.encode())
    new = NewRun("held-1", "canary", "1", "a", None, given)
    claim = store.create_claimed_run(new, "w1", 30.0)
    assert claim is not None
    assert new.input is given  # put back
    assert claim.run.input.data == given.data  # the record returned holds the plaintext
    (stored,) = Raw(place)("SELECT input FROM runs WHERE run_id = 'held-1'")
    assert version_of(bytes(stored[0])) == 1
    assert store.get_run("held-1").input.data == given.data
    assert store.create_claimed_run(new, "w1", 30.0) is None  # exists already: nothing created
    assert new.input is given
    app.close()


def test_the_callers_run_keeps_its_plaintext_input_when_the_store_refuses_it(place: str) -> None:
    app = build(place, keyring())
    store: Any = app.store
    given = Payload(f'"{CANARY}-input"'.encode())
    new = NewRun("tenant:other:x", "canary", "1", "a", None, given)  # another tenant's id: refused
    with pytest.raises(InvalidArgument, match="reserved"):  # by the store, after the input was sealed
        store.create_claimed_run(new, "w1", 30.0)
    assert new.input is given
    app.close()


def test_a_steps_entry_keeps_its_plaintext_payload_and_the_row_holds_it_sealed(place: str) -> None:
    app = build(place, keyring())
    store: Any = app.store
    claim = store.create_claimed_run(NewRun("held-3", "canary", "1", "a", None, Payload(b'"in"')), "w1", 30.0)
    given = Payload(f'"{CANARY}-step"'.encode())
    seq = claim.next_seq

    def entry(epoch: int, seq: int) -> HistoryEvent:
        return HistoryEvent("held-3", seq, EventType.STEP_COMPLETED, store.clock(), epoch, "w1", 0, "step",
                            "shout", "h", 1, store.clock(), given)

    step = entry(claim.run.epoch, seq)
    store.append("held-3", claim.run.epoch, [step])
    assert step.payload is given  # put back
    (stored,) = Raw(place)("SELECT payload FROM history WHERE run_id = 'held-3' AND seq = :s", s=seq)
    assert version_of(bytes(stored[0])) == 1
    assert [e.payload for e in store.history("held-3") if e.seq == seq] == [given]
    assert verify_store(store).problems == []  # its audit digest: keyed from the plaintext, verified
    stale = entry(claim.run.epoch + 1, seq + 1)  # a lease this holder never had: refused by the store
    with pytest.raises(LeaseLost):
        store.append("held-3", claim.run.epoch + 1, [stale])
    assert stale.payload is given
    app.close()
