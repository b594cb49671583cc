"""Store contract: leases: expiry, takeover, quarantine, reclaiming and renewal."""

from __future__ import annotations

import pytest

from cairn.errors import LeaseLost
from cairn.store.contract import Store
from cairn.store.records import (
    EventType,
    RunStatus,
)
from tests.store.contract.helpers import (
    LEASE,
    WF,
    ContractBase,
    FakeClock,
    claim,
    ev,
    finish,
    running,
    types,
)


class LeasesContract(ContractBase):
    # -- leases: expiry, takeover, quarantine, renewal ----------------------------

    def test_live_lease_is_not_taken_over(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        clock.advance(LEASE - 0.5)
        assert store.claim_runs("w2", [WF], 10, LEASE, 3) == []
        assert store.get_run("r1") == c.run

    def test_expired_lease_is_taken_over(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        clock.advance(LEASE + 0.5)
        got = store.claim_runs("w2", [WF], 10, LEASE, 3)
        assert len(got) == 1
        t = got[0]
        assert (t.run.status, t.run.owner, t.run.epoch) == (RunStatus.RUNNING, "w2", c.run.epoch + 1)
        assert t.run.recoveries == 1
        assert t.run.lease_expires_at == clock() + LEASE
        assert t.history[: len(c.history)] == c.history
        tail = t.history[len(c.history) :]
        assert types(tail) == [EventType.LEASE_LOST, EventType.LEASE_TAKEN_OVER]
        lost, taken = tail
        assert lost.detail is not None
        assert lost.detail["worker"] == "w1"
        assert lost.detail["epoch"] == c.run.epoch
        assert lost.detail["reason"] == "expired"
        assert taken.detail is not None
        assert taken.detail["from_worker"] == "w1"
        assert (taken.worker, taken.epoch) == ("w2", c.run.epoch + 1)
        assert t.next_seq == len(t.history) + 1
        assert t.history == store.history("r1")

    def test_recoveries_accumulate_across_takeovers(self, store: Store, clock: FakeClock) -> None:
        running(store, clock)
        for n, worker in enumerate(["w2", "w3", "w4"], start=1):
            clock.advance(LEASE + 1)
            t = claim(store, "r1", worker, max_recoveries=3)
            assert t.run.recoveries == n
            assert t.history[-2].detail["worker"] == ["w1", "w2", "w3"][n - 1]  # type: ignore[index]

    @pytest.mark.parametrize("max_recoveries", [0, 1, 2])
    def test_quarantine_after_max_recoveries(
        self, store: Store, clock: FakeClock, max_recoveries: int
    ) -> None:
        last = running(store, clock)
        for n in range(max_recoveries):
            clock.advance(LEASE + 1)
            got = store.claim_runs(f"t{n}", [WF], 10, LEASE, max_recoveries)
            assert len(got) == 1
            last = got[0]
        clock.advance(LEASE + 1)
        assert store.claim_runs("final", [WF], 10, LEASE, max_recoveries) == []
        record = store.get_run("r1")
        assert record is not None
        assert record.status is RunStatus.QUARANTINED
        assert record.owner is None
        assert record.epoch > last.run.epoch
        history = store.history("r1")
        assert types(history[-2:]) == [EventType.LEASE_LOST, EventType.RUN_QUARANTINED]
        assert history[-2].detail["worker"] == last.run.owner  # type: ignore[index]
        assert EventType.LEASE_TAKEN_OVER not in types(history[len(last.history) :])
        clock.advance(LEASE * 10)
        assert store.claim_runs("final", [WF], 10, LEASE, 100) == []
        assert store.claim_run("r1", "final", LEASE, 100) is None

    def test_claim_run_quarantines_too(self, store: Store, clock: FakeClock) -> None:
        running(store, clock)
        clock.advance(LEASE + 1)
        assert store.claim_run("r1", "w2", LEASE, 0) is None
        assert store.get_run("r1").status is RunStatus.QUARANTINED  # type: ignore[union-attr]

    def test_reclaim_owned(self, store: Store, clock: FakeClock) -> None:
        a = running(store, clock, "a", "w1")
        running(store, clock, "b", "w1")
        running(store, clock, "c", "w2")
        p = running(store, clock, "parked", "w1")
        event = ev(clock, "parked", p.next_seq, p.run.epoch, EventType.RUN_SUSPENDED)
        store.suspend_run("parked", p.run.epoch, event, wake_at=clock() + 1000, waiting_on=None)
        assert store.reclaim_owned("w9") == 0
        assert store.reclaim_owned("w1") == 2
        # No time passes: the leases count as expired at once.
        got = store.claim_runs("w1", [WF], 10, LEASE, 3)
        assert sorted(g.run.run_id for g in got) == ["a", "b"]
        for g in got:
            assert g.run.recoveries == 1
            assert g.run.epoch == a.run.epoch + 1
            assert types(g.history[-2:]) == [EventType.LEASE_LOST, EventType.LEASE_TAKEN_OVER]
            assert g.history[-2].detail["worker"] == "w1"  # type: ignore[index]
        assert store.get_run("c").owner == "w2"  # type: ignore[union-attr]
        assert store.get_run("parked").status is RunStatus.SUSPENDED  # type: ignore[union-attr]

    def test_reclaimed_run_fences_the_dead_incarnation(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        store.reclaim_owned("w1")
        claim(store, "r1", "w1")
        with pytest.raises(LeaseLost):
            store.append("r1", c.run.epoch, [ev(clock, "r1", c.next_seq, c.run.epoch)])

    def test_renew_leases_extends(self, store: Store, clock: FakeClock) -> None:
        a = running(store, clock, "a")
        b = running(store, clock, "b")
        clock.advance(LEASE - 5)
        assert store.renew_leases("w1", {"a": a.run.epoch, "b": b.run.epoch}, LEASE) == set()
        record = store.get_run("a")
        assert record is not None
        assert record.lease_expires_at == clock() + LEASE
        assert (record.status, record.owner, record.epoch) == (RunStatus.RUNNING, "w1", a.run.epoch)
        clock.advance(LEASE - 5)  # well past the original expiry
        assert store.claim_runs("w2", [WF], 10, LEASE, 3) == []
        clock.advance(6)
        assert {c.run.run_id for c in store.claim_runs("w2", [WF], 10, LEASE, 3)} == {"a", "b"}

    def test_renew_expired_but_not_taken_over_lease(self, store: Store, clock: FakeClock) -> None:
        """Nobody claimed the run meanwhile, so the holder still holds it."""
        c = running(store, clock)
        clock.advance(LEASE + 5)
        assert store.renew_leases("w1", {"r1": c.run.epoch}, LEASE) == set()
        assert store.claim_runs("w2", [WF], 10, LEASE, 3) == []

    def test_renew_leases_reports_lost_and_leaves_them_alone(self, store: Store, clock: FakeClock) -> None:
        mine = running(store, clock, "mine", "w1")
        running(store, clock, "theirs", "w2")
        taken = running(store, clock, "taken", "w1")
        done = running(store, clock, "done", "w1")
        finish(store, clock, done)
        cancelled = running(store, clock, "cancelled", "w1")
        store.cancel_run("cancelled", "x")
        store.reclaim_owned("w1")  # mine, taken: leases expire now
        claim(store, "taken", "w3")
        claim(store, "mine", "w1")  # same worker, new epoch
        others = {rid: store.get_run(rid) for rid in ["theirs", "taken", "done", "cancelled", "mine"]}
        clock.advance(1)
        lost = store.renew_leases(
            "w1",
            {
                "mine": mine.run.epoch,  # stale epoch
                "theirs": 1,  # another worker's
                "taken": taken.run.epoch,
                "done": done.run.epoch,
                "cancelled": cancelled.run.epoch,
                "ghost": 1,
            },
            LEASE,
        )
        assert lost == {"mine", "theirs", "taken", "done", "cancelled", "ghost"}
        assert {rid: store.get_run(rid) for rid in others} == others
        assert store.renew_leases("w1", {}, LEASE) == set()
