"""Store contract: mailboxes — deliveries a run waits for (signals, decisions).

A delivery is kept until the run consumes it, wakes the run only if it is
parked waiting for exactly that key, is refused for terminal and unknown
runs, and is consumed at most once, atomically with the journal entry that
records it.
"""

from __future__ import annotations

import pytest

from cairn.errors import InvalidRunState, LeaseLost, RunNotFound, StoreError
from cairn.store.contract import Store
from cairn.store.records import EventType, HistoryEvent, Payload, RunStatus
from tests.store.contract.helpers import (
    LEASE,
    ContractBase,
    FakeClock,
    claim,
    claimable_ids,
    ev,
    finish,
    new_run,
    park,
    running,
)

KEY = "signal:go"


def _wait(
    store: Store,
    clock: FakeClock,
    c_seq: int,
    epoch: int,
    *,
    key: str = KEY,
    wake_at: float | None = None,
    run_id: str = "r1",
) -> HistoryEvent:
    event = ev(clock, run_id, c_seq, epoch, EventType.RUN_SUSPENDED)
    store.suspend_run(run_id, epoch, event, wake_at, None, RunStatus.SUSPENDED, waiting_for=key)
    return event


def _taken(
    clock: FakeClock, run_id: str, seq: int, epoch: int, position: int, payload: bytes
) -> HistoryEvent:
    return ev(
        clock,
        run_id,
        seq,
        epoch,
        position=position,
        step_kind="signal",
        name=KEY,
        payload=Payload(data=payload),
    )


class MailboxContract(ContractBase):
    def test_a_delivery_before_the_wait_is_kept_in_order_and_listed(
        self, store: Store, clock: FakeClock
    ) -> None:
        running(store, clock)
        first, new = store.deliver("r1", KEY, Payload(data=b'"a"'), sender="cli:ada")
        assert new
        assert first.seq == 1
        assert first.sent_at == clock()
        assert first.sender == "cli:ada"
        clock.advance(1)
        second, _ = store.deliver("r1", KEY, Payload(data=b'"b"'))
        other, _ = store.deliver("r1", "signal:other", None)
        assert (second.seq, other.seq) == (2, 3)
        assert [m.payload for m in store.deliveries("r1", KEY)] == [
            Payload(data=b'"a"'),
            Payload(data=b'"b"'),
        ]
        assert [m.seq for m in store.deliveries("r1")] == [1, 2, 3]
        assert [m.seq for m in store.deliveries("r1", after_seq=1)] == [2, 3]
        assert all(m.taken_position is None for m in store.deliveries("r1"))

    def test_a_delivery_does_not_touch_the_history(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        store.deliver("r1", KEY, Payload(data=b"1"))
        assert store.history("r1") == c.history
        # so the holder's next append still lands at its own seq
        store.append("r1", c.run.epoch, [ev(clock, "r1", c.next_seq, c.run.epoch)])

    def test_delivery_wakes_a_run_waiting_for_that_key_only(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        _wait(store, clock, c.next_seq, c.run.epoch)
        clock.advance(1)
        store.deliver("r1", "signal:other", None)
        assert claimable_ids(store) == set()
        store.deliver("r1", KEY, Payload(data=b"1"))
        record = store.get_run("r1")
        assert record is not None
        assert record.waiting_for == KEY
        assert record.status is RunStatus.SUSPENDED
        woken = claim(store, "r1", "w2")
        assert woken.run.waiting_for is None
        assert woken.run.status is RunStatus.RUNNING

    def test_a_run_waiting_for_a_key_already_delivered_is_runnable_at_once(
        self, store: Store, clock: FakeClock
    ) -> None:
        """The delivery landed between the run's look at its mailbox and its
        suspension: the suspension sees it, so the wake-up is never lost."""
        c = running(store, clock)
        store.deliver("r1", KEY, Payload(data=b"1"))
        _wait(store, clock, c.next_seq, c.run.epoch, wake_at=clock() + 3600)
        assert claimable_ids(store) == {"r1"}

    def test_a_wait_with_a_timeout_wakes_at_the_timeout(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        _wait(store, clock, c.next_seq, c.run.epoch, wake_at=clock() + 60)
        clock.advance(59)
        assert store.claim_run("r1", "w2", LEASE, 3) is None
        clock.advance(2)
        assert claimable_ids(store) == {"r1"}

    def test_set_budget_does_not_wake_a_run_waiting_for_a_delivery(
        self, store: Store, clock: FakeClock
    ) -> None:
        c = running(store, clock)
        _wait(store, clock, c.next_seq, c.run.epoch)
        store.set_budget("r1", {"tokens": 10})
        assert claimable_ids(store) == set()

    def test_deliveries_to_terminal_or_unknown_runs_are_refused_and_store_nothing(
        self, store: Store, clock: FakeClock
    ) -> None:
        c = running(store, clock)
        finish(store, clock, c)
        with pytest.raises(InvalidRunState, match="completed"):
            store.deliver("r1", KEY, Payload(data=b"1"))
        with pytest.raises(RunNotFound):
            store.deliver("nope", KEY, Payload(data=b"1"))
        store.create_run(new_run("r2"))
        store.cancel_run("r2", "x")
        with pytest.raises(InvalidRunState, match="cancelled"):
            store.deliver("r2", KEY, None)
        assert store.deliveries("r1") == []
        assert store.deliveries("r2") == []
        assert store.deliveries("nope") == []

    def test_a_delivery_with_a_dedupe_key_is_made_once(self, store: Store, clock: FakeClock) -> None:
        store.create_run(new_run("r1"))
        first, new = store.deliver("r1", KEY, Payload(data=b"1"), dedupe="op-1")
        clock.advance(5)
        again, again_new = store.deliver("r1", KEY, Payload(data=b"2"), dedupe="op-1")
        assert new
        assert not again_new
        assert again == first
        store.deliver("r1", KEY, Payload(data=b"3"), dedupe="op-2")
        assert [m.payload for m in store.deliveries("r1")] == [Payload(data=b"1"), Payload(data=b"3")]

    def test_take_delivery_records_and_consumes_in_one_fenced_write(
        self, store: Store, clock: FakeClock
    ) -> None:
        c = running(store, clock)
        store.deliver("r1", KEY, Payload(data=b'"x"'))
        entry = _taken(clock, "r1", c.next_seq, c.run.epoch, 0, b'"x"')
        store.take_delivery("r1", c.run.epoch, entry, 1)
        (message,) = store.deliveries("r1")
        assert message.taken_position == 0
        assert message.taken_at == clock()
        assert store.history("r1")[-1] == entry
        with pytest.raises(StoreError, match="consumed already"):
            store.take_delivery(
                "r1", c.run.epoch, _taken(clock, "r1", c.next_seq + 1, c.run.epoch, 1, b"1"), 1
            )
        assert store.history("r1")[-1] == entry  # the refused take appended nothing

    def test_a_stale_holder_cannot_take_a_delivery(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        store.deliver("r1", KEY, Payload(data=b"1"))
        clock.advance(LEASE + 1)
        taker = claim(store, "r1", "w2")
        with pytest.raises(LeaseLost):
            store.take_delivery("r1", c.run.epoch, _taken(clock, "r1", c.next_seq, c.run.epoch, 0, b"1"), 1)
        (message,) = store.deliveries("r1")
        assert message.taken_position is None
        store.take_delivery(
            "r1", taker.run.epoch, _taken(clock, "r1", taker.next_seq, taker.run.epoch, 0, b"1"), 1
        )

    def test_a_delivery_taken_by_a_voided_entry_can_be_taken_again_in_its_place(
        self, store: Store, clock: FakeClock
    ) -> None:
        c = running(store, clock)
        store.deliver("r1", KEY, Payload(data=b"1"))
        store.take_delivery("r1", c.run.epoch, _taken(clock, "r1", c.next_seq, c.run.epoch, 3, b"1"), 1)
        seq = c.next_seq + 1
        with pytest.raises(StoreError):  # not released by another position
            store.take_delivery(
                "r1", c.run.epoch, _taken(clock, "r1", seq, c.run.epoch, 2, b"1"), 1, released=7
            )
        store.take_delivery("r1", c.run.epoch, _taken(clock, "r1", seq, c.run.epoch, 2, b"1"), 1, released=3)
        assert store.deliveries("r1")[0].taken_position == 2

    def test_pruning_a_run_deletes_its_mailbox(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        store.deliver("r1", KEY, Payload(data=b"1"))
        store.deliver("r1", KEY, Payload(data=b"2"))
        finish(store, clock, c)
        clock.advance(100)
        assert store.prune_runs(clock()) == 1
        assert store.deliveries("r1") == []
        store.create_run(new_run("r1"))  # the id is free again, with an empty mailbox
        assert store.deliveries("r1") == []

    def test_a_run_parked_for_a_child_is_not_woken_by_a_delivery(
        self, store: Store, clock: FakeClock
    ) -> None:
        c = running(store, clock)
        store.create_run(new_run("child", parent_run_id="r1"))
        park(store, clock, c, waiting_on="child")
        store.deliver("r1", KEY, None)
        assert store.claim_run("r1", "w2", LEASE, 3) is None

    def test_waiting_for_a_child_and_a_delivery_at_once_is_a_misuse(
        self, store: Store, clock: FakeClock
    ) -> None:
        c = running(store, clock)
        event = ev(clock, "r1", c.next_seq, c.run.epoch, EventType.RUN_SUSPENDED)
        with pytest.raises(ValueError, match="not both"):
            store.suspend_run("r1", c.run.epoch, event, None, "child", RunStatus.SUSPENDED, waiting_for=KEY)
        assert store.history("r1") == c.history

    def test_a_repeated_delivery_to_a_run_finished_since_returns_the_first(
        self, store: Store, clock: FakeClock
    ) -> None:
        """A sender that crashed after delivering and runs again learns that
        its delivery stands, rather than that the run takes no more."""
        c = running(store, clock)
        first, _ = store.deliver("r1", KEY, Payload(data=b"1"), dedupe="op-1")
        finish(store, clock, c)
        again, created = store.deliver("r1", KEY, Payload(data=b"1"), dedupe="op-1")
        assert not created
        assert again == first
        with pytest.raises(InvalidRunState):
            store.deliver("r1", KEY, Payload(data=b"1"), dedupe="op-2")
        assert [m.seq for m in store.deliveries("r1")] == [1]


    def test_delivery_reads_one_message_oldest_untaken_or_by_seq(
        self, store: Store, clock: FakeClock
    ) -> None:
        """What a receive reads (``Store.delivery``): without a seq the oldest
        message of the key nobody has taken, with one that message if it has
        the key; ``None`` otherwise."""
        c = running(store, clock)
        store.deliver("r1", KEY, Payload(data=b"1"))
        store.deliver("r1", "signal:other", Payload(data=b"2"))
        store.deliver("r1", KEY, Payload(data=b"3"))
        first = store.delivery("r1", KEY)
        assert first is not None
        assert (first.seq, first.payload) == (1, Payload(data=b"1"))
        store.take_delivery("r1", c.run.epoch, _taken(clock, "r1", c.next_seq, c.run.epoch, 0, b"1"), 1)
        after = store.delivery("r1", KEY)
        assert after is not None
        assert after.seq == 3
        taken = store.delivery("r1", KEY, 1)
        assert taken is not None
        assert (taken.seq, taken.taken_position) == (1, 0)
        assert store.delivery("r1", KEY, 2) is None  # another key's
        assert store.delivery("r1", "signal:none") is None
        assert store.delivery("r2", KEY) is None
