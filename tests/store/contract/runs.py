"""Store contract: creating, reading and finishing runs; the shape of the store; updated_at."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cairn.errors import StoreError
from cairn.store.contract import Store
from cairn.store.records import (
    Durability,
    EventType,
    HistoryEvent,
    Payload,
    RunFilter,
    RunRecord,
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


class RunsContract(ContractBase):
    # -- shape ----------------------------------------------------------------

    def test_implements_the_protocol(self, store: Store) -> None:
        assert isinstance(store, Store)
        assert isinstance(store.durability, Durability)

    def test_closed_store_refuses_use(self, store: Store) -> None:
        """Using a closed store is a bug: it must fail loudly, not half-work.
        (The fixture closes it again, so ``close`` must be idempotent.)"""
        store.create_run(new_run("r1"))
        store.close()
        with pytest.raises(StoreError):
            store.get_run("r1")
        with pytest.raises(StoreError):
            store.create_run(new_run("r2"))

    def test_run_counts_group_by_tenant_workflow_and_status(self, store: Store, clock: FakeClock) -> None:
        """What the metrics' runs-by-status gauge reads: every combination
        with runs, none without (an empty store counts nothing)."""
        assert store.run_counts() == []
        store.create_run(new_run("a1", tenant="acme"))
        store.create_run(new_run("a2", tenant="acme"))
        store.create_run(new_run("g1", tenant="globex"))
        finish(store, clock, claim(store, "a2"))
        assert sorted(store.run_counts()) == [("acme", WF, "completed", 1), ("acme", WF, "pending", 1),
                                              ("globex", WF, "pending", 1)]

    # -- creating and reading runs ------------------------------------------------

    def test_create_run_makes_a_pending_run(self, store: Store, clock: FakeClock) -> None:
        spec = new_run(
            "r1",
            tenant="acme",
            thread_id="t1",
            queue="fast",
            priority=7,
            input=Payload(ref="abc"),
            workflow_version="3",
        )
        record, created = store.create_run(spec)
        assert created is True
        expected = RunRecord(
            run_id="r1",
            workflow=WF,
            workflow_version="3",
            tenant="acme",
            thread_id="t1",
            status=RunStatus.PENDING,
            input=Payload(ref="abc"),
            result=None,
            error=None,
            epoch=0,
            owner=None,
            lease_expires_at=None,
            wake_at=None,
            waiting_on=None,
            recoveries=0,
            queue="fast",
            priority=7,
            parent_run_id=None,
            created_at=clock(),
            updated_at=clock(),
        )
        assert record == expected
        assert store.get_run("r1") == expected
        history = store.history("r1")
        assert types(history) == [EventType.RUN_CREATED]
        assert history[0].seq == 1
        assert history[0].at == clock()

    def test_create_run_is_idempotent_on_run_id(self, store: Store, clock: FakeClock) -> None:
        first, created = store.create_run(new_run("r1"))
        clock.advance(5)
        again, created_again = store.create_run(new_run("r1", workflow="other", priority=9))
        assert created is True
        assert created_again is False
        assert again == first
        assert store.get_run("r1") == first
        assert types(store.history("r1")) == [EventType.RUN_CREATED]

    def test_a_run_keeps_the_role_and_token_it_was_started_with(self, store: Store, clock: FakeClock) -> None:
        store.create_run(new_run("r1", started_role="viewer", started_token="t1"))
        claimed = store.create_claimed_run(new_run("r2", started_role="admin"), "w1", LEASE)
        store.create_run(new_run("r3"))
        # a second start of the same id, by a higher role, changes nothing
        store.create_run(new_run("r1", started_role="installation", started_token="t9"))
        assert claimed is not None
        assert store.started_with("r1") == ("viewer", "t1")
        assert store.started_with("r2") == ("admin", None)
        assert store.started_with("r3") == (None, None)
        assert store.started_with("missing") is None
        assert store.history("r1")[0].detail == {"workflow": WF, "version": "1", "tenant": "default",
                                                 "started_role": "viewer", "started_token": "t1"}

    def test_create_run_does_not_disturb_a_running_run(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        record, created = store.create_run(new_run("r1"))
        assert created is False
        assert record == c.run
        assert store.history("r1") == c.history

    def test_create_claimed_run(self, store: Store, clock: FakeClock) -> None:
        c = store.create_claimed_run(new_run("r1", priority=2), "w1", LEASE)
        assert c is not None
        assert c.run.status is RunStatus.RUNNING
        assert c.run.epoch == 1
        assert c.run.owner == "w1"
        assert c.run.lease_expires_at == clock() + LEASE
        assert c.run.recoveries == 0
        assert c.run.priority == 2
        assert c.run.created_at == clock()
        assert types(c.history) == [EventType.RUN_CREATED, EventType.LEASE_CLAIMED, EventType.RUN_STARTED]
        assert [e.seq for e in c.history] == [1, 2, 3]
        assert c.history[1].worker == "w1"
        assert c.history[1].epoch == 1
        assert c.next_seq == 4
        assert store.history("r1") == c.history
        assert store.get_run("r1") == c.run

    def test_create_claimed_run_can_be_written_at_once(self, store: Store, clock: FakeClock) -> None:
        c = store.create_claimed_run(new_run("r1"), "w1", LEASE)
        assert c is not None
        store.append("r1", c.run.epoch, [ev(clock, "r1", c.next_seq, c.run.epoch)])
        finish(store, clock, c, seq=c.next_seq + 1)
        assert store.get_run("r1").status is RunStatus.COMPLETED  # type: ignore[union-attr]

    def test_create_claimed_run_holds_a_live_lease(self, store: Store, clock: FakeClock) -> None:
        assert store.create_claimed_run(new_run("r1"), "w1", LEASE) is not None
        clock.advance(LEASE - 1)
        assert store.claim_runs("w2", [WF], 10, LEASE, 3) == []
        clock.advance(2)
        assert [c.run.run_id for c in store.claim_runs("w2", [WF], 10, LEASE, 3)] == ["r1"]

    @pytest.mark.parametrize("existing", ["pending", "running"])
    def test_create_claimed_run_on_existing_id_changes_nothing(
        self, store: Store, clock: FakeClock, existing: str
    ) -> None:
        store.create_run(new_run("r1"))
        if existing == "running":
            claim(store, "r1", "w1")
        before, history = store.get_run("r1"), store.history("r1")
        clock.advance(1)
        assert store.create_claimed_run(new_run("r1"), "w2", LEASE) is None
        assert store.get_run("r1") == before
        assert store.history("r1") == history

    def test_unknown_run_reads_as_absent(self, store: Store) -> None:
        assert store.get_run("nope") is None
        assert store.history("nope") == []

    def test_list_runs_newest_first(self, store: Store, clock: FakeClock) -> None:
        for rid in ["b", "c", "a"]:
            store.create_run(new_run(rid))
            clock.advance(1)
        assert [r.run_id for r in store.list_runs(RunFilter())] == ["a", "c", "b"]

    def test_list_runs_limit(self, store: Store, clock: FakeClock) -> None:
        for i in range(5):
            store.create_run(new_run(f"r{i}"))
            clock.advance(1)
        assert [r.run_id for r in store.list_runs(RunFilter(limit=2))] == ["r4", "r3"]
        assert len(store.list_runs(RunFilter())) == 5

    @pytest.mark.parametrize(
        ("run_filter", "expected"),
        [
            (RunFilter(tenant="acme"), ["acme2", "acme1"]),
            (RunFilter(workflow="other"), ["other"]),
            (RunFilter(thread_id="t1"), ["thread"]),
            (RunFilter(parent_run_id="acme1"), ["child"]),
            (RunFilter(statuses=(RunStatus.RUNNING,)), ["acme2"]),
            (RunFilter(statuses=(RunStatus.RUNNING, RunStatus.COMPLETED)), ["done", "acme2"]),
            (RunFilter(tenant="acme", statuses=(RunStatus.PENDING,)), ["acme1"]),
            (RunFilter(statuses=(RunStatus.FAILED,)), []),
            # A non-None field always filters: no statuses means no runs.
            (RunFilter(statuses=()), []),
        ],
    )
    def test_list_runs_filters(
        self, store: Store, clock: FakeClock, run_filter: RunFilter, expected: list[str]
    ) -> None:
        specs = [
            new_run("acme1", tenant="acme"),
            new_run("acme2", tenant="acme"),
            new_run("other", workflow="other"),
            new_run("thread", thread_id="t1"),
            new_run("child", parent_run_id="acme1"),
            new_run("done"),
        ]
        for spec in specs:
            store.create_run(spec)
            clock.advance(1)
        claim(store, "acme2")
        finish(store, clock, claim(store, "done"))
        assert [r.run_id for r in store.list_runs(run_filter)] == expected

    def test_history_after_seq_and_limit(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        seq, epoch = c.next_seq, c.run.epoch
        store.append("r1", epoch, [ev(clock, "r1", seq + i, epoch, position=i) for i in range(4)])
        full = store.history("r1")
        assert [e.seq for e in full] == list(range(1, seq + 4))
        assert store.history("r1", after_seq=seq) == full[seq:]
        assert store.history("r1", after_seq=2, limit=2) == full[2:4]
        assert store.history("r1", limit=1) == full[:1]
        assert store.history("r1", after_seq=len(full)) == []
        assert store.history("r1", after_seq=0) == full

    def test_records_and_events_round_trip_exactly(self, store: Store, clock: FakeClock) -> None:
        store.create_run(new_run("r1", input=Payload(data=b"\x00\xffbinary")))
        c = claim(store, "r1")
        step = HistoryEvent(
            run_id="r1",
            seq=c.next_seq,
            event=EventType.STEP_COMPLETED,
            at=clock(),
            epoch=c.run.epoch,
            worker="w1",
            position=0,
            step_kind="llm",
            name="call_model",
            input_hash="deadbeef",
            attempt=2,
            started_at=clock() - 1.5,
            payload=Payload(ref="ref-1"),
            detail={"tokens": 12, "tags": ["a", "b"], "nested": {"x": None}},
        )
        retried = replace(
            step, seq=c.next_seq + 1, event=EventType.STEP_RETRIED, payload=Payload(data=b"err")
        )
        store.append("r1", c.run.epoch, [step, retried])
        assert store.history("r1", after_seq=c.next_seq - 1) == [step, retried]
        done = ev(clock, "r1", c.next_seq + 2, c.run.epoch, EventType.RUN_COMPLETED)
        store.finish_run("r1", c.run.epoch, done, RunStatus.COMPLETED, Payload(ref="result-ref"), None)
        record = store.get_run("r1")
        assert record is not None
        assert record.input == Payload(data=b"\x00\xffbinary")
        assert record.result == Payload(ref="result-ref")
        assert record.error is None

    def test_returned_values_are_copies(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        event = ev(clock, "r1", c.next_seq, c.run.epoch, detail={"k": [1]})
        store.append("r1", c.run.epoch, [event])
        event.detail["k"].append(2)  # type: ignore[index]
        error = {"type": "Boom", "message": "m"}
        failed = ev(clock, "r1", c.next_seq + 1, c.run.epoch, EventType.RUN_FAILED)
        store.finish_run("r1", c.run.epoch, failed, RunStatus.FAILED, None, error)
        error["message"] = "changed by caller"
        got = store.get_run("r1")
        assert got is not None
        assert got.error == {"type": "Boom", "message": "m"}
        got.error["message"] = "changed again"
        store.history("r1")[c.next_seq - 1].detail["k"].append(3)  # type: ignore[index]
        assert store.get_run("r1").error == {"type": "Boom", "message": "m"}  # type: ignore[union-attr]
        assert store.history("r1")[c.next_seq - 1].detail == {"k": [1]}

    # -- finishing ----------------------------------------------------------------

    def test_finish_completed(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        clock.advance(4)
        event = ev(clock, "r1", c.next_seq, c.run.epoch, EventType.RUN_COMPLETED)
        store.finish_run("r1", c.run.epoch, event, RunStatus.COMPLETED, Payload(data=b'"done"'), None)
        record = store.get_run("r1")
        assert record is not None
        assert (record.status, record.result, record.error) == (
            RunStatus.COMPLETED,
            Payload(data=b'"done"'),
            None,
        )
        assert (record.owner, record.lease_expires_at, record.epoch) == (None, None, c.run.epoch)
        assert record.updated_at == clock()
        assert store.history("r1")[-1] == event
        clock.advance(LEASE * 10)
        assert store.claim_runs("w1", [WF], 10, LEASE, 3) == []

    def test_finish_failed(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        error = {"type": "ValueError", "message": "bad", "traceback": ["line 1"]}
        event = ev(clock, "r1", c.next_seq, c.run.epoch, EventType.RUN_FAILED)
        store.finish_run("r1", c.run.epoch, event, RunStatus.FAILED, None, error)
        record = store.get_run("r1")
        assert record is not None
        assert (record.status, record.result, record.error) == (RunStatus.FAILED, None, error)

    @pytest.mark.parametrize("status", [RunStatus.PENDING, RunStatus.CANCELLED, RunStatus.QUARANTINED])
    def test_finish_rejects_other_statuses(self, store: Store, clock: FakeClock, status: RunStatus) -> None:
        c = running(store, clock)
        event = ev(clock, "r1", c.next_seq, c.run.epoch, EventType.RUN_COMPLETED)
        with pytest.raises(ValueError, match="finish_run"):
            store.finish_run("r1", c.run.epoch, event, status, None, None)
        assert store.get_run("r1") == c.run
        assert store.history("r1") == c.history

    # -- updated_at -------------------------------------------------------------------

    def test_updated_at_follows_every_state_change(self, store: Store, clock: FakeClock) -> None:
        created = store.create_run(new_run("r1"))[0].created_at

        def check() -> None:
            record = store.get_run("r1")
            assert record is not None
            assert (record.created_at, record.updated_at) == (created, clock())
            clock.advance(1)

        clock.advance(1)
        c = claim(store, "r1")
        check()
        store.renew_leases("w1", {"r1": c.run.epoch}, LEASE)
        check()
        event = ev(clock, "r1", c.next_seq, c.run.epoch, EventType.RUN_SUSPENDED)
        store.suspend_run("r1", c.run.epoch, event, wake_at=clock(), waiting_on=None)
        check()
        c = claim(store, "r1")
        check()
        store.release_run("r1", c.run.epoch, ev(clock, "r1", c.next_seq, c.run.epoch, EventType.RUN_RELEASED))
        check()
        c = claim(store, "r1")
        check()
        store.reclaim_owned("w1")
        check()
        c = claim(store, "r1")
        check()
        finish(store, clock, c, RunStatus.FAILED)
        check()
        store.retry_run("r1")
        check()
        store.cancel_run("r1", "done")
        check()
