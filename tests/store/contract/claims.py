"""Store contract: claiming runs: what is claimable, in which order, epochs, release; concurrent claims."""

from __future__ import annotations

import threading

import pytest

from cairn.store.contract import Store
from cairn.store.records import (
    Claim,
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
    new_run,
    running,
    types,
)


class ClaimsContract(ContractBase):
    # -- claiming ---------------------------------------------------------------

    def test_claim_pending_run(self, store: Store, clock: FakeClock) -> None:
        store.create_run(new_run("r1"))
        clock.advance(3)
        claims = store.claim_runs("w1", [WF], 10, LEASE, 3)
        assert len(claims) == 1
        c = claims[0]
        assert c.run.status is RunStatus.RUNNING
        assert c.run.owner == "w1"
        assert c.run.epoch == 1
        assert c.run.lease_expires_at == clock() + LEASE
        assert c.run.updated_at == clock()
        assert c.run.recoveries == 0
        assert types(c.history) == [EventType.RUN_CREATED, EventType.LEASE_CLAIMED, EventType.RUN_STARTED]
        claimed = c.history[1]
        assert (claimed.worker, claimed.epoch, claimed.at) == ("w1", 1, clock())
        assert c.next_seq == 4
        assert c.history == store.history("r1")
        assert c.run == store.get_run("r1")

    def test_claim_returns_nothing_when_nothing_is_runnable(self, store: Store) -> None:
        assert store.claim_runs("w1", [WF], 10, LEASE, 3) == []
        assert store.claim_run("nope", "w1", LEASE, 3) is None

    @pytest.mark.parametrize(
        "state",
        ["running-live", "suspended-not-due", "suspended-on-child", "completed", "failed", "cancelled"],
    )
    def test_not_runnable_runs_are_not_claimed(self, store: Store, clock: FakeClock, state: str) -> None:
        c = running(store, clock)
        seq, epoch = c.next_seq, c.run.epoch
        if state == "suspended-not-due":
            event = ev(clock, "r1", seq, epoch, EventType.RUN_SUSPENDED)
            store.suspend_run("r1", epoch, event, wake_at=clock() + 60, waiting_on=None)
        elif state == "suspended-on-child":
            store.start_child("r1", epoch, ev(clock, "r1", seq, epoch), new_run("kid", workflow="kids"))
            event = ev(clock, "r1", seq + 1, epoch, EventType.RUN_SUSPENDED)
            store.suspend_run("r1", epoch, event, wake_at=None, waiting_on="kid")
        elif state == "completed":
            finish(store, clock, c)
        elif state == "failed":
            finish(store, clock, c, RunStatus.FAILED)
        elif state == "cancelled":
            store.cancel_run("r1", "no")
        before = store.get_run("r1")
        clock.advance(LEASE / 2)
        assert store.claim_runs("w2", [WF], 10, LEASE, 3) == []
        assert store.claim_run("r1", "w2", LEASE, 3) is None
        assert store.get_run("r1") == before

    def test_claim_filters_by_workflow(self, store: Store) -> None:
        store.create_run(new_run("a", workflow="alpha"))
        store.create_run(new_run("b", workflow="beta"))
        store.create_run(new_run("c", workflow="gamma"))
        assert store.claim_runs("w1", ["zeta"], 10, LEASE, 3) == []
        assert store.claim_runs("w1", [], 10, LEASE, 3) == []
        got = store.claim_runs("w1", ["alpha", "gamma"], 10, LEASE, 3)
        assert sorted(c.run.run_id for c in got) == ["a", "c"]
        assert store.get_run("b").status is RunStatus.PENDING  # type: ignore[union-attr]

    def test_claim_filters_by_queue(self, store: Store) -> None:
        store.create_run(new_run("d"))
        store.create_run(new_run("f", queue="fast"))
        store.create_run(new_run("s", queue="slow"))
        assert store.claim_runs("w1", [WF], 10, LEASE, 3, queues=["none"]) == []
        assert store.claim_runs("w1", [WF], 10, LEASE, 3, queues=[]) == []
        got = store.claim_runs("w1", [WF], 10, LEASE, 3, queues=["fast", "default"])
        assert sorted(c.run.run_id for c in got) == ["d", "f"]
        rest = store.claim_runs("w1", [WF], 10, LEASE, 3, queues=None)
        assert [c.run.run_id for c in rest] == ["s"]

    def test_claim_order_priority_then_longest_runnable(self, store: Store, clock: FakeClock) -> None:
        store.create_run(new_run("old-low", priority=0))
        clock.advance(1)
        store.create_run(new_run("high", priority=5))
        clock.advance(1)
        store.create_run(new_run("new-low", priority=0))
        clock.advance(1)
        store.create_run(new_run("negative", priority=-1))
        clock.advance(1)
        order = [store.claim_runs("w1", [WF], 1, LEASE, 3)[0].run.run_id for _ in range(4)]
        assert order == ["high", "old-low", "new-low", "negative"]

    def test_claim_order_counts_time_runnable_not_creation(self, store: Store, clock: FakeClock) -> None:
        """A run created first but runnable later (its timer fires after the
        other run arrived) waits its turn behind the longer-runnable one."""
        c = running(store, clock, "timer")
        event = ev(clock, "timer", c.next_seq, c.run.epoch, EventType.RUN_SUSPENDED)
        store.suspend_run("timer", c.run.epoch, event, wake_at=clock() + 10, waiting_on=None)
        clock.advance(5)
        store.create_run(new_run("fresh"))
        clock.advance(20)
        got = store.claim_runs("w1", [WF], 2, LEASE, 3)
        assert [x.run.run_id for x in got] == ["fresh", "timer"]

    def test_claim_respects_limit(self, store: Store, clock: FakeClock) -> None:
        for i in range(5):
            store.create_run(new_run(f"r{i}"))
            clock.advance(1)
        assert store.claim_runs("w1", [WF], 0, LEASE, 3) == []
        first = store.claim_runs("w1", [WF], 2, LEASE, 3)
        assert [c.run.run_id for c in first] == ["r0", "r1"]
        rest = store.claim_runs("w1", [WF], 10, LEASE, 3)
        assert [c.run.run_id for c in rest] == ["r2", "r3", "r4"]

    def test_claim_run_by_id(self, store: Store, clock: FakeClock) -> None:
        store.create_run(new_run("a", workflow="anything", queue="q"))
        store.create_run(new_run("b"))
        c = store.claim_run("a", "w1", LEASE, 3)
        assert c is not None
        assert c.run.run_id == "a"
        assert c.run.epoch == 1
        assert types(c.history) == [EventType.RUN_CREATED, EventType.LEASE_CLAIMED, EventType.RUN_STARTED]
        assert store.claim_run("a", "w2", LEASE, 3) is None
        assert store.get_run("b").status is RunStatus.PENDING  # type: ignore[union-attr]

    def test_epoch_increments_on_every_claim(self, store: Store, clock: FakeClock) -> None:
        store.create_run(new_run("r1"))
        epochs = []
        for _ in range(3):
            c = claim(store, "r1")
            epochs.append(c.run.epoch)
            store.release_run(
                "r1", c.run.epoch, ev(clock, "r1", c.next_seq, c.run.epoch, EventType.RUN_RELEASED)
            )
        c = claim(store, "r1")
        event = ev(clock, "r1", c.next_seq, c.run.epoch, EventType.RUN_SUSPENDED)
        store.suspend_run("r1", c.run.epoch, event, wake_at=clock(), waiting_on=None)
        epochs.append(c.run.epoch)
        epochs.append(claim(store, "r1").run.epoch)
        clock.advance(LEASE + 1)
        epochs.append(claim(store, "r1", "w2").run.epoch)
        assert epochs == [1, 2, 3, 4, 5, 6]

    def test_release_makes_run_pending_and_runnable_at_once(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        clock.advance(2)
        released = ev(clock, "r1", c.next_seq, c.run.epoch, EventType.RUN_RELEASED)
        store.release_run("r1", c.run.epoch, released)
        record = store.get_run("r1")
        assert record is not None
        assert record.status is RunStatus.PENDING
        assert record.owner is None
        assert record.epoch == c.run.epoch
        assert record.updated_at == clock()
        assert store.history("r1")[-1] == released
        again = claim(store, "r1", "w2")
        assert again.run.epoch == c.run.epoch + 1
        assert again.run.recoveries == 0
        assert types(again.history).count(EventType.RUN_STARTED) == 1
        assert again.history[-1].event is EventType.LEASE_CLAIMED
        assert again.history[-1].worker == "w2"

    # -- concurrency -----------------------------------------------------------------

    def test_concurrent_claims_never_hand_out_a_run_twice(self, store: Store) -> None:
        for i in range(200):
            store.create_run(new_run(f"r{i:03d}"))
        threads_n = 8
        barrier = threading.Barrier(threads_n)
        got: list[list[Claim]] = [[] for _ in range(threads_n)]
        errors: list[BaseException] = []

        def work(n: int) -> None:
            try:
                barrier.wait()
                while True:
                    claims = store.claim_runs(f"w{n}", [WF], 3, 300.0, 3)
                    if not claims:
                        return
                    got[n].extend(claims)
            except BaseException as exc:  # surfaced to the test thread below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(threads_n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads)
        assert errors == []
        ids = [c.run.run_id for claims in got for c in claims]
        assert len(ids) == 200
        assert set(ids) == {f"r{i:03d}" for i in range(200)}
        for n, claims in enumerate(got):
            for c in claims:
                assert c.run.owner == f"w{n}"
                assert c.run.epoch == 1
                record = store.get_run(c.run.run_id)
                assert record is not None
                assert (record.owner, record.epoch) == (f"w{n}", 1)
                assert types(store.history(c.run.run_id)).count(EventType.LEASE_CLAIMED) == 1
