"""Store contract: invariants across everything: gap-free histories through whole lives."""

from __future__ import annotations

from cairn.store.contract import Store
from cairn.store.records import (
    EventType,
    Payload,
    RunStatus,
)
from tests.store.contract.helpers import (
    LEASE,
    ContractBase,
    FakeClock,
    assert_gap_free,
    claim,
    ev,
    finish,
    halt,
    intent,
    new_run,
    park,
    running,
    types,
)


class InvariantsContract(ContractBase):
    # -- invariants across everything -------------------------------------------------

    def test_history_is_gap_free_across_a_whole_life(self, store: Store, clock: FakeClock) -> None:
        """Drive one run through every kind of write and check the history
        stays one gap-free sequence with epochs and times never going back."""
        c = running(store, clock, "r1")  # create + claim
        e, s = c.run.epoch, c.next_seq
        store.append("r1", e, [ev(clock, "r1", s, e, position=0)])
        store.suspend_run("r1", e, ev(clock, "r1", s + 1, e, EventType.RUN_SUSPENDED), clock() + 5, None)
        clock.advance(5)
        c = claim(store, "r1")  # woken
        e, s = c.run.epoch, c.next_seq
        store.start_child("r1", e, ev(clock, "r1", s, e, position=1), new_run("kid"))
        store.suspend_run("r1", e, ev(clock, "r1", s + 1, e, EventType.RUN_SUSPENDED), None, "kid")
        clock.advance(1)
        k = claim(store, "kid", "w2")
        store.append("kid", k.run.epoch, [ev(clock, "kid", k.next_seq, k.run.epoch, worker="w2")])
        finish(store, clock, k, seq=k.next_seq + 1)
        c = claim(store, "r1")
        clock.advance(LEASE + 1)
        c = claim(store, "r1", "w2")  # takeover
        e, s = c.run.epoch, c.next_seq
        store.release_run("r1", e, ev(clock, "r1", s, e, EventType.RUN_RELEASED, worker="w2"))
        c = claim(store, "r1", "w3")
        e, s = c.run.epoch, c.next_seq
        store.append("r1", e, [ev(clock, "r1", s, e, EventType.STEP_FAILED, position=2, worker="w3")])
        finish(store, clock, c, RunStatus.FAILED, seq=s + 1)
        clock.advance(1)
        store.retry_run("r1")
        c = claim(store, "r1", "w3")
        store.renew_leases("w3", {"r1": c.run.epoch}, LEASE)
        store.reclaim_owned("w3")
        clock.advance(1)
        c = claim(store, "r1", "w3")  # takeover of a dead incarnation
        store.cancel_run("r1", "enough")
        history = store.history("r1")
        assert_gap_free(history, "r1")
        times = [h.at for h in history]
        assert times == sorted(times)
        assert types(history).count(EventType.RUN_CREATED) == 1
        assert types(history).count(EventType.RUN_STARTED) == 1
        assert history[-1].event is EventType.RUN_CANCELLED
        assert_gap_free(store.history("kid"), "kid")
        for claim_seen in (c.history,):
            assert claim_seen == history[: len(claim_seen)]

    def test_history_is_gap_free_through_operator_actions(self, store: Store, clock: FakeClock) -> None:
        """The exactly-once machinery (barrier, needs_attention, resolution,
        budgets, halt, kill, revive) keeps one gap-free history, epochs never
        going back, and stamps ``updated_at`` on every change."""
        created = store.create_run(new_run("r1", budget={"max_tokens": 10}))[0].created_at

        def check(status: RunStatus) -> None:
            record = store.get_run("r1")
            assert record is not None
            assert (record.status, record.created_at, record.updated_at) == (status, created, clock())
            clock.advance(1)

        clock.advance(1)
        c = claim(store, "r1")
        e, s = c.run.epoch, c.next_seq
        store.append("r1", e, [intent(clock, "r1", s, e)], barrier=True)
        park(store, clock, c, RunStatus.NEEDS_ATTENTION, seq=s + 1)
        check(RunStatus.NEEDS_ATTENTION)
        store.resolve_operation("r1", 0, True, Payload(data=b"1"), {})
        check(RunStatus.PENDING)
        c = claim(store, "r1")
        park(store, clock, c)
        check(RunStatus.SUSPENDED)
        store.set_budget("r1", {"max_tokens": 20})
        check(RunStatus.SUSPENDED)
        c = claim(store, "r1")
        e, s = c.run.epoch, c.next_seq
        store.append("r1", e, [intent(clock, "r1", s, e, position=1)], barrier=True)
        park(store, clock, c, RunStatus.NEEDS_ATTENTION, seq=s + 1)
        store.resolve_operation("r1", 1, False, None, {"note": "retry it"})
        c = claim(store, "r1")
        halt(store, clock, c)
        check(RunStatus.HALTED)
        store.revive_run("r1")
        check(RunStatus.PENDING)
        claim(store, "r1")
        store.kill_runs("stop", tenant="default")
        check(RunStatus.KILLED)
        store.revive_run("r1")
        check(RunStatus.PENDING)
        store.kill_runs("stop again", run_id="r1")
        check(RunStatus.KILLED)
        history = store.history("r1")
        assert_gap_free(history, "r1")
        times = [h.at for h in history]
        assert times == sorted(times)
        assert types(history).count(EventType.RUN_REVIVED) == 2
        assert types(history).count(EventType.OP_INTENT) == 2
        epochs = [h.epoch for h in history]
        assert epochs[-1] == store.get_run("r1").epoch  # type: ignore[union-attr]
