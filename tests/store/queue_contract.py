"""The queue part of the store contract: limits, rates and fairness.

Mixed into ``StoreContract``, so every backend runs it. The rules under test
are documented in ``cairn.store.admission``.
"""

from __future__ import annotations

import threading

import pytest

from cairn.errors import InvalidArgument
from cairn.store.admission import MAX_LANES, QueueLimits, QueueShare, QueueStats, Rate
from cairn.store.contract import Store
from cairn.store.records import Claim, EventType, RunStatus
from tests.store.contract import LEASE, WF, FakeClock, ev, finish, new_run


def claim_ids(
    store: Store, limit: int = 10, queues: list[str] | None = None, worker: str = "w1"
) -> list[str]:
    return [c.run.run_id for c in store.claim_runs(worker, [WF], limit, LEASE, 3, queues)]


def fill(
    store: Store, clock: FakeClock, tenant: str, count: int, queue: str = "q", **kw: object
) -> list[str]:
    """``count`` runs of ``tenant`` in ``queue``, named ``tenant-i`` (in
    queue ``q``) or ``queue:tenant-i``."""
    ids = []
    for i in range(count):
        run_id = f"{tenant}-{i}" if queue == "q" else f"{queue}:{tenant}-{i}"
        store.create_run(new_run(run_id, tenant=tenant, queue=queue, **kw))
        clock.advance(0.001)
        ids.append(run_id)
    return ids


def claim_from_four_threads(store: Store, rounds: int) -> list[Claim]:
    """Four workers claiming at once, ``rounds`` batches of two each: what
    every one of them got (a limit must hold across racing claimers)."""
    claimed: list[Claim] = []
    lock = threading.Lock()

    def claimer(name: str) -> None:
        for _ in range(rounds):
            got = store.claim_runs(name, [WF], 2, LEASE, 3)
            with lock:
                claimed.extend(got)

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return claimed

class QueueContract:
    # -- concurrency -------------------------------------------------------------

    def test_queue_concurrency_caps_running_runs(self, store: Store, clock: FakeClock) -> None:
        store.set_queue(QueueLimits("q", concurrency=2))
        fill(store, clock, "t", 5)
        store.create_run(new_run("elsewhere", queue="other"))
        first = store.claim_runs("w1", [WF], 10, LEASE, 3)
        assert sorted(c.run.run_id for c in first) == ["elsewhere", "t-0", "t-1"]
        assert claim_ids(store) == []  # full, whoever asks
        assert claim_ids(store, worker="w2") == []
        done = next(c for c in first if c.run.run_id == "t-0")
        finish(store, clock, done)
        assert claim_ids(store) == ["t-2"]
        assert claim_ids(store) == []

    def test_tenant_concurrency_caps_each_tenant(self, store: Store, clock: FakeClock) -> None:
        store.set_queue(QueueLimits("q", tenant_concurrency=1))
        fill(store, clock, "a", 3)
        fill(store, clock, "b", 3)
        assert sorted(claim_ids(store)) == ["a-0", "b-0"]
        assert claim_ids(store) == []

    def test_a_waiting_run_frees_its_slot(self, store: Store, clock: FakeClock) -> None:
        store.set_queue(QueueLimits("q", concurrency=1))
        fill(store, clock, "t", 2)
        (c,) = store.claim_runs("w1", [WF], 10, LEASE, 3)
        event = ev(clock, c.run.run_id, c.next_seq, c.run.epoch, EventType.RUN_SUSPENDED)
        store.suspend_run(c.run.run_id, c.run.epoch, event, wake_at=clock() + 10, waiting_on=None)
        assert claim_ids(store) == ["t-1"]
        clock.advance(11)
        assert claim_ids(store) == []  # t-0 is due again, but t-1 holds the slot

    def test_an_inline_run_counts_against_concurrency(self, store: Store, clock: FakeClock) -> None:
        store.set_queue(QueueLimits("q", concurrency=1))
        fill(store, clock, "t", 1)
        assert store.create_claimed_run(new_run("inline", queue="q", tenant="t"), "app", LEASE) is not None
        assert claim_ids(store) == []

    def test_a_takeover_is_admitted_at_the_limit(self, store: Store, clock: FakeClock) -> None:
        """A run whose worker died was admitted already: it is taken over even
        though the queue is full (it is one of the runs filling it)."""
        store.set_queue(QueueLimits("q", concurrency=1, rate=Rate(1, 3600)))
        fill(store, clock, "t", 2)
        assert claim_ids(store) == ["t-0"]
        clock.advance(LEASE + 1)
        got = store.claim_runs("w2", [WF], 10, LEASE, 3)
        assert [c.run.run_id for c in got] == ["t-0"]
        assert got[0].history[-1].event is EventType.LEASE_TAKEN_OVER
        assert claim_ids(store, worker="w3") == []

    def test_limits_hold_under_concurrent_claimers(self, store: Store, clock: FakeClock) -> None:
        store.set_queue(QueueLimits("q", concurrency=3, tenant_concurrency=2))
        fill(store, clock, "a", 10)
        fill(store, clock, "b", 10)
        claimed = claim_from_four_threads(store, rounds=10)
        assert len(claimed) == 3
        tenants = sorted(c.run.tenant for c in claimed)
        assert tenants in (["a", "a", "b"], ["a", "b", "b"])

    # -- a tenant's own share (issue 21) -------------------------------------------

    def test_a_tenant_share_caps_that_tenant_alone(self, store: Store, clock: FakeClock) -> None:
        """A's share of an unlimited queue holds A's runs to it; B's runs in
        the same queue are claimed as if there were no share at all."""
        store.set_queue_share(QueueShare("q", "a", concurrency=1))
        fill(store, clock, "a", 3)
        fill(store, clock, "b", 3)
        assert sorted(claim_ids(store)) == ["a-0", "b-0", "b-1", "b-2"]
        assert claim_ids(store, worker="w2") == []
        store.set_queue_share(QueueShare("q", "a"))  # removed: A's runs are claimed again
        assert claim_ids(store) == ["a-1", "a-2"]
        assert store.queue_shares() == []

    def test_a_share_above_the_queue_limit_does_not_raise_it(self, store: Store, clock: FakeClock) -> None:
        store.set_queue(QueueLimits("q", tenant_concurrency=1))
        store.set_queue_share(QueueShare("q", "a", concurrency=50))
        fill(store, clock, "a", 3)
        assert claim_ids(store) == ["a-0"]
        assert claim_ids(store) == []

    def test_a_share_under_the_queue_limit_restricts_further(self, store: Store, clock: FakeClock) -> None:
        store.set_queue(QueueLimits("q", concurrency=10, tenant_concurrency=3))
        store.set_queue_share(QueueShare("q", "a", concurrency=2))
        fill(store, clock, "a", 5)
        fill(store, clock, "b", 5)
        got = store.claim_runs("w1", [WF], 10, LEASE, 3)
        assert sorted(c.run.tenant for c in got) == ["a", "a", "b", "b", "b"]
        finish(store, clock, next(c for c in got if c.run.tenant == "a"))
        assert claim_ids(store) == ["a-2"]

    def test_a_share_holds_under_concurrent_claimers(self, store: Store, clock: FakeClock) -> None:
        store.set_queue_share(QueueShare("q", "a", concurrency=2))
        fill(store, clock, "a", 10)
        claimed = claim_from_four_threads(store, rounds=5)
        assert len(claimed) == 2

    def test_queue_shares_are_listed_per_tenant(self, store: Store) -> None:
        store.set_queue_share(QueueShare("q", "a", concurrency=2))
        store.set_queue_share(QueueShare("q", "b", concurrency=3))
        store.set_queue_share(QueueShare("q", "a", concurrency=4))  # replaces
        assert store.queue_shares("a") == [QueueShare("q", "a", 4)]
        assert store.queue_shares() == [QueueShare("q", "a", 4), QueueShare("q", "b", 3)]

    # -- a tenant's own rate share (issue 21) ----------------------------------------

    def test_a_tenant_rate_share_limits_that_tenant_alone(self, store: Store, clock: FakeClock) -> None:
        """A's share of 2 claims per 20 s: no more than 2 of A's runs are
        claimed in a period (then one per 10 s), while B's runs of the same
        queue are all claimed at once, now and later."""
        store.set_queue_share(QueueShare("q", "a", rate=Rate(2, 20)))
        fill(store, clock, "a", 6)
        fill(store, clock, "b", 6)
        assert sorted(claim_ids(store)) == ["a-0", "a-1", "b-0", "b-1", "b-2", "b-3", "b-4", "b-5"]
        assert claim_ids(store, worker="w2") == []
        clock.advance(9.9)  # 0.99 of A's tokens
        later = [f"b-late-{i}" for i in range(4)]
        for run_id in later:
            store.create_run(new_run(run_id, tenant="b", queue="q"))
        assert claim_ids(store) == later  # B is not slowed by A's share
        clock.advance(0.2)  # 1.01
        assert claim_ids(store) == ["a-2"]
        assert claim_ids(store) == []
        clock.advance(15)  # 1.51: the refill goes on at 1 per 10 s
        assert claim_ids(store) == ["a-3"]
        assert store.queue_shares() == [QueueShare("q", "a", rate=Rate(2, 20))]

    def test_a_rate_share_tightens_the_installations_tenant_rate(
        self, store: Store, clock: FakeClock
    ) -> None:
        store.set_queue(QueueLimits("q", tenant_rate=Rate(4, 3600)))
        store.set_queue_share(QueueShare("q", "a", rate=Rate(1, 3600)))
        fill(store, clock, "a", 6)
        fill(store, clock, "b", 6)
        assert sorted(claim_ids(store)) == ["a-0", "b-0", "b-1", "b-2", "b-3"]
        assert claim_ids(store) == []

    @pytest.mark.parametrize("rate", [Rate(5, 3600), Rate(4, 1800), Rate(4, 3600, burst=5)])
    def test_a_rate_share_above_the_installations_is_refused(self, store: Store, rate: Rate) -> None:
        store.set_queue(QueueLimits("q", tenant_rate=Rate(4, 3600)))
        store.set_queue_share(QueueShare("q", "a", concurrency=2))
        with pytest.raises(InvalidArgument, match=r"exceeds the installation's per-tenant rate 4/h"):
            store.set_queue_share(QueueShare("q", "a", rate=rate))
        assert store.queue_shares() == [QueueShare("q", "a", 2)]  # unchanged
        store.set_queue_share(QueueShare("q", "a", rate=Rate(4, 3600)))  # equal is within
        store.set_queue_share(QueueShare("other", "a", rate=rate))  # a queue without a tenant rate: any

    def test_a_rate_share_is_unset_and_its_bucket_forgotten(self, store: Store, clock: FakeClock) -> None:
        store.set_queue_share(QueueShare("q", "a", concurrency=5, rate=Rate(1, 3600)))
        fill(store, clock, "a", 5)
        assert claim_ids(store) == ["a-0"]
        assert claim_ids(store) == []
        store.set_queue_share(QueueShare("q", "a", concurrency=3))  # replaced: no rate now
        assert claim_ids(store) == ["a-1", "a-2"]
        store.set_queue_share(QueueShare("q", "a", rate=Rate(1, 3600)))  # a new rate starts full
        assert claim_ids(store) == ["a-3"]
        assert claim_ids(store) == []
        store.set_queue_share(QueueShare("q", "a"))
        assert store.queue_shares() == []

    def test_a_rate_share_holds_under_concurrent_claimers(self, store: Store, clock: FakeClock) -> None:
        store.set_queue_share(QueueShare("q", "a", rate=Rate(3, 3600)))
        fill(store, clock, "a", 10)
        claimed = claim_from_four_threads(store, rounds=5)
        assert len(claimed) == 3

    def test_a_takeover_spends_no_share_token(self, store: Store, clock: FakeClock) -> None:
        store.set_queue_share(QueueShare("q", "a", rate=Rate(1, 3600)))
        fill(store, clock, "a", 2)
        assert claim_ids(store) == ["a-0"]
        clock.advance(LEASE + 1)
        assert claim_ids(store, worker="w2") == ["a-0"]  # the takeover
        assert claim_ids(store, worker="w2") == []  # and still no token for a-1

    # -- rates -------------------------------------------------------------------

    def test_rate_limit_is_a_token_bucket(self, store: Store, clock: FakeClock) -> None:
        store.set_queue(QueueLimits("q", rate=Rate(2, 10)))
        fill(store, clock, "t", 6)
        assert claim_ids(store) == ["t-0", "t-1"]  # a full bucket: a burst of 2
        assert claim_ids(store) == []
        clock.advance(4.9)  # 0.98 tokens
        assert claim_ids(store) == []
        clock.advance(0.2)  # 1.02
        assert claim_ids(store) == ["t-2"]
        clock.advance(20)  # refills to the burst, no further (and within the leases)
        assert claim_ids(store) == ["t-3", "t-4"]

    def test_burst_one_spaces_claims_evenly(self, store: Store, clock: FakeClock) -> None:
        store.set_queue(QueueLimits("q", rate=Rate(10, 1, burst=1)))
        fill(store, clock, "t", 3)
        assert claim_ids(store) == ["t-0"]
        assert claim_ids(store) == []
        clock.advance(0.11)
        assert claim_ids(store) == ["t-1"]

    def test_tenant_rate_limits_each_tenant(self, store: Store, clock: FakeClock) -> None:
        store.set_queue(QueueLimits("q", tenant_rate=Rate(1, 20)))
        fill(store, clock, "a", 3)
        fill(store, clock, "b", 3)
        assert sorted(claim_ids(store)) == ["a-0", "b-0"]
        assert claim_ids(store) == []
        clock.advance(20)
        assert sorted(claim_ids(store)) == ["a-1", "b-1"]

    def test_a_takeover_spends_no_token(self, store: Store, clock: FakeClock) -> None:
        store.set_queue(QueueLimits("q", rate=Rate(1, 3600)))
        fill(store, clock, "t", 2)
        assert claim_ids(store) == ["t-0"]
        clock.advance(LEASE + 1)
        assert claim_ids(store, worker="w2") == ["t-0"]  # the takeover
        assert claim_ids(store, worker="w2") == []  # and still no token for t-1
        clock.advance(3600)  # a token, and t-0's lease expired again: takeovers go first
        assert claim_ids(store, worker="w3") == ["t-0", "t-1"]

    def test_changing_limits_takes_effect_at_the_next_claim(self, store: Store, clock: FakeClock) -> None:
        store.set_queue(QueueLimits("q", concurrency=1))
        fill(store, clock, "t", 4)
        assert claim_ids(store) == ["t-0"]
        assert claim_ids(store) == []
        store.set_queue(QueueLimits("q", concurrency=3))
        assert claim_ids(store) == ["t-1", "t-2"]
        store.set_queue(QueueLimits("q"))  # no limits: the configuration goes
        assert claim_ids(store) == ["t-3"]
        assert [s.limits for s in store.queue_stats()] == [QueueLimits("q")]

    def test_removing_a_rate_forgets_its_bucket(self, store: Store, clock: FakeClock) -> None:
        store.set_queue(QueueLimits("q", rate=Rate(1, 3600)))
        fill(store, clock, "t", 3)
        assert claim_ids(store) == ["t-0"]
        store.set_queue(QueueLimits("q", concurrency=5))
        store.set_queue(QueueLimits("q", concurrency=5, rate=Rate(1, 3600)))
        assert claim_ids(store) == ["t-1"]  # a new rate starts with a full bucket

    # -- fairness ----------------------------------------------------------------

    def test_a_flooding_tenant_does_not_starve_another(self, store: Store, clock: FakeClock) -> None:
        fill(store, clock, "big", 50)
        fill(store, clock, "small", 2)
        # Water-filling: each next run from the tenant with fewer running.
        assert claim_ids(store, limit=4) == ["big-0", "small-0", "big-1", "small-1"]

    def test_fairness_counts_what_already_runs(self, store: Store, clock: FakeClock) -> None:
        fill(store, clock, "big", 10)
        assert len(claim_ids(store, limit=3)) == 3
        fill(store, clock, "small", 3)
        assert claim_ids(store, limit=4) == ["small-0", "small-1", "small-2", "big-3"]

    def test_fairness_is_per_queue(self, store: Store, clock: FakeClock) -> None:
        fill(store, clock, "big", 3, queue="one")
        fill(store, clock, "big", 3, queue="two")
        claim_ids(store, limit=3, queues=["one"])
        fill(store, clock, "small", 3, queue="two")
        # big's runs in queue one do not count against it in queue two
        assert claim_ids(store, limit=2, queues=["two"]) == ["two:big-0", "two:small-0"]

    def test_priority_orders_a_tenants_own_runs_but_buys_no_larger_share(
        self, store: Store, clock: FakeClock
    ) -> None:
        fill(store, clock, "loud", 5, priority=9)
        store.create_run(new_run("quiet-low", tenant="quiet", queue="q", priority=0))
        clock.advance(1)
        store.create_run(new_run("quiet-high", tenant="quiet", queue="q", priority=1))
        got = claim_ids(store, limit=3)
        assert got == ["loud-0", "quiet-high", "loud-1"]

    def test_every_tenant_gets_its_turn_beyond_the_lane_window(self, store: Store, clock: FakeClock) -> None:
        """More tenants than one claim looks at: successive claims move on,
        so every tenant is served within a bounded number of claims."""
        tenants = [f"t{i:03d}" for i in range(MAX_LANES * 2 + 10)]
        for tenant in tenants:
            fill(store, clock, tenant, 2)
        served: set[str] = set()
        for _ in range(len(tenants) // 5 + 6):
            served.update(run_id.split("-")[0] for run_id in claim_ids(store, limit=10))
        assert served == set(tenants)

    # -- configuration and stats ---------------------------------------------------

    def test_queue_stats(self, store: Store, clock: FakeClock) -> None:
        limits = QueueLimits("q", concurrency=4, tenant_concurrency=2, rate=Rate(100, 60),
                             tenant_rate=Rate(10, 1, burst=3))
        store.set_queue(limits)
        store.set_queue(QueueLimits("idle", concurrency=1))
        fill(store, clock, "t", 3)
        store.create_run(new_run("x", queue="other"))
        assert claim_ids(store, limit=1, queues=["q"]) == ["t-0"]
        assert store.queue_stats() == [
            QueueStats(QueueLimits("idle", concurrency=1), 0, 0),
            QueueStats(QueueLimits("other"), 0, 1),
            QueueStats(limits, 1, 2),
        ]

    def test_stats_forget_finished_runs(self, store: Store, clock: FakeClock) -> None:
        fill(store, clock, "t", 1)
        (c,) = store.claim_runs("w1", [WF], 10, LEASE, 3)
        finish(store, clock, c)
        assert store.queue_stats() == []
        assert store.get_run("t-0").status is RunStatus.COMPLETED  # type: ignore[union-attr]
