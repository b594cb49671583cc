"""Store contract: timers and child runs: suspending, waking, start_child."""

from __future__ import annotations

import pytest

from cairn.errors import RunIdTaken
from cairn.store.contract import Store
from cairn.store.records import (
    EventType,
    RunFilter,
    RunStatus,
)
from tests.store.contract.helpers import (
    LEASE,
    WF,
    ContractBase,
    FakeClock,
    claim,
    claimable_ids,
    ev,
    finish,
    new_run,
    running,
    types,
)


class ChildrenContract(ContractBase):
    # -- timers and children ----------------------------------------------------

    def test_suspend_until_wake_at(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        wake = clock() + 10
        event = ev(clock, "r1", c.next_seq, c.run.epoch, EventType.RUN_SUSPENDED)
        store.suspend_run("r1", c.run.epoch, event, wake_at=wake, waiting_on=None)
        record = store.get_run("r1")
        assert record is not None
        assert (record.status, record.owner, record.lease_expires_at) == (RunStatus.SUSPENDED, None, None)
        assert (record.wake_at, record.waiting_on, record.epoch) == (wake, None, c.run.epoch)
        assert store.history("r1")[-1] == event
        clock.advance(9.9)
        assert store.claim_runs("w2", [WF], 10, LEASE, 3) == []
        assert store.claim_run("r1", "w2", LEASE, 3) is None
        clock.advance(0.1)
        woken = store.claim_runs("w2", [WF], 10, LEASE, 3)
        assert len(woken) == 1
        w = woken[0]
        assert w.run.status is RunStatus.RUNNING
        assert (w.run.owner, w.run.epoch) == ("w2", c.run.epoch + 1)
        assert (w.run.wake_at, w.run.waiting_on) == (None, None)
        assert types(w.history[-2:]) == [EventType.LEASE_CLAIMED, EventType.RUN_WOKEN]
        assert types(w.history).count(EventType.RUN_STARTED) == 1

    def test_suspend_with_past_wake_at_is_runnable_at_once(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        event = ev(clock, "r1", c.next_seq, c.run.epoch, EventType.RUN_SUSPENDED)
        store.suspend_run("r1", c.run.epoch, event, wake_at=clock() - 5, waiting_on=None)
        assert claim(store, "r1").history[-1].event is EventType.RUN_WOKEN

    @pytest.mark.parametrize("outcome", [RunStatus.COMPLETED, RunStatus.FAILED])
    def test_child_finish_wakes_waiting_parent(
        self, store: Store, clock: FakeClock, outcome: RunStatus
    ) -> None:
        p = self._parent_waiting_on_child(store, clock)
        record = store.get_run("parent")
        assert record is not None
        assert (record.status, record.waiting_on, record.wake_at) == (RunStatus.SUSPENDED, "kid", None)
        clock.advance(1000)
        kid = store.claim_runs("w2", [WF], 10, LEASE, 3)
        assert [k.run.run_id for k in kid] == ["kid"], "the parent must not be runnable yet"
        clock.advance(1)
        finish(store, clock, kid[0], outcome)
        woken = store.claim_runs("w3", [WF], 10, LEASE, 3)
        assert [w.run.run_id for w in woken] == ["parent"]
        assert woken[0].run.epoch == p.run.epoch + 1
        assert woken[0].history[-1].event is EventType.RUN_WOKEN

    def test_waiting_on_already_finished_child_is_runnable_at_once(
        self, store: Store, clock: FakeClock
    ) -> None:
        p = running(store, clock, "parent")
        epoch = p.run.epoch
        store.start_child("parent", epoch, ev(clock, "parent", p.next_seq, epoch), new_run("kid"))
        finish(store, clock, claim(store, "kid", "w2"))
        event = ev(clock, "parent", p.next_seq + 1, epoch, EventType.RUN_SUSPENDED)
        store.suspend_run("parent", epoch, event, wake_at=None, waiting_on="kid")
        assert store.get_run("parent").status is RunStatus.SUSPENDED  # type: ignore[union-attr]
        assert [c.run.run_id for c in store.claim_runs("w1", [WF], 10, LEASE, 3)] == ["parent"]

    def test_child_finish_leaves_other_runs_alone(self, store: Store, clock: FakeClock) -> None:
        """Only a parent suspended on *this* child wakes: not one waiting on a
        sibling, and not one still running (its lease stays its own)."""
        p = self._parent_waiting_on_child(store, clock)
        q = running(store, clock, "busy")
        store.start_child("busy", q.run.epoch, ev(clock, "busy", q.next_seq, q.run.epoch), new_run("kid2"))
        r = running(store, clock, "other")
        e = r.run.epoch
        store.start_child("other", e, ev(clock, "other", r.next_seq, e), new_run("kid3"))
        event = ev(clock, "other", r.next_seq + 1, e, EventType.RUN_SUSPENDED)
        store.suspend_run("other", e, event, wake_at=None, waiting_on="kid3")
        busy_before = store.get_run("busy")
        finish(store, clock, claim(store, "kid2", "w2"))
        assert store.get_run("busy") == busy_before
        store.append("busy", q.run.epoch, [ev(clock, "busy", q.next_seq + 1, q.run.epoch)])
        # Only the still-pending children; neither waiting parent woke up.
        assert claimable_ids(store) == {"kid", "kid3"}
        assert store.get_run("parent").epoch == p.run.epoch  # type: ignore[union-attr]

    # -- start_child ----------------------------------------------------------------

    def test_start_child(self, store: Store, clock: FakeClock) -> None:
        p = running(store, clock, "parent")
        clock.advance(1)
        event = ev(clock, "parent", p.next_seq, p.run.epoch, step_kind="child", name="kid")
        spec = new_run("kid", workflow="kids", priority=3, queue="q", thread_id="t")
        kid = store.start_child("parent", p.run.epoch, event, spec)
        assert kid.parent_run_id == "parent"
        assert (kid.run_id, kid.workflow, kid.priority, kid.queue, kid.thread_id) == (
            "kid",
            "kids",
            3,
            "q",
            "t",
        )
        assert (kid.status, kid.epoch, kid.owner, kid.created_at) == (RunStatus.PENDING, 0, None, clock())
        assert store.get_run("kid") == kid
        assert types(store.history("kid")) == [EventType.RUN_CREATED]
        assert store.history("parent")[-1] == event
        assert [r.run_id for r in store.list_runs(RunFilter(parent_run_id="parent"))] == ["kid"]
        assert [c.run.run_id for c in store.claim_runs("w2", ["kids"], 10, LEASE, 3)] == ["kid"]

    def test_start_child_is_idempotent_on_child_id(self, store: Store, clock: FakeClock) -> None:
        """A replay after a crash starts the same child again: the parent's
        journal gets its entry, the child is left exactly as it is."""
        p = running(store, clock, "parent")
        first = store.start_child(
            "parent", p.run.epoch, ev(clock, "parent", p.next_seq, p.run.epoch), new_run("kid")
        )
        kid_claim = claim(store, "kid", "w2")
        clock.advance(LEASE + 1)
        p2 = claim(store, "parent", "w3")
        event = ev(clock, "parent", p2.next_seq, p2.run.epoch, worker="w3")
        again = store.start_child("parent", p2.run.epoch, event, new_run("kid", priority=9))
        assert again == kid_claim.run
        assert again != first
        assert store.history("kid") == kid_claim.history
        assert store.history("parent")[-1] == event

    @pytest.mark.parametrize("holder", ["another tenant", "no parent", "another parent"])
    def test_start_child_under_an_id_someone_else_holds_records_nothing(
        self, store: Store, clock: FakeClock, holder: str
    ) -> None:
        """A child id held by a run that is not this parent's child (a squatter
        that guessed it, or an unrelated run) is refused with ``RunIdTaken``
        inside the transaction: the parent's entry is not written, the holder is
        untouched, and the parent may go on (under another id)."""
        if holder == "another parent":
            q = running(store, clock, "other-parent")
            store.start_child("other-parent", q.run.epoch, ev(clock, "other-parent", q.next_seq, q.run.epoch),
                              new_run("kid"))
        else:
            store.create_run(new_run("kid", tenant="mallory" if holder == "another tenant" else "default"))
        before = store.get_run("kid")
        p = running(store, clock, "parent")
        history = store.history("parent")
        with pytest.raises(RunIdTaken, match="'kid' is already taken"):
            store.start_child("parent", p.run.epoch, ev(clock, "parent", p.next_seq, p.run.epoch),
                              new_run("kid"))
        assert store.history("parent") == history
        assert store.get_run("kid") == before
        event = ev(clock, "parent", p.next_seq, p.run.epoch)
        assert store.start_child("parent", p.run.epoch, event, new_run("kid~other")).parent_run_id == "parent"
        assert store.history("parent")[-1] == event

    def test_start_child_sets_parent_even_if_spec_disagrees(self, store: Store, clock: FakeClock) -> None:
        p = running(store, clock, "parent")
        event = ev(clock, "parent", p.next_seq, p.run.epoch)
        kid = store.start_child("parent", p.run.epoch, event, new_run("kid", parent_run_id="someone-else"))
        assert kid.parent_run_id == "parent"
        assert store.get_run("kid").parent_run_id == "parent"  # type: ignore[union-attr]
