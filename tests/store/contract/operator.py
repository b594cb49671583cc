"""Store contract: operator actions on runs and trees: cancel, retry, the kill switch, revive."""

from __future__ import annotations

import pytest

from cairn.errors import InvalidRunState, LeaseLost, RunNotFound
from cairn.store.contract import Store
from cairn.store.records import (
    EventType,
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
    halt,
    intent,
    new_run,
    park,
    put_in_state,
    running,
    types,
)


class OperatorContract(ContractBase):
    # -- cancel -----------------------------------------------------------------------

    @pytest.mark.parametrize("state", ["pending", "running", "suspended"])
    def test_cancel_live_run(self, store: Store, clock: FakeClock, state: str) -> None:
        store.create_run(new_run("r1"))
        if state != "pending":
            c = claim(store, "r1")
            if state == "suspended":
                event = ev(clock, "r1", c.next_seq, c.run.epoch, EventType.RUN_SUSPENDED)
                store.suspend_run("r1", c.run.epoch, event, wake_at=clock() + 5, waiting_on=None)
        before = store.get_run("r1")
        assert before is not None
        clock.advance(2)
        record = store.cancel_run("r1", "changed my mind")
        assert record.status is RunStatus.CANCELLED
        assert record.epoch == before.epoch + 1
        assert (record.owner, record.lease_expires_at) == (None, None)
        assert record.updated_at == clock()
        assert store.get_run("r1") == record
        last = store.history("r1")[-1]
        assert last.event is EventType.RUN_CANCELLED
        assert last.detail is not None
        assert last.detail["reason"] == "changed my mind"
        assert last.epoch == record.epoch
        clock.advance(LEASE * 10)
        assert store.claim_runs("w1", [WF], 10, LEASE, 3) == []

    def test_cancel_cascades_to_live_descendants(self, store: Store, clock: FakeClock) -> None:
        r"""root -> a -> a1 (running), a2 (completed) ; root -> b (pending) ;
        a2 -> a2x (pending: outlived its finished parent). Unrelated runs stay."""
        store.create_run(new_run("root"))
        store.create_run(new_run("a", parent_run_id="root"))
        store.create_run(new_run("b", parent_run_id="root"))
        store.create_run(new_run("a1", parent_run_id="a"))
        store.create_run(new_run("a2", parent_run_id="a"))
        store.create_run(new_run("a2x", parent_run_id="a2"))
        store.create_run(new_run("bystander"))
        a1 = claim(store, "a1", "w2")
        finish(store, clock, claim(store, "a2"))
        done_a2, bystander = store.get_run("a2"), store.get_run("bystander")
        before = {r.run_id: r for r in store.list_runs(RunFilter(limit=1000))}
        record = store.cancel_run("root", "stop everything")
        assert record.run_id == "root"
        for rid in ["root", "a", "b", "a1", "a2x"]:
            got = store.get_run(rid)
            assert got is not None
            assert got.status is RunStatus.CANCELLED, rid
            assert got.epoch == before[rid].epoch + 1, rid
            assert store.history(rid)[-1].event is EventType.RUN_CANCELLED, rid
        assert store.get_run("a2") == done_a2
        assert store.get_run("bystander") == bystander
        with pytest.raises(LeaseLost):
            store.append("a1", a1.run.epoch, [ev(clock, "a1", a1.next_seq, a1.run.epoch, worker="w2")])

    def test_cancel_spares_ancestors_and_siblings(self, store: Store, clock: FakeClock) -> None:
        store.create_run(new_run("root"))
        store.create_run(new_run("a", parent_run_id="root"))
        store.create_run(new_run("b", parent_run_id="root"))
        store.create_run(new_run("a1", parent_run_id="a"))
        store.cancel_run("a", "only this branch")
        statuses = {r.run_id: r.status for r in store.list_runs(RunFilter())}
        assert statuses == {
            "root": RunStatus.PENDING,
            "a": RunStatus.CANCELLED,
            "b": RunStatus.PENDING,
            "a1": RunStatus.CANCELLED,
        }

    def test_cancelling_a_child_wakes_its_waiting_parent(self, store: Store, clock: FakeClock) -> None:
        p = self._parent_waiting_on_child(store, clock)
        store.cancel_run("kid", "not needed")
        got = store.claim_runs("w1", [WF], 10, LEASE, 3)
        assert [c.run.run_id for c in got] == ["parent"]
        assert got[0].run.epoch == p.run.epoch + 1
        assert got[0].history[-1].event is EventType.RUN_WOKEN

    @pytest.mark.parametrize("status", [RunStatus.COMPLETED, RunStatus.FAILED])
    def test_cancel_terminal_run_changes_nothing(
        self, store: Store, clock: FakeClock, status: RunStatus
    ) -> None:
        finish(store, clock, running(store, clock), status)
        before, history = store.get_run("r1"), store.history("r1")
        clock.advance(1)
        assert store.cancel_run("r1", "too late") == before
        assert store.get_run("r1") == before
        assert store.history("r1") == history

    def test_cancel_twice_changes_nothing_the_second_time(self, store: Store, clock: FakeClock) -> None:
        store.create_run(new_run("r1"))
        first = store.cancel_run("r1", "one")
        history = store.history("r1")
        clock.advance(1)
        assert store.cancel_run("r1", "two") == first
        assert store.history("r1") == history

    def test_cancel_unknown_run(self, store: Store) -> None:
        with pytest.raises(RunNotFound):
            store.cancel_run("ghost", "x")

    # -- retry ------------------------------------------------------------------------

    def test_retry_failed_run(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        e = c.run.epoch
        store.append(
            "r1",
            e,
            [
                ev(clock, "r1", c.next_seq, e, position=0),
                ev(clock, "r1", c.next_seq + 1, e, EventType.STEP_FAILED, position=1),
            ],
        )
        finish(store, clock, c, RunStatus.FAILED, seq=c.next_seq + 2)
        failed = store.get_run("r1")
        assert failed is not None
        clock.advance(7)
        record = store.retry_run("r1")
        assert record.status is RunStatus.PENDING
        assert record.epoch == failed.epoch + 1
        assert (record.recoveries, record.error, record.owner) == (0, None, None)
        assert record.updated_at == clock()
        assert store.get_run("r1") == record
        last = store.history("r1")[-1]
        assert last.event is EventType.RUN_RETRIED
        assert last.detail is not None
        assert last.detail["from_position"] == 1
        assert last.epoch == record.epoch
        again = claim(store, "r1", "w2")
        assert again.run.epoch == record.epoch + 1
        assert again.run.recoveries == 0

    def test_retry_from_last_step_failed(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        e, s = c.run.epoch, c.next_seq
        store.append(
            "r1",
            e,
            [
                ev(clock, "r1", s, e, EventType.STEP_FAILED, position=1),
                ev(clock, "r1", s + 1, e, EventType.STEP_COMPLETED, position=2),
                ev(clock, "r1", s + 2, e, EventType.STEP_FAILED, position=3),
                ev(clock, "r1", s + 3, e, EventType.STEP_RETRIED, position=4),
            ],
        )
        finish(store, clock, c, RunStatus.FAILED, seq=s + 4)
        store.retry_run("r1")
        assert store.history("r1")[-1].detail["from_position"] == 3  # type: ignore[index]

    def test_retry_quarantined_run(self, store: Store, clock: FakeClock) -> None:
        running(store, clock)
        for worker in ["w2", "w3"]:
            clock.advance(LEASE + 1)
            store.claim_runs(worker, [WF], 10, LEASE, 1)
        quarantined = store.get_run("r1")
        assert quarantined is not None
        assert quarantined.status is RunStatus.QUARANTINED
        record = store.retry_run("r1")
        assert record.status is RunStatus.PENDING
        assert (record.recoveries, record.error) == (0, None)
        assert record.epoch == quarantined.epoch + 1
        assert store.history("r1")[-1].detail["from_position"] is None  # type: ignore[index]
        c = claim(store, "r1", "w4", max_recoveries=1)
        assert c.run.recoveries == 0
        clock.advance(LEASE + 1)
        assert claim(store, "r1", "w5", max_recoveries=1).run.recoveries == 1

    @pytest.mark.parametrize("state", ["pending", "running", "suspended", "completed", "cancelled"])
    def test_retry_refuses_other_states(self, store: Store, clock: FakeClock, state: str) -> None:
        store.create_run(new_run("r1"))
        if state in ("running", "suspended", "completed"):
            c = claim(store, "r1")
            if state == "suspended":
                event = ev(clock, "r1", c.next_seq, c.run.epoch, EventType.RUN_SUSPENDED)
                store.suspend_run("r1", c.run.epoch, event, wake_at=clock() + 5, waiting_on=None)
            elif state == "completed":
                finish(store, clock, c)
        elif state == "cancelled":
            store.cancel_run("r1", "x")
        before, history = store.get_run("r1"), store.history("r1")
        assert before is not None
        assert before.status.value == state
        with pytest.raises(InvalidRunState) as info:
            store.retry_run("r1")
        message = str(info.value)
        assert state in message
        assert "\n" not in message
        assert store.get_run("r1") == before
        assert store.history("r1") == history

    def test_retry_unknown_run(self, store: Store) -> None:
        with pytest.raises(RunNotFound):
            store.retry_run("ghost")

    # -- kill switch -----------------------------------------------------------------

    def test_kill_run_and_its_live_descendants(self, store: Store, clock: FakeClock) -> None:
        r"""root -> a (running) -> a1 (suspended on a timer), a2 (needs attention) ;
        root -> b (completed) -> b1 (pending: outlived its parent). A bystander
        of the same tenant is left alone."""
        store.create_run(new_run("root"))
        for rid, parent in [("a", "root"), ("b", "root"), ("a1", "a"), ("a2", "a"), ("b1", "b")]:
            store.create_run(new_run(rid, parent_run_id=parent))
        store.create_run(new_run("bystander"))
        a = claim(store, "a", "w2")
        park(store, clock, claim(store, "a1"), wake_at=clock() + 100)
        park(store, clock, claim(store, "a2"), RunStatus.NEEDS_ATTENTION)
        finish(store, clock, claim(store, "b"))
        before = {r.run_id: r for r in store.list_runs(RunFilter(limit=1000))}
        histories = {rid: store.history(rid) for rid in before}
        clock.advance(3)
        killed = store.kill_runs("runaway spend", run_id="root")
        assert sorted(r.run_id for r in killed) == ["a", "a1", "a2", "b1", "root"]
        for record in killed:
            assert store.get_run(record.run_id) == record
            self._assert_killed(store, clock, record.run_id, before[record.run_id], "runaway spend")
            assert store.history(record.run_id)[:-1] == histories[record.run_id]
        for rid in ("b", "bystander"):
            assert store.get_run(rid) == before[rid]
            assert store.history(rid) == histories[rid]
        with pytest.raises(LeaseLost):
            store.append("a", a.run.epoch, [ev(clock, "a", a.next_seq, a.run.epoch, worker="w2")])
        clock.advance(10_000)
        assert claimable_ids(store) == {"bystander"}

    def test_kill_spares_ancestors_and_siblings(self, store: Store, clock: FakeClock) -> None:
        store.create_run(new_run("root"))
        store.create_run(new_run("a", parent_run_id="root"))
        store.create_run(new_run("b", parent_run_id="root"))
        store.create_run(new_run("a1", parent_run_id="a"))
        killed = store.kill_runs("only this branch", run_id="a")
        assert sorted(r.run_id for r in killed) == ["a", "a1"]
        statuses = {r.run_id: r.status for r in store.list_runs(RunFilter())}
        assert statuses == {
            "root": RunStatus.PENDING,
            "a": RunStatus.KILLED,
            "b": RunStatus.PENDING,
            "a1": RunStatus.KILLED,
        }

    def test_kill_by_tenant_touches_only_that_tenant(self, store: Store, clock: FakeClock) -> None:
        """Every live run of the tenant dies; its finished runs and other
        tenants' runs (even a child of one of its runs) stay exactly as they were."""
        live_states = ["pending", "running", "suspended", "budget-suspended", "needs_attention"]
        for state in [*live_states, "completed"]:
            put_in_state(store, clock, f"acme-{state}", state, tenant="acme")
        store.create_run(new_run("acme-parent", tenant="acme"))
        store.create_run(new_run("globex-kid", tenant="globex", parent_run_id="acme-parent"))
        store.create_run(new_run("globex-busy", tenant="globex"))
        g = claim(store, "globex-busy", "w9")
        store.create_run(new_run("globex-idle", tenant="globex"))
        store.create_run(new_run("plain"))
        before = {r.run_id: r for r in store.list_runs(RunFilter(limit=1000))}
        histories = {rid: store.history(rid) for rid in before}
        clock.advance(1)
        reason = "tenant suspended for abuse"
        killed = store.kill_runs(reason, tenant="acme")
        expected = {*(f"acme-{s}" for s in live_states), "acme-parent"}
        assert {r.run_id for r in killed} == expected
        assert len(killed) == len(expected)
        for record in killed:
            assert store.get_run(record.run_id) == record
            self._assert_killed(store, clock, record.run_id, before[record.run_id], reason)
        for rid, record in before.items():
            if rid not in expected:
                assert store.get_run(rid) == record, rid
                assert store.history(rid) == histories[rid], rid
        busy = ev(clock, "globex-busy", g.next_seq, g.run.epoch, worker="w9")
        store.append("globex-busy", g.run.epoch, [busy])
        assert store.kill_runs("again", tenant="acme") == []
        assert store.kill_runs("nobody", tenant="initech") == []
        assert claimable_ids(store) == {"globex-kid", "globex-idle", "plain"}

    def test_kill_fences_the_holder(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        store.append("r1", c.run.epoch, [ev(clock, "r1", c.next_seq, c.run.epoch)])
        (killed,) = store.kill_runs("stop", run_id="r1")
        assert killed.epoch == c.run.epoch + 1
        history = store.history("r1")
        seq = c.next_seq + 1
        with pytest.raises(LeaseLost):
            store.append("r1", c.run.epoch, [ev(clock, "r1", seq, c.run.epoch)])
        with pytest.raises(LeaseLost):
            store.append("r1", c.run.epoch, [intent(clock, "r1", seq, c.run.epoch)], barrier=True)
        assert store.renew_leases("w1", {"r1": c.run.epoch}, LEASE) == {"r1"}
        assert store.history("r1") == history
        assert store.get_run("r1") == killed
        clock.advance(LEASE * 10)
        assert store.claim_runs("w2", [WF], 10, LEASE, 3) == []
        assert store.claim_run("r1", "w2", LEASE, 3) is None

    def test_killing_a_child_wakes_its_waiting_parent(self, store: Store, clock: FakeClock) -> None:
        p = self._parent_waiting_on_child(store, clock)
        killed = store.kill_runs("not needed", run_id="kid")
        assert [r.run_id for r in killed] == ["kid"]
        got = store.claim_runs("w1", [WF], 10, LEASE, 3)
        assert [c.run.run_id for c in got] == ["parent"]
        assert got[0].run.epoch == p.run.epoch + 1
        assert got[0].history[-1].event is EventType.RUN_WOKEN

    def test_killing_a_tenant_wakes_a_parent_of_another_tenant(self, store: Store, clock: FakeClock) -> None:
        p = running(store, clock, "parent")
        e = p.run.epoch
        store.start_child("parent", e, ev(clock, "parent", p.next_seq, e), new_run("kid", tenant="acme"))
        park(store, clock, p, waiting_on="kid", seq=p.next_seq + 1)
        assert [r.run_id for r in store.kill_runs("x", tenant="acme")] == ["kid"]
        assert store.get_run("parent").status is RunStatus.SUSPENDED  # type: ignore[union-attr]
        assert claimable_ids(store) == {"parent"}

    @pytest.mark.parametrize("state", ["completed", "failed", "cancelled", "quarantined", "killed", "halted"])
    def test_kill_terminal_run_changes_nothing(self, store: Store, clock: FakeClock, state: str) -> None:
        put_in_state(store, clock, "r1", state)
        before, history = store.get_run("r1"), store.history("r1")
        clock.advance(1)
        assert store.kill_runs("too late", run_id="r1") == []
        assert store.kill_runs("too late", tenant="default") == []
        assert store.get_run("r1") == before
        assert store.history("r1") == history

    @pytest.mark.parametrize(("run_id", "tenant"), [(None, None), ("r1", "default"), ("ghost", "default")])
    def test_kill_takes_exactly_one_selector(
        self, store: Store, clock: FakeClock, run_id: str | None, tenant: str | None
    ) -> None:
        store.create_run(new_run("r1"))
        before, history = store.get_run("r1"), store.history("r1")
        with pytest.raises(ValueError, match="kill_runs"):
            store.kill_runs("x", run_id=run_id, tenant=tenant)
        assert store.get_run("r1") == before
        assert store.history("r1") == history

    def test_kill_unknown_run(self, store: Store) -> None:
        store.create_run(new_run("r1"))
        with pytest.raises(RunNotFound):
            store.kill_runs("x", run_id="ghost")
        assert store.get_run("r1").status is RunStatus.PENDING  # type: ignore[union-attr]

    # -- revive ---------------------------------------------------------------------

    @pytest.mark.parametrize(
        "state", ["pending", "running", "suspended", "waiting-on-child", "needs_attention"]
    )
    def test_revive_killed_run(self, store: Store, clock: FakeClock, state: str) -> None:
        if state == "waiting-on-child":
            c = running(store, clock)
            store.start_child("r1", c.run.epoch, ev(clock, "r1", c.next_seq, c.run.epoch), new_run("kid"))
            park(store, clock, c, waiting_on="kid", seq=c.next_seq + 1)
        else:
            put_in_state(store, clock, "r1", state)
        store.kill_runs("panic", run_id="r1")
        killed = store.get_run("r1")
        assert killed is not None
        history = store.history("r1")
        clock.advance(30)
        record = store.revive_run("r1")
        assert record.status is RunStatus.PENDING
        assert record.epoch == killed.epoch + 1
        assert (record.owner, record.lease_expires_at, record.error) == (None, None, None)
        assert (record.wake_at, record.waiting_on) == (None, None)
        assert record.updated_at == clock()
        assert store.get_run("r1") == record
        full = store.history("r1")
        assert full[:-1] == history
        last = full[-1]
        assert (last.event, last.detail, last.epoch, last.at) == (
            EventType.RUN_REVIVED,
            {"previous_status": "killed"},
            record.epoch,
            clock(),
        )
        again = claim(store, "r1", "w2")  # resumes where it stopped: the history is all there
        assert again.run.epoch == record.epoch + 1
        assert again.history[: len(full)] == full
        assert again.history[-1].event is EventType.LEASE_CLAIMED
        assert types(again.history).count(EventType.RUN_STARTED) <= 1

    def test_revive_halted_run(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        halt(store, clock, c)
        halted = store.get_run("r1")
        assert halted is not None
        record = store.revive_run("r1")
        assert record.status is RunStatus.PENDING
        assert record.epoch == halted.epoch + 1
        assert record.error is None
        last = store.history("r1")[-1]
        assert (last.event, last.detail, last.epoch) == (
            EventType.RUN_REVIVED,
            {"previous_status": "halted"},
            record.epoch,
        )
        assert claim(store, "r1", "w2").run.epoch == record.epoch + 1

    @pytest.mark.parametrize("state", [s for s in STATES if s not in ("killed", "halted")])
    def test_revive_refuses_other_states(self, store: Store, clock: FakeClock, state: str) -> None:
        put_in_state(store, clock, "r1", state)
        before, history = store.get_run("r1"), store.history("r1")
        assert before is not None
        clock.advance(1)
        with pytest.raises(InvalidRunState) as info:
            store.revive_run("r1")
        message = str(info.value)
        assert before.status.value in message
        assert "\n" not in message
        assert store.get_run("r1") == before
        assert store.history("r1") == history

    def test_revive_twice_is_refused(self, store: Store, clock: FakeClock) -> None:
        put_in_state(store, clock, "r1", "killed")
        first = store.revive_run("r1")
        with pytest.raises(InvalidRunState):
            store.revive_run("r1")
        assert store.get_run("r1") == first

    def test_revive_unknown_run(self, store: Store) -> None:
        with pytest.raises(RunNotFound):
            store.revive_run("ghost")
