"""Store contract: retention: pruning finished trees and collecting their artifacts."""

from __future__ import annotations

import pytest

from cairn.errors import PayloadError
from cairn.store.contract import ARTIFACT_GRACE_SECONDS, DEFAULT_PRUNE_STATUSES, Store
from cairn.store.records import (
    EventType,
    Payload,
    RunFilter,
    RunStatus,
)
from tests.store.contract.helpers import (
    LEASE,
    ContractBase,
    FakeClock,
    claim,
    ev,
    family,
    finish,
    new_run,
    put_in_state,
    running,
    types,
)


class PruneContract(ContractBase):
    # -- retention ----------------------------------------------------------------------

    def test_prune_deletes_old_finished_runs_with_their_history(self, store: Store, clock: FakeClock) -> None:
        for state in ("completed", "failed", "cancelled"):
            put_in_state(store, clock, state, state)
        clock.advance(100)
        put_in_state(store, clock, "recent", "completed")
        clock.advance(100)
        assert store.prune_runs(clock() - 150) == 3
        for run_id in ("completed", "failed", "cancelled"):
            assert store.get_run(run_id) is None
            assert store.history(run_id) == []
        assert [r.run_id for r in store.list_runs(RunFilter())] == ["recent"]
        assert types(store.history("recent"))[-1] is EventType.RUN_COMPLETED
        assert store.prune_runs(clock() - 150) == 0
        assert store.prune_runs(clock()) == 1
        assert store.list_runs(RunFilter()) == []

    def test_prune_cutoff_is_strictly_older(self, store: Store, clock: FakeClock) -> None:
        put_in_state(store, clock, "r1", "completed")
        record = store.get_run("r1")
        assert record is not None
        assert store.prune_runs(record.updated_at) == 0
        assert store.prune_runs(record.updated_at + 0.5) == 1

    def test_prune_by_default_takes_completed_failed_and_cancelled(self, store: Store) -> None:
        assert set(DEFAULT_PRUNE_STATUSES) == {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED}

    @pytest.mark.parametrize(
        "state", ["pending", "running", "suspended", "budget-suspended", "needs_attention"]
    )
    def test_prune_never_deletes_a_live_run(self, store: Store, clock: FakeClock, state: str) -> None:
        put_in_state(store, clock, "r1", state)
        before = store.history("r1")
        clock.advance(10 * LEASE)  # a running run's lease has long expired: still not prunable
        every_terminal = [s for s in RunStatus if s.terminal]
        assert store.prune_runs(clock() + 1, every_terminal) == 0
        assert store.get_run("r1") is not None
        assert store.history("r1") == before

    @pytest.mark.parametrize("state", ["quarantined", "killed", "halted"])
    def test_prune_keeps_runs_awaiting_an_operator_unless_named(
        self, store: Store, clock: FakeClock, state: str
    ) -> None:
        put_in_state(store, clock, "r1", state)
        clock.advance(10)
        assert store.prune_runs(clock()) == 0
        assert store.get_run("r1") is not None
        assert store.prune_runs(clock(), [RunStatus(state)]) == 1
        assert store.get_run("r1") is None

    def test_prune_only_the_statuses_asked_for(self, store: Store, clock: FakeClock) -> None:
        put_in_state(store, clock, "c", "completed")
        put_in_state(store, clock, "f", "failed")
        clock.advance(1)
        assert store.prune_runs(clock(), [RunStatus.COMPLETED]) == 1
        assert store.get_run("c") is None
        assert store.get_run("f") is not None

    @pytest.mark.parametrize("status", [s for s in RunStatus if not s.terminal])
    def test_prune_refuses_live_statuses(self, store: Store, clock: FakeClock, status: RunStatus) -> None:
        put_in_state(store, clock, "r1", "completed")
        clock.advance(1)
        with pytest.raises(ValueError, match=status.value):
            store.prune_runs(clock(), [RunStatus.COMPLETED, status])
        assert store.get_run("r1") is not None

    @pytest.mark.parametrize("limit", [0, -1])
    def test_prune_refuses_a_limit_below_one(self, store: Store, clock: FakeClock, limit: int) -> None:
        put_in_state(store, clock, "r1", "completed")
        clock.advance(1)
        with pytest.raises(ValueError, match="limit"):
            store.prune_runs(clock(), limit=limit)
        assert store.get_run("r1") is not None

    def test_prune_takes_a_finished_tree_whole(self, store: Store, clock: FakeClock) -> None:
        family(store, clock, "p")
        clock.advance(1)
        assert store.prune_runs(clock()) == 3
        for run_id in ("p", "p.k", "p.g"):
            assert store.get_run(run_id) is None
            assert store.history(run_id) == []

    def test_prune_spares_a_finished_child_of_a_live_parent(self, store: Store, clock: FakeClock) -> None:
        p = running(store, clock, "p")
        store.start_child("p", p.run.epoch, ev(clock, "p", p.next_seq, p.run.epoch), new_run("kid"))
        finish(store, clock, claim(store, "kid"))
        clock.advance(1000)
        assert store.prune_runs(clock()) == 0
        assert store.get_run("kid") is not None
        assert len(store.history("kid")) > 1
        finish(store, clock, p, seq=p.next_seq + 1)
        clock.advance(1)
        assert store.prune_runs(clock()) == 2
        assert store.get_run("kid") is None

    def test_prune_spares_a_finished_parent_of_a_live_child(self, store: Store, clock: FakeClock) -> None:
        """The parent completed without waiting for its child: the child is
        still pending, so the tree stays whole until it ends too."""
        p = running(store, clock, "p")
        store.start_child("p", p.run.epoch, ev(clock, "p", p.next_seq, p.run.epoch), new_run("kid"))
        finish(store, clock, p, seq=p.next_seq + 1)
        clock.advance(1000)
        assert store.prune_runs(clock()) == 0
        assert store.get_run("p") is not None
        store.cancel_run("kid", "not needed")
        clock.advance(1)
        assert store.prune_runs(clock()) == 2
        assert store.get_run("p") is None
        assert store.get_run("kid") is None

    def test_prune_spares_a_tree_with_a_recent_member(self, store: Store, clock: FakeClock) -> None:
        family(store, clock, "p", kid_status=RunStatus.FAILED)
        clock.advance(100)
        store.set_budget("p.k", {"max_tokens": 1})  # a change to a finished run: it is recent again
        clock.advance(10)
        assert store.prune_runs(clock() - 50) == 0
        assert store.get_run("p") is not None
        assert store.prune_runs(clock()) == 3

    def test_prune_spares_a_tree_with_a_member_of_another_status(
        self, store: Store, clock: FakeClock
    ) -> None:
        family(store, clock, "p", kid_status=RunStatus.FAILED)
        clock.advance(1)
        assert store.prune_runs(clock(), [RunStatus.COMPLETED]) == 0
        assert store.get_run("p.g") is not None
        assert store.prune_runs(clock(), [RunStatus.COMPLETED, RunStatus.FAILED]) == 3

    def test_prune_treats_a_run_whose_parent_is_gone_as_a_root(self, store: Store, clock: FakeClock) -> None:
        store.create_run(new_run("orphan", parent_run_id="ghost"))
        store.cancel_run("orphan", "x")
        clock.advance(1)
        assert store.prune_runs(clock()) == 1
        assert store.get_run("orphan") is None

    def test_prune_in_batches_oldest_first(self, store: Store, clock: FakeClock) -> None:
        for i in range(7):
            put_in_state(store, clock, f"r{i}", "completed")
            clock.advance(1)
        assert store.prune_runs(clock(), limit=3, dry_run=True) == 3
        assert store.prune_runs(clock(), limit=3) == 3
        assert sorted(r.run_id for r in store.list_runs(RunFilter())) == ["r3", "r4", "r5", "r6"]
        assert store.prune_runs(clock(), limit=3) == 3
        assert store.prune_runs(clock(), limit=3) == 1
        assert store.prune_runs(clock(), limit=3) == 0
        assert store.list_runs(RunFilter()) == []

    def test_prune_batches_never_split_a_tree(self, store: Store, clock: FakeClock) -> None:
        put_in_state(store, clock, "single", "completed")
        clock.advance(1)
        family(store, clock, "p")
        clock.advance(1)
        put_in_state(store, clock, "last", "completed")
        clock.advance(1)
        # The tree (3 runs) does not fit after the single run: the batch stops.
        assert store.prune_runs(clock(), limit=2) == 1
        assert store.get_run("p") is not None
        # A tree larger than the limit is still taken whole when it comes first.
        assert store.prune_runs(clock(), limit=2) == 3
        assert store.get_run("p.g") is None
        assert store.get_run("last") is not None
        assert store.prune_runs(clock(), limit=2) == 1

    def test_prune_dry_run_changes_nothing(self, store: Store, clock: FakeClock) -> None:
        ref = store.put_artifact(b"input" * 100)
        store.create_run(new_run("r1", input=Payload(ref=ref)))
        store.cancel_run("r1", "x")
        clock.advance(1)
        family(store, clock, "p")
        clock.advance(2 * ARTIFACT_GRACE_SECONDS)
        before = {rid: store.history(rid) for rid in ("r1", "p", "p.k", "p.g")}
        assert store.prune_runs(clock(), dry_run=True) == 4
        assert store.prune_runs(clock(), limit=1, dry_run=True) == 1
        assert {rid: store.history(rid) for rid in before} == before
        assert store.get_artifact(ref) == b"input" * 100
        assert store.prune_runs(clock()) == 4

    def test_a_pruned_run_id_can_be_used_again(self, store: Store, clock: FakeClock) -> None:
        put_in_state(store, clock, "r1", "completed")
        clock.advance(1)
        assert store.prune_runs(clock()) == 1
        record, created = store.create_run(new_run("r1", workflow_version="2"))
        assert created
        assert record.workflow_version == "2"
        assert types(store.history("r1")) == [EventType.RUN_CREATED]

    def test_prune_deletes_artifacts_only_pruned_runs_referenced(
        self, store: Store, clock: FakeClock
    ) -> None:
        mine = store.put_artifact(b"only the old run's input")
        shared = store.put_artifact(b"a step result two runs share")
        result = store.put_artifact(b"the old run's result")
        store.create_run(new_run("old", input=Payload(ref=mine)))
        c = claim(store, "old")
        e, s = c.run.epoch, c.next_seq
        store.append("old", e, [ev(clock, "old", s, e, payload=Payload(ref=shared))])
        done = ev(clock, "old", s + 1, e, EventType.RUN_COMPLETED)
        store.finish_run("old", e, done, RunStatus.COMPLETED, Payload(ref=result), None)
        store.create_run(new_run("live", input=Payload(ref=shared)))
        clock.advance(2 * ARTIFACT_GRACE_SECONDS)
        assert store.prune_runs(clock()) == 1
        for ref in (mine, result):
            with pytest.raises(PayloadError):
                store.get_artifact(ref)
        assert store.get_artifact(shared) == b"a step result two runs share"
        store.cancel_run("live", "x")
        clock.advance(1)
        assert store.prune_runs(clock()) == 1
        with pytest.raises(PayloadError):
            store.get_artifact(shared)

    def test_prune_collects_an_artifact_nothing_ever_referenced(self, store: Store, clock: FakeClock) -> None:
        """Its writer died between storing it and recording the entry that
        would point to it: once the grace period is over, pruning deletes it,
        with or without runs to prune."""
        orphan = store.put_artifact(b"stored, never referenced")
        kept = store.put_artifact(b"the input of a live run")
        store.create_run(new_run("live", input=Payload(ref=kept)))
        clock.advance(ARTIFACT_GRACE_SECONDS - 1)
        assert store.prune_runs(clock()) == 0
        assert store.get_artifact(orphan) == b"stored, never referenced"  # its writer may be alive
        clock.advance(2)
        assert store.prune_runs(clock()) == 0
        with pytest.raises(PayloadError):
            store.get_artifact(orphan)
        assert store.get_artifact(kept) == b"the input of a live run"
        clock.advance(10 * ARTIFACT_GRACE_SECONDS)
        assert store.prune_runs(clock()) == 0
        assert store.get_artifact(kept) == b"the input of a live run"

    def test_prune_keeps_artifacts_stored_within_the_grace_period(
        self, store: Store, clock: FakeClock
    ) -> None:
        """A cutoff of "now" prunes a run at once, but its artifact was stored
        only a minute ago: it waits in the queue until the grace period ends."""
        ref = store.put_artifact(b"fresh")
        store.create_run(new_run("r1", input=Payload(ref=ref)))
        store.cancel_run("r1", "x")
        clock.advance(60)
        assert store.prune_runs(clock()) == 1
        assert store.get_artifact(ref) == b"fresh"
        clock.advance(ARTIFACT_GRACE_SECONDS - 61)
        assert store.prune_runs(clock()) == 0
        assert store.get_artifact(ref) == b"fresh"
        clock.advance(2)
        assert store.prune_runs(clock()) == 0
        with pytest.raises(PayloadError):
            store.get_artifact(ref)

    def test_prune_keeps_an_artifact_stored_again_recently(self, store: Store, clock: FakeClock) -> None:
        """A writer storing the same bytes is about to reference them: the
        artifact stays for the grace period, and a later call collects it."""
        ref = store.put_artifact(b"big")
        store.create_run(new_run("old", input=Payload(ref=ref)))
        store.cancel_run("old", "x")
        clock.advance(2 * ARTIFACT_GRACE_SECONDS)
        assert store.put_artifact(b"big") == ref
        assert store.prune_runs(clock()) == 1
        assert store.get_artifact(ref) == b"big"
        clock.advance(ARTIFACT_GRACE_SECONDS + 1)
        assert store.prune_runs(clock()) == 0  # no run left to prune; the queued artifact is collected
        with pytest.raises(PayloadError):
            store.get_artifact(ref)

    def test_prune_keeps_an_artifact_referenced_again(self, store: Store, clock: FakeClock) -> None:
        ref = store.put_artifact(b"big")
        store.create_run(new_run("old", input=Payload(ref=ref)))
        store.cancel_run("old", "x")
        clock.advance(2 * ARTIFACT_GRACE_SECONDS)
        store.put_artifact(b"big")
        store.create_run(new_run("new", input=Payload(ref=ref)))
        assert store.prune_runs(clock()) == 1
        clock.advance(2 * ARTIFACT_GRACE_SECONDS)
        assert store.prune_runs(clock()) == 0
        assert store.get_artifact(ref) == b"big"

    def test_prune_keeps_an_artifact_stored_after_the_cutoff(self, store: Store, clock: FakeClock) -> None:
        """Stored again after ``older_than`` (even long ago): kept, since the
        caller asked to prune only what is older than that."""
        ref = store.put_artifact(b"big")
        store.create_run(new_run("old", input=Payload(ref=ref)))
        store.cancel_run("old", "x")
        cutoff = clock() + 1
        clock.advance(5 * ARTIFACT_GRACE_SECONDS)
        store.put_artifact(b"big")
        clock.advance(5 * ARTIFACT_GRACE_SECONDS)
        assert store.prune_runs(cutoff) == 1
        assert store.get_artifact(ref) == b"big"
        assert store.prune_runs(clock()) == 0
        with pytest.raises(PayloadError):
            store.get_artifact(ref)
