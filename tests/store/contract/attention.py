"""Store contract: runs that need an operator: needs_attention and resolve_operation."""

from __future__ import annotations

import pytest

from cairn.errors import InvalidRunState, RunNotFound
from cairn.store.contract import Store
from cairn.store.records import (
    EventType,
    HistoryEvent,
    Payload,
    RunFilter,
    RunStatus,
)
from tests.store.contract.helpers import (
    LEASE,
    STATES,
    WF,
    ContractBase,
    FakeClock,
    claim,
    claimable_ids,
    ev,
    finish,
    intent,
    needs_attention,
    new_run,
    park,
    put_in_state,
    running,
    types,
)


class AttentionContract(ContractBase):
    # -- needs_attention ---------------------------------------------------------------

    def test_suspend_as_needs_attention(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        barrier_entry = intent(clock, "r1", c.next_seq, c.run.epoch)
        store.append("r1", c.run.epoch, [barrier_entry], barrier=True)
        clock.advance(2)
        parked = park(store, clock, c, RunStatus.NEEDS_ATTENTION, seq=c.next_seq + 1)
        record = store.get_run("r1")
        assert record is not None
        assert record.status is RunStatus.NEEDS_ATTENTION
        assert not record.status.terminal
        assert (record.owner, record.lease_expires_at, record.epoch) == (None, None, c.run.epoch)
        assert record.updated_at == clock()
        assert store.history("r1")[-2:] == [barrier_entry, parked]
        listed = store.list_runs(RunFilter(statuses=(RunStatus.NEEDS_ATTENTION,)))
        assert [r.run_id for r in listed] == ["r1"]
        assert store.renew_leases("w1", {"r1": c.run.epoch}, LEASE) == {"r1"}

    @pytest.mark.parametrize("hint", ["none", "past-timer", "finished-child"])
    def test_needs_attention_is_never_claimable_until_resolved(
        self, store: Store, clock: FakeClock, hint: str
    ) -> None:
        """Not by time, not by a due timer, not by a finished child: only an
        operator's ``resolve_operation`` makes the run runnable again."""
        c = running(store, clock)
        wake_at, waiting_on, seq = None, None, c.next_seq
        if hint == "past-timer":
            wake_at = clock() - 5
        elif hint == "finished-child":
            store.start_child("r1", c.run.epoch, ev(clock, "r1", seq, c.run.epoch), new_run("kid"))
            finish(store, clock, claim(store, "kid", "w2"))
            waiting_on, seq = "kid", seq + 1
        park(store, clock, c, RunStatus.NEEDS_ATTENTION, wake_at=wake_at, waiting_on=waiting_on, seq=seq)
        before = store.get_run("r1")
        for step in (0, LEASE + 1, 10_000):
            clock.advance(step)
            assert store.claim_runs("w2", [WF], 10, LEASE, 100) == []
            assert store.claim_run("r1", "w2", LEASE, 100) is None
        assert store.reclaim_owned("w1") == 0
        assert store.get_run("r1") == before
        store.resolve_operation("r1", 0, False, None, {})
        assert claimable_ids(store) == {"r1"}

    def test_needs_attention_child_does_not_wake_its_parent(self, store: Store, clock: FakeClock) -> None:
        p = self._parent_waiting_on_child(store, clock)
        k = claim(store, "kid", "w2")
        park(store, clock, k, RunStatus.NEEDS_ATTENTION)
        clock.advance(LEASE * 10)
        assert store.claim_run("parent", "w3", LEASE, 3) is None
        assert store.get_run("parent").epoch == p.run.epoch  # type: ignore[union-attr]

    def test_budget_suspension_waits_for_set_budget(self, store: Store, clock: FakeClock) -> None:
        """Suspended with neither a timer nor a child: only ``set_budget`` wakes it."""
        c = running(store, clock)
        park(store, clock, c)
        record = store.get_run("r1")
        assert record is not None
        assert (record.status, record.wake_at, record.waiting_on) == (RunStatus.SUSPENDED, None, None)
        clock.advance(10_000)
        assert store.claim_runs("w2", [WF], 10, LEASE, 3) == []
        assert store.claim_run("r1", "w2", LEASE, 3) is None
        store.set_budget("r1", {"max_tokens": 10_000})
        woken = claim(store, "r1", "w2")
        assert woken.run.epoch == c.run.epoch + 1
        assert types(woken.history[-3:]) == [
            EventType.RUN_BUDGET_CHANGED,
            EventType.LEASE_CLAIMED,
            EventType.RUN_WOKEN,
        ]

    @pytest.mark.parametrize(
        "status",
        [s for s in RunStatus
         if s not in (RunStatus.SUSPENDED, RunStatus.NEEDS_ATTENTION, RunStatus.INCOMPATIBLE)],
    )
    def test_suspend_refuses_other_statuses(self, store: Store, clock: FakeClock, status: RunStatus) -> None:
        c = running(store, clock)
        event = ev(clock, "r1", c.next_seq, c.run.epoch, EventType.RUN_SUSPENDED)
        clock.advance(1)
        with pytest.raises(ValueError, match="suspend_run"):
            store.suspend_run("r1", c.run.epoch, event, clock() + 5, None, status=status)
        assert store.get_run("r1") == c.run
        assert store.history("r1") == c.history
        store.append("r1", c.run.epoch, [ev(clock, "r1", c.next_seq, c.run.epoch)])  # still the holder

    # -- resolve_operation ----------------------------------------------------------

    def test_resolve_done_records_the_result(self, store: Store, clock: FakeClock) -> None:
        needs_attention(store, clock)
        before = store.get_run("r1")
        assert before is not None
        history = store.history("r1")
        clock.advance(60)
        detail = {"name": "charge_card", "note": "the bank says it went through", "ticket": 42}
        record = store.resolve_operation("r1", 0, True, Payload(data=b'{"charge": "ch_1"}'), detail)
        assert record.status is RunStatus.PENDING
        assert record.epoch == before.epoch + 1
        assert (record.owner, record.lease_expires_at, record.error) == (None, None, None)
        assert (record.wake_at, record.waiting_on) == (None, None)
        assert record.updated_at == clock()
        assert store.get_run("r1") == record
        full = store.history("r1")
        assert full[: len(history)] == history
        assert len(full) == len(history) + 1
        assert full[-1] == HistoryEvent(
            run_id="r1",
            seq=len(history) + 1,
            event=EventType.STEP_COMPLETED,
            at=clock(),
            epoch=record.epoch,
            position=0,
            step_kind="tool",
            name="charge_card",
            payload=Payload(data=b'{"charge": "ch_1"}'),
            detail={"resolved_by": "operator", **detail},
        )
        again = claim(store, "r1", "w2")
        assert again.run.epoch == record.epoch + 1
        assert types(again.history[-2:]) == [EventType.STEP_COMPLETED, EventType.LEASE_CLAIMED]
        assert types(again.history).count(EventType.RUN_STARTED) == 1
        assert again.history[: len(full)] == full

    def test_resolve_not_done_asks_for_a_new_attempt(self, store: Store, clock: FakeClock) -> None:
        needs_attention(store, clock)
        before = store.get_run("r1")
        assert before is not None
        history = store.history("r1")
        clock.advance(5)
        record = store.resolve_operation("r1", 3, False, None, {"step_kind": "http", "note": "never sent"})
        assert record.status is RunStatus.PENDING
        assert record.epoch == before.epoch + 1
        assert record.updated_at == clock()
        assert store.history("r1") == [
            *history,
            HistoryEvent(
                run_id="r1",
                seq=len(history) + 1,
                event=EventType.OP_RESOLVED,
                at=clock(),
                epoch=record.epoch,
                position=3,
                step_kind="http",
                name=None,
                payload=None,
                detail={"position": 3, "done": False, "step_kind": "http", "note": "never sent"},
            ),
        ]
        assert claimable_ids(store) == {"r1"}

    def test_resolve_done_with_a_step_kind_from_the_detail(self, store: Store, clock: FakeClock) -> None:
        needs_attention(store, clock)
        store.resolve_operation("r1", 1, True, Payload(ref="artifact-ref"), {"step_kind": "llm"})
        last = store.history("r1")[-1]
        assert (last.event, last.position, last.step_kind, last.name) == (
            EventType.STEP_COMPLETED,
            1,
            "llm",
            None,
        )
        assert last.payload == Payload(ref="artifact-ref")
        assert last.detail == {"resolved_by": "operator", "step_kind": "llm"}

    @pytest.mark.parametrize("state", [s for s in STATES if s != "needs_attention"])
    def test_resolve_refuses_runs_not_needing_attention(
        self, store: Store, clock: FakeClock, state: str
    ) -> None:
        put_in_state(store, clock, "r1", state)
        before, history = store.get_run("r1"), store.history("r1")
        assert before is not None
        clock.advance(1)
        for done in (True, False):
            with pytest.raises(InvalidRunState) as info:
                store.resolve_operation("r1", 0, done, Payload(data=b"1"), {})
            message = str(info.value)
            assert before.status.value in message
            assert "\n" not in message
        assert store.get_run("r1") == before
        assert store.history("r1") == history

    def test_resolve_twice_is_refused(self, store: Store, clock: FakeClock) -> None:
        needs_attention(store, clock)
        first = store.resolve_operation("r1", 0, False, None, {})
        history = store.history("r1")
        with pytest.raises(InvalidRunState):
            store.resolve_operation("r1", 0, True, Payload(data=b"1"), {})
        assert store.get_run("r1") == first
        assert store.history("r1") == history

    def test_resolve_unknown_run(self, store: Store) -> None:
        with pytest.raises(RunNotFound):
            store.resolve_operation("ghost", 0, True, None, {})
