"""The run state machine without a database: each transition of
``cairn.store.lifecycle`` from the rows it reads to what a backend applies
(the row update, the entries, or the error)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from cairn.errors import InvalidRunState, RunNotFound
from cairn.store import lifecycle as lc
from cairn.store.records import EventType, NewRun, Payload, RunRecord, RunStatus

NOW = 1000.0


def record(status: RunStatus, epoch: int = 3, **changes: object) -> RunRecord:
    base = RunRecord(
        run_id="r", workflow="wf", workflow_version="1", tenant="t", thread_id=None, status=status,
        input=Payload(b"x"), result=None, error=None, epoch=epoch, owner=None, lease_expires_at=None,
        wake_at=None, waiting_on=None, recoveries=0, queue="default", priority=0, parent_run_id=None,
        created_at=0.0, updated_at=0.0,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_create_and_create_claimed_histories() -> None:
    run = NewRun("r", "wf", "1", "t", None, Payload(b"x"), parent_run_id="p")
    first = lc.create(run, NOW)
    assert (first.seq, first.event, first.epoch) == (1, EventType.RUN_CREATED, 0)
    assert first.detail == {"workflow": "wf", "version": "1", "tenant": "t", "parent_run_id": "p"}
    claimed = lc.create_claimed(run, "w", NOW, 30)
    assert [(e.seq, e.event, e.epoch, e.worker) for e in claimed] == [
        (1, EventType.RUN_CREATED, 1, None), (2, EventType.LEASE_CLAIMED, 1, "w"),
        (3, EventType.RUN_STARTED, 1, "w")]
    assert claimed[1].detail == {"lease_until": NOW + 30}


@pytest.mark.parametrize(
    ("status", "epoch", "follow"),
    [(RunStatus.PENDING, 0, [EventType.RUN_STARTED]), (RunStatus.PENDING, 2, []),
     (RunStatus.SUSPENDED, 2, [EventType.RUN_WOKEN])],
)
def test_claim_of_a_waiting_run(status: RunStatus, epoch: int, follow: list[EventType]) -> None:
    outcome = lc.claim(lc.ClaimState("r", status, None, epoch, 1), 7, "w", NOW, 30, 5)
    assert outcome.claimed
    assert outcome.epoch == epoch + 1
    assert outcome.recoveries == 1
    assert [e.event for e in outcome.entries] == [EventType.LEASE_CLAIMED, *follow]
    assert [e.seq for e in outcome.entries] == list(range(8, 8 + len(outcome.entries)))
    assert all(e.epoch == epoch + 1 and e.worker == "w" for e in outcome.entries)
    assert outcome.entries[0].detail == {"lease_until": NOW + 30}


def test_takeover_names_the_old_holder_and_counts_a_recovery() -> None:
    outcome = lc.claim(lc.ClaimState("r", RunStatus.RUNNING, "dead", 4, 1), 9, "w", NOW, 30, 5)
    assert outcome.claimed
    assert outcome.recoveries == 2
    assert outcome.epoch == 5
    lost, taken = outcome.entries
    assert (lost.seq, lost.event, lost.epoch, lost.worker) == (10, EventType.LEASE_LOST, 4, "dead")
    assert lost.detail == {"worker": "dead", "epoch": 4, "reason": "expired"}
    assert (taken.seq, taken.event, taken.epoch, taken.worker) == (11, EventType.LEASE_TAKEN_OVER, 5, "w")
    assert taken.detail == {"from_worker": "dead", "lease_until": NOW + 30}


def test_takeover_past_the_recovery_limit_quarantines() -> None:
    outcome = lc.claim(lc.ClaimState("r", RunStatus.RUNNING, "dead", 4, 2), 9, "w", NOW, 30, 2)
    assert not outcome.claimed
    assert outcome.quarantine == lc.RunUpdate(
        "quarantine", "r", NOW, 5, error={"type": "Quarantined",
                                          "message": "run lost its worker 3 times (limit 2)"}, recoveries=3)
    assert [(e.event, e.epoch, e.worker) for e in outcome.entries] == [
        (EventType.LEASE_LOST, 4, "dead"), (EventType.RUN_QUARANTINED, 5, None)]


@pytest.mark.parametrize(
    ("status", "wake_at", "waiting_on", "child", "expected"),
    [
        (RunStatus.SUSPENDED, 50.0, None, None, 50.0),  # a timer
        (RunStatus.SUSPENDED, None, None, None, None),  # a budget suspension: until set_budget
        (RunStatus.SUSPENDED, None, "c", "running", None),  # the child wakes it when it ends
        (RunStatus.SUSPENDED, None, "c", "completed", NOW),  # the child ended already: at once
        (RunStatus.SUSPENDED, None, "c", "killed", NOW),
        (RunStatus.SUSPENDED, None, "c", None, None),
        (RunStatus.NEEDS_ATTENTION, 50.0, "c", "completed", None),  # only an operator
    ],
)
def test_suspended_runnable_at(
    status: RunStatus, wake_at: float | None, waiting_on: str | None, child: str | None,
    expected: float | None,
) -> None:
    assert lc.suspended_runnable_at(status, wake_at, waiting_on, child, NOW) == expected


def test_suspend_and_finish_refuse_other_statuses() -> None:
    with pytest.raises(ValueError, match="suspended or needs_attention"):
        lc.check_suspend_status(RunStatus.PENDING)
    with pytest.raises(ValueError, match="completed or failed"):
        lc.check_finish_status(RunStatus.CANCELLED)
    lc.check_suspend_status(RunStatus.NEEDS_ATTENTION)
    lc.check_finish_status(RunStatus.FAILED)


def test_halt_is_fenced_on_the_holders_epoch() -> None:
    expected = lc.RunUpdate("halt", "r", NOW, 5, error={"type": "X"}, fence=4)
    assert lc.halt("r", 4, {"type": "X"}, NOW) == expected


def test_cancel_bumps_each_live_run_and_wakes_parents() -> None:
    transitions = lc.cancel(record(RunStatus.RUNNING), "r", [("r", 3), ("c", 0)], "stop", NOW, actor="cli:me")
    assert [(t.update.statement, t.update.run_id, t.update.epoch) for t in transitions] == [
        ("cancel", "r", 4), ("cancel", "c", 1)]
    assert all(t.wakes_parent for t in transitions)
    assert transitions[0].update.error == {"type": "Cancelled", "message": "stop"}
    (entry,) = transitions[1].entries
    assert (entry.event, entry.epoch, entry.seq) == (EventType.RUN_CANCELLED, 1, 0)
    assert entry.detail == {"reason": "stop", "actor": "cli:me"}


def test_cancel_of_a_terminal_run_changes_nothing_and_of_a_missing_one_raises() -> None:
    assert lc.cancel(record(RunStatus.COMPLETED), "r", [], "stop", NOW) == []
    with pytest.raises(RunNotFound):
        lc.cancel(None, "r", [], "stop", NOW)


def test_kill() -> None:
    (t,) = lc.kill(record(RunStatus.SUSPENDED), "r", [("r", 3)], "halt!", NOW)
    assert (t.update.statement, t.update.epoch, t.update.error) == ("kill", 4, {"type": "Killed",
                                                                               "message": "halt!"})
    assert t.entries[0].detail == {"reason": "halt!"}  # no actor given: none recorded
    assert lc.kill(None, None, [("a", 0)], "tenant", NOW)[0].update.run_id == "a"  # by tenant
    with pytest.raises(RunNotFound):
        lc.kill(None, "r", [], "x", NOW)
    with pytest.raises(ValueError, match="exactly one"):
        lc.check_kill_target("r", "t")
    with pytest.raises(ValueError, match="exactly one"):
        lc.check_kill_target(None, None)


@pytest.mark.parametrize("status", [RunStatus.FAILED, RunStatus.QUARANTINED])
def test_retry(status: RunStatus) -> None:
    t = lc.retry(record(status), "r", 4, NOW, actor="app")
    assert (t.update.statement, t.update.epoch) == ("retry", 4)
    (entry,) = t.entries
    assert (entry.event, entry.epoch) == (EventType.RUN_RETRIED, 4)
    assert entry.detail == {"from_position": 4, "previous_status": status.value, "actor": "app"}


RETRYABLE = (RunStatus.FAILED, RunStatus.QUARANTINED, RunStatus.INCOMPATIBLE)


@pytest.mark.parametrize("status", [s for s in RunStatus if s not in RETRYABLE])
def test_retry_refuses(status: RunStatus) -> None:
    with pytest.raises(InvalidRunState, match=f"is {status.value}; only failed or quarantined"):
        lc.retry(record(status), "r", None, NOW)


def test_retry_and_revive_of_a_missing_run() -> None:
    with pytest.raises(RunNotFound):
        lc.retry(None, "r", None, NOW)
    with pytest.raises(RunNotFound):
        lc.revive(None, "r", NOW)


@pytest.mark.parametrize("status", list(RunStatus))
def test_revive(status: RunStatus) -> None:
    if status not in (RunStatus.KILLED, RunStatus.HALTED):
        with pytest.raises(InvalidRunState, match="only killed or halted runs can be revived"):
            lc.revive(record(status), "r", NOW)
        return
    t = lc.revive(record(status), "r", NOW, actor="cli:op")
    assert (t.update.statement, t.update.epoch) == ("reopen", 4)
    assert t.entries[0].event is EventType.RUN_REVIVED
    assert t.entries[0].detail == {"previous_status": status.value, "actor": "cli:op"}


def test_set_budget_keeps_the_epoch_and_refuses_a_running_run() -> None:
    t = lc.set_budget(record(RunStatus.SUSPENDED), "r", {"usd": 5}, NOW, actor="app")
    assert (t.update.statement, t.update.epoch, t.update.budget) == ("set_budget", 3, {"usd": 5})
    assert t.entries[0].event is EventType.RUN_BUDGET_CHANGED
    assert t.entries[0].epoch == 3
    assert t.entries[0].detail == {"budget": {"usd": 5}, "actor": "app"}
    with pytest.raises(InvalidRunState, match="is running; change its budget once it is suspended"):
        lc.set_budget(record(RunStatus.RUNNING), "r", {}, NOW)
    with pytest.raises(RunNotFound):
        lc.set_budget(None, "r", {}, NOW)
    for finished in (RunStatus.COMPLETED, RunStatus.CANCELLED):
        with pytest.raises(InvalidRunState, match=f"is {finished.value} and will not run again"):
            lc.set_budget(record(finished), "r", {}, NOW)


def test_resolve_operation_done_records_the_result() -> None:
    t = lc.resolve_operation(record(RunStatus.NEEDS_ATTENTION), "r", 7, True, Payload(b"r"),
                             {"name": "pay", "note": "checked"}, NOW, actor="cli:op")
    assert (t.update.statement, t.update.epoch) == ("reopen", 4)
    (entry,) = t.entries
    assert (entry.event, entry.position, entry.step_kind, entry.name, entry.payload, entry.epoch) == (
        EventType.STEP_COMPLETED, 7, "tool", "pay", Payload(b"r"), 4)
    assert entry.detail == {"resolved_by": "operator", "name": "pay", "note": "checked", "actor": "cli:op"}


def test_resolve_operation_not_done_asks_for_another_attempt() -> None:
    t = lc.resolve_operation(record(RunStatus.NEEDS_ATTENTION), "r", 7, False, None,
                             {"step_kind": "model"}, NOW)
    (entry,) = t.entries
    assert (entry.event, entry.step_kind, entry.payload) == (EventType.OP_RESOLVED, "model", None)
    assert entry.detail == {"position": 7, "done": False, "step_kind": "model"}


def test_resolve_operation_refusals() -> None:
    with pytest.raises(InvalidRunState, match="only runs that need attention"):
        lc.resolve_operation(record(RunStatus.SUSPENDED), "r", 1, True, None, {}, NOW)
    with pytest.raises(RunNotFound):
        lc.resolve_operation(None, "r", 1, True, None, {}, NOW)


def test_prune_selection() -> None:
    assert lc.prune_statuses(None) == set(lc.DEFAULT_PRUNE_STATUSES)
    with pytest.raises(ValueError, match="not running"):
        lc.prune_statuses([RunStatus.RUNNING])
    with pytest.raises(ValueError, match="at least 1"):
        lc.check_prune_limit(0)
    trees = {
        "a": [("a", "completed", 1.0)],
        "b": [("b", "completed", 1.0), ("b1", "running", 1.0)],  # a live member spares the tree
        "c": [("c", "failed", 1.0), ("c1", "cancelled", 2.0)],
        "d": [("d", "completed", 99.0)],  # too recent
        "e": [("e", "completed", 1.0)],
    }
    chosen: list[str] = []
    full = lc.choose_trees(list(trees), trees, lc.prune_statuses(None), 10.0, 3, chosen)
    assert (full, chosen) == (True, ["a", "c", "c1"])
    chosen = []
    assert lc.choose_trees(["c"], trees, lc.prune_statuses(None), 10.0, 1, chosen)  # the first tree always
    assert chosen == ["c", "c1"]


def test_select_prunable_walks_pages_of_roots_until_the_batch_is_full() -> None:
    roots = [(f"r{i}", float(i)) for i in range(150)]  # oldest first, as the dialects read them
    pages: list[tuple[float | None, str, int]] = []

    def roots_after(at: float | None, run_id: str, page: int) -> list[tuple[str, float]]:
        pages.append((at, run_id, page))
        start = 0 if at is None else next(i for i, r in enumerate(roots) if r == (run_id, at)) + 1
        return roots[start:start + page]

    def trees_of(ids: Sequence[str]) -> dict[str, list[tuple[str, str, float]]]:
        return {rid: [(rid, "running" if rid == "r1" else "completed", 0.0)] for rid in ids}

    taken, chosen = lc.select_prunable(roots_after, trees_of, lc.prune_statuses(None), 10.0, 70)
    assert lc.prune_page_size(70) == 70
    assert chosen == [f"r{i}" for i in range(71) if i != 1]  # r1's tree is live; 70 runs in all
    assert taken == chosen
    assert pages == [(None, "", 70), (69.0, "r69", 70)]
