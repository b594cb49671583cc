"""Store contract: halting runs, and killed and halted runs being terminal everywhere."""

from __future__ import annotations

import pytest

from cairn.errors import InvalidRunState, LeaseLost
from cairn.store.contract import Store
from cairn.store.records import (
    EventType,
    RunStatus,
)
from tests.store.contract.helpers import (
    LEASE,
    SECURITY_ERROR,
    WF,
    ContractBase,
    FakeClock,
    _lost_by_takeover,
    claim,
    claimable_ids,
    ev,
    halt,
    new_run,
    park,
    put_in_state,
    running,
)


class HaltContract(ContractBase):
    # -- halt ---------------------------------------------------------------------------

    def test_halt_run(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        clock.advance(2)
        halted_event = halt(store, clock, c)
        record = store.get_run("r1")
        assert record is not None
        assert record.status is RunStatus.HALTED
        assert record.status.terminal
        assert record.error == SECURITY_ERROR
        assert record.epoch == c.run.epoch + 1
        assert (record.owner, record.lease_expires_at) == (None, None)
        assert record.updated_at == clock()
        assert store.history("r1") == [*c.history, halted_event]
        with pytest.raises(LeaseLost):
            store.append("r1", c.run.epoch, [ev(clock, "r1", c.next_seq + 1, c.run.epoch)])
        assert store.renew_leases("w1", {"r1": c.run.epoch}, LEASE) == {"r1"}
        clock.advance(LEASE * 10)
        assert store.claim_runs("w2", [WF], 10, LEASE, 3) == []
        assert store.claim_run("r1", "w2", LEASE, 3) is None
        with pytest.raises(InvalidRunState):
            store.retry_run("r1")
        assert store.cancel_run("r1", "x") == record
        assert store.get_run("r1") == record

    def test_halt_after_takeover_is_rejected_and_changes_nothing(
        self, store: Store, clock: FakeClock
    ) -> None:
        run_id, epoch, seq = _lost_by_takeover(store, clock)
        new_holder = store.get_run(run_id)
        assert new_holder is not None
        history = store.history(run_id)
        event = ev(clock, run_id, seq, epoch, EventType.RUN_HALTED)
        with pytest.raises(LeaseLost):
            store.halt_run(run_id, epoch, event, SECURITY_ERROR)
        assert store.get_run(run_id) == new_holder
        assert store.history(run_id) == history
        # The new holder is unaffected and can halt (or do anything else) itself.
        e = new_holder.epoch
        store.append(run_id, e, [ev(clock, run_id, len(history) + 1, e, worker="w2")])
        assert store.get_run(run_id).status is RunStatus.RUNNING  # type: ignore[union-attr]

    def test_halting_a_child_wakes_its_waiting_parent(self, store: Store, clock: FakeClock) -> None:
        p = self._parent_waiting_on_child(store, clock)
        halt(store, clock, claim(store, "kid", "w2"))
        got = store.claim_runs("w1", [WF], 10, LEASE, 3)
        assert [c.run.run_id for c in got] == ["parent"]
        assert got[0].run.epoch == p.run.epoch + 1
        assert got[0].history[-1].event is EventType.RUN_WOKEN

    # -- killed and halted are terminal everywhere --------------------------------------

    @pytest.mark.parametrize("ending", ["killed", "halted"])
    def test_waiting_on_a_killed_or_halted_child_is_runnable_at_once(
        self, store: Store, clock: FakeClock, ending: str
    ) -> None:
        p = running(store, clock, "parent")
        epoch = p.run.epoch
        store.start_child("parent", epoch, ev(clock, "parent", p.next_seq, epoch), new_run("kid"))
        if ending == "killed":
            store.kill_runs("x", run_id="kid")
        else:
            halt(store, clock, claim(store, "kid", "w2"))
        park(store, clock, p, waiting_on="kid", seq=p.next_seq + 1)
        assert store.get_run("parent").status is RunStatus.SUSPENDED  # type: ignore[union-attr]
        assert claimable_ids(store) == {"parent"}

    @pytest.mark.parametrize("ending", ["killed", "halted"])
    def test_cancel_cascade_leaves_killed_and_halted_runs_alone(
        self, store: Store, clock: FakeClock, ending: str
    ) -> None:
        store.create_run(new_run("root"))
        store.create_run(new_run("a", parent_run_id="root"))
        store.create_run(new_run("a1", parent_run_id="a"))
        if ending == "killed":
            store.kill_runs("x", run_id="a")
        else:
            halt(store, clock, claim(store, "a"))
        # Killing a took a1 with it; halting a left a1 pending.
        ended = {rid: store.get_run(rid) for rid in (["a", "a1"] if ending == "killed" else ["a"])}
        histories = {rid: store.history(rid) for rid in ended}
        store.cancel_run("root", "stop")
        assert store.get_run("root").status is RunStatus.CANCELLED  # type: ignore[union-attr]
        assert {rid: store.get_run(rid) for rid in ended} == ended
        assert {rid: store.history(rid) for rid in ended} == histories
        if ending == "halted":  # the cascade still reaches a1 through its halted parent
            assert store.get_run("a1").status is RunStatus.CANCELLED  # type: ignore[union-attr]

    @pytest.mark.parametrize("state", ["needs_attention", "budget-suspended"])
    def test_cancel_parked_run(self, store: Store, clock: FakeClock, state: str) -> None:
        put_in_state(store, clock, "r1", state)
        before = store.get_run("r1")
        assert before is not None
        record = store.cancel_run("r1", "no")
        assert record.status is RunStatus.CANCELLED
        assert record.epoch == before.epoch + 1
        with pytest.raises(InvalidRunState):
            store.resolve_operation("r1", 0, True, None, {})
        with pytest.raises(InvalidRunState, match="will not run again"):
            store.set_budget("r1", {"max_tokens": 1})
        clock.advance(LEASE * 10)
        assert store.claim_run("r1", "w2", LEASE, 3) is None
