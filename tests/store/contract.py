"""The store contract suite: every backend must pass all of it.

A backend's test module subclasses ``StoreContract`` and provides two
fixtures: ``clock`` (a ``FakeClock``) and ``store`` (a fresh, empty store
built with that clock). The tests speak only through the ``Store`` protocol,
so they pin the documented domain rules, never one backend's internals.

Time never passes by itself here: tests move ``clock`` explicitly, which makes
lease expiry and timers deterministic.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from cairn.errors import InvalidRunState, LeaseLost, PayloadError, RunNotFound, StoreError
from cairn.store.contract import ARTIFACT_GRACE_SECONDS, DEFAULT_PRUNE_STATUSES, Store
from cairn.store.records import (
    Claim,
    Durability,
    EventType,
    HistoryEvent,
    NewRun,
    Payload,
    RunFilter,
    RunRecord,
    RunStatus,
)

LEASE = 30.0
WF = "wf"


class FakeClock:
    """A clock that moves only when told to: ``clock()`` reads ``now``."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# -- helpers ------------------------------------------------------------------------


def new_run(run_id: str, **overrides: Any) -> NewRun:
    fields: dict[str, Any] = {
        "run_id": run_id,
        "workflow": WF,
        "workflow_version": "1",
        "tenant": "default",
        "thread_id": None,
        "input": Payload(data=b"[]"),
    }
    fields.update(overrides)
    return NewRun(**fields)


def ev(
    clock: FakeClock,
    run_id: str,
    seq: int,
    epoch: int,
    event: EventType = EventType.STEP_COMPLETED,
    *,
    worker: str = "w1",
    position: int | None = 0,
    **extra: Any,
) -> HistoryEvent:
    """An entry as a lease holder would write it. Lifecycle entries (anything
    but ``step.*``) carry no journal fields."""
    if event.value.startswith("step."):
        journal: dict[str, Any] = {
            "position": position,
            "step_kind": "step",
            "name": "s",
            "payload": Payload(data=b"1"),
        }
    else:
        journal = {}
    journal.update(extra)
    return HistoryEvent(
        run_id=run_id, seq=seq, event=event, at=clock(), epoch=epoch, worker=worker, **journal
    )


def claim(
    store: Store,
    run_id: str,
    worker: str = "w1",
    lease: float = LEASE,
    max_recoveries: int = 3,
) -> Claim:
    got = store.claim_run(run_id, worker, lease, max_recoveries)
    assert got is not None, f"{run_id} should be claimable"
    return got


def claimable_ids(store: Store, worker: str = "probe", max_recoveries: int = 100) -> set[str]:
    """Which runs a claim would take right now.

    Claiming changes state, so call this only where that does not matter, or
    at the end of a test.
    """
    claims = store.claim_runs(worker, [WF], 1000, LEASE, max_recoveries)
    return {c.run.run_id for c in claims}


def types(events: list[HistoryEvent]) -> list[EventType]:
    return [e.event for e in events]


def running(store: Store, clock: FakeClock, run_id: str = "r1", worker: str = "w1") -> Claim:
    store.create_run(new_run(run_id))
    return claim(store, run_id, worker)


def finish(
    store: Store,
    clock: FakeClock,
    c: Claim,
    status: RunStatus = RunStatus.COMPLETED,
    seq: int | None = None,
) -> None:
    rid = c.run.run_id
    kind = EventType.RUN_COMPLETED if status is RunStatus.COMPLETED else EventType.RUN_FAILED
    event = ev(clock, rid, seq or c.next_seq, c.run.epoch, kind, worker=c.run.owner or "w1")
    result = Payload(data=b'"ok"') if status is RunStatus.COMPLETED else None
    error = None if status is RunStatus.COMPLETED else {"type": "Boom", "message": "it broke"}
    store.finish_run(rid, c.run.epoch, event, status, result, error)


def assert_gap_free(events: list[HistoryEvent], run_id: str) -> None:
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert all(e.run_id == run_id for e in events)
    epochs = [e.epoch for e in events]
    assert epochs == sorted(epochs), f"epochs go backwards: {epochs}"


SECURITY_ERROR = {"type": "SecurityViolation", "message": "egress to an unlisted host"}


def intent(clock: FakeClock, run_id: str, seq: int, epoch: int, position: int = 0) -> HistoryEvent:
    """The ``op.intent`` entry a holder writes (behind the effect barrier)
    before a side effect touches the outside world."""
    return HistoryEvent(
        run_id=run_id,
        seq=seq,
        event=EventType.OP_INTENT,
        at=clock(),
        epoch=epoch,
        worker="w1",
        position=position,
        step_kind="tool",
        name="charge_card",
        input_hash="cafe",
        detail={"op_id": f"{run_id}:{position}"},
    )


def park(
    store: Store,
    clock: FakeClock,
    c: Claim,
    status: RunStatus = RunStatus.SUSPENDED,
    *,
    wake_at: float | None = None,
    waiting_on: str | None = None,
    seq: int | None = None,
) -> HistoryEvent:
    """The holder of ``c`` parks its run; returns the entry it appended."""
    rid = c.run.run_id
    kind = EventType.RUN_NEEDS_ATTENTION if status is RunStatus.NEEDS_ATTENTION else EventType.RUN_SUSPENDED
    event = ev(clock, rid, seq or c.next_seq, c.run.epoch, kind, worker=c.run.owner or "w1")
    store.suspend_run(rid, c.run.epoch, event, wake_at=wake_at, waiting_on=waiting_on, status=status)
    return event


def needs_attention(store: Store, clock: FakeClock, run_id: str = "r1", worker: str = "w1") -> Claim:
    """A run whose holder wrote an intent (behind the barrier), lost track of
    what the effect did, and parked the run for an operator."""
    c = running(store, clock, run_id, worker)
    store.append(run_id, c.run.epoch, [intent(clock, run_id, c.next_seq, c.run.epoch)], barrier=True)
    park(store, clock, c, RunStatus.NEEDS_ATTENTION, seq=c.next_seq + 1)
    return c


def halt(store: Store, clock: FakeClock, c: Claim, seq: int | None = None) -> HistoryEvent:
    rid = c.run.run_id
    event = ev(clock, rid, seq or c.next_seq, c.run.epoch, EventType.RUN_HALTED, worker=c.run.owner or "w1")
    store.halt_run(rid, c.run.epoch, event, SECURITY_ERROR)
    return event


#: Every state a run can be in, for tests that sweep them.
STATES = [
    "pending",
    "running",
    "suspended",
    "budget-suspended",
    "needs_attention",
    "completed",
    "failed",
    "cancelled",
    "quarantined",
    "killed",
    "halted",
]


def put_in_state(store: Store, clock: FakeClock, run_id: str, state: str, **spec: Any) -> None:
    """Create ``run_id`` (``spec`` overrides ``new_run``'s defaults) and drive
    it into ``state`` (one of ``STATES``)."""
    store.create_run(new_run(run_id, **spec))
    if state == "pending":
        return
    if state == "cancelled":
        store.cancel_run(run_id, "x")
        return
    if state == "killed":
        store.kill_runs("x", run_id=run_id)
        return
    c = claim(store, run_id)
    if state == "suspended":
        park(store, clock, c, wake_at=clock() + 1000)
    elif state == "budget-suspended":
        park(store, clock, c)
    elif state == "needs_attention":
        park(store, clock, c, RunStatus.NEEDS_ATTENTION)
    elif state in ("completed", "failed"):
        finish(store, clock, c, RunStatus(state))
    elif state == "quarantined":
        clock.advance(LEASE + 1)
        assert store.claim_run(run_id, "w2", LEASE, 0) is None
    elif state == "halted":
        halt(store, clock, c)
    else:
        assert state == "running", state


# -- fenced-write scenarios: each leaves a holder with a write it may not make ------
#
# Each returns (run_id, epoch, seq): the holder's stale view of the run.


def _lost_by_takeover(store: Store, clock: FakeClock) -> tuple[str, int, int]:
    c = running(store, clock)
    clock.advance(LEASE + 1)
    claim(store, "r1", "w2")
    return "r1", c.run.epoch, c.next_seq


def _lost_by_cancel(store: Store, clock: FakeClock) -> tuple[str, int, int]:
    c = running(store, clock)
    store.cancel_run("r1", "operator said so")
    return "r1", c.run.epoch, c.next_seq


def _lost_by_quarantine(store: Store, clock: FakeClock) -> tuple[str, int, int]:
    c = running(store, clock)
    clock.advance(LEASE + 1)
    assert store.claim_runs("w2", [WF], 10, LEASE, max_recoveries=0) == []
    return "r1", c.run.epoch, c.next_seq


def _stale_epoch(store: Store, clock: FakeClock) -> tuple[str, int, int]:
    """Same worker, same run, but an older claim: only the epoch is wrong."""
    c1 = running(store, clock)
    store.release_run("r1", c1.run.epoch, ev(clock, "r1", c1.next_seq, c1.run.epoch, EventType.RUN_RELEASED))
    c2 = claim(store, "r1", "w1")
    return "r1", c1.run.epoch, c2.next_seq


def _future_epoch(store: Store, clock: FakeClock) -> tuple[str, int, int]:
    c = running(store, clock)
    return "r1", c.run.epoch + 1, c.next_seq


def _after_own_suspend(store: Store, clock: FakeClock) -> tuple[str, int, int]:
    """The epoch is right but the run no longer runs: suspending released it."""
    c = running(store, clock)
    suspended = ev(clock, "r1", c.next_seq, c.run.epoch, EventType.RUN_SUSPENDED)
    store.suspend_run("r1", c.run.epoch, suspended, wake_at=clock() + 100, waiting_on=None)
    return "r1", c.run.epoch, c.next_seq + 1


def _after_own_finish(store: Store, clock: FakeClock) -> tuple[str, int, int]:
    c = running(store, clock)
    finish(store, clock, c)
    return "r1", c.run.epoch, c.next_seq + 1


def _unknown_run(store: Store, clock: FakeClock) -> tuple[str, int, int]:
    return "ghost", 1, 1


def _lost_by_kill(store: Store, clock: FakeClock) -> tuple[str, int, int]:
    c = running(store, clock)
    store.kill_runs("runaway", run_id="r1")
    return "r1", c.run.epoch, c.next_seq


def _lost_by_tenant_kill(store: Store, clock: FakeClock) -> tuple[str, int, int]:
    c = running(store, clock)
    store.kill_runs("tenant over quota", tenant="default")
    return "r1", c.run.epoch, c.next_seq


def _after_own_attention(store: Store, clock: FakeClock) -> tuple[str, int, int]:
    """The epoch is right but the run is parked for an operator."""
    c = running(store, clock)
    park(store, clock, c, RunStatus.NEEDS_ATTENTION)
    return "r1", c.run.epoch, c.next_seq + 1


def _after_own_halt(store: Store, clock: FakeClock) -> tuple[str, int, int]:
    c = running(store, clock)
    halt(store, clock, c)
    return "r1", c.run.epoch, c.next_seq + 1


def _after_revive(store: Store, clock: FakeClock) -> tuple[str, int, int]:
    """Killed, then revived by an operator: the run is pending again, but the
    holder from before the kill must stay fenced out."""
    c = running(store, clock)
    store.kill_runs("oops", run_id="r1")
    store.revive_run("r1")
    return "r1", c.run.epoch, c.next_seq


LOSS_SCENARIOS: dict[str, Callable[[Store, FakeClock], tuple[str, int, int]]] = {
    "takeover": _lost_by_takeover,
    "cancel": _lost_by_cancel,
    "quarantine": _lost_by_quarantine,
    "stale-epoch": _stale_epoch,
    "future-epoch": _future_epoch,
    "after-suspend": _after_own_suspend,
    "after-finish": _after_own_finish,
    "unknown-run": _unknown_run,
    "kill": _lost_by_kill,
    "tenant-kill": _lost_by_tenant_kill,
    "after-attention": _after_own_attention,
    "after-halt": _after_own_halt,
    "after-revive": _after_revive,
}


def _fenced_write(op: str, store: Store, clock: FakeClock, run_id: str, epoch: int, seq: int) -> None:
    if op == "append":
        store.append(run_id, epoch, [ev(clock, run_id, seq, epoch)])
    elif op == "append_barrier":
        store.append(run_id, epoch, [intent(clock, run_id, seq, epoch)], barrier=True)
    elif op == "suspend":
        event = ev(clock, run_id, seq, epoch, EventType.RUN_SUSPENDED)
        store.suspend_run(run_id, epoch, event, wake_at=clock() + 5, waiting_on=None)
    elif op == "suspend_attention":
        event = ev(clock, run_id, seq, epoch, EventType.RUN_NEEDS_ATTENTION)
        store.suspend_run(run_id, epoch, event, None, None, status=RunStatus.NEEDS_ATTENTION)
    elif op == "halt":
        store.halt_run(run_id, epoch, ev(clock, run_id, seq, epoch, EventType.RUN_HALTED), SECURITY_ERROR)
    elif op == "release":
        store.release_run(run_id, epoch, ev(clock, run_id, seq, epoch, EventType.RUN_RELEASED))
    elif op == "finish":
        event = ev(clock, run_id, seq, epoch, EventType.RUN_COMPLETED)
        store.finish_run(run_id, epoch, event, RunStatus.COMPLETED, Payload(data=b"1"), None)
    elif op == "start_child":
        store.start_child(run_id, epoch, ev(clock, run_id, seq, epoch), new_run("child"))
    else:  # pragma: no cover - a typo in the parametrization
        raise AssertionError(op)


FENCED_OPS = [
    "append",
    "append_barrier",
    "suspend",
    "suspend_attention",
    "release",
    "finish",
    "start_child",
    "halt",
]


def family(
    store: Store, clock: FakeClock, root: str = "p", kid_status: RunStatus = RunStatus.COMPLETED
) -> None:
    """A finished tree: ``root`` -> ``root.k`` -> ``root.g``. The grandchild
    completes, the child ends as ``kid_status`` (completed or failed), then
    the root completes."""
    kid, grandkid = f"{root}.k", f"{root}.g"
    p = running(store, clock, root)
    store.start_child(root, p.run.epoch, ev(clock, root, p.next_seq, p.run.epoch), new_run(kid))
    k = claim(store, kid)
    store.start_child(kid, k.run.epoch, ev(clock, kid, k.next_seq, k.run.epoch), new_run(grandkid))
    finish(store, clock, claim(store, grandkid))
    finish(store, clock, k, kid_status, seq=k.next_seq + 1)
    finish(store, clock, p, seq=p.next_seq + 1)


def exercise_every_writer(store: Store, clock: FakeClock) -> None:
    """Write history through every path a backend has (create, create
    claimed, claims, takeovers, quarantine, appends single and batched,
    barrier, every transition, children, operator actions), for runs of two
    tenants, so a backend test can check something about every stored row."""
    store.create_run(new_run("a1", tenant="acme"))
    c = claim(store, "a1")
    e, s = c.run.epoch, c.next_seq
    store.append("a1", e, [ev(clock, "a1", s, e)])
    store.append("a1", e, [ev(clock, "a1", s + 1, e, position=1), ev(clock, "a1", s + 2, e, position=2)])
    store.append("a1", e, [intent(clock, "a1", s + 3, e, position=3)], barrier=True)
    store.start_child("a1", e, ev(clock, "a1", s + 4, e, position=4), new_run("a1.kid", tenant="acme"))
    park(store, clock, c, waiting_on="a1.kid", seq=s + 5)
    k = claim(store, "a1.kid")
    finish(store, clock, k)
    c = claim(store, "a1")
    store.release_run("a1", c.run.epoch, ev(clock, "a1", c.next_seq, c.run.epoch, EventType.RUN_RELEASED))
    c = claim(store, "a1")
    clock.advance(LEASE + 1)
    c = claim(store, "a1", "w2")  # takeover
    park(store, clock, c, RunStatus.NEEDS_ATTENTION)
    store.resolve_operation("a1", 3, False, None, {})
    c = claim(store, "a1")
    finish(store, clock, c, RunStatus.FAILED)
    store.retry_run("a1")
    store.set_budget("a1", {"max_tokens": 5})
    store.kill_runs("stop", tenant="acme")
    store.revive_run("a1")
    c = claim(store, "a1")
    halt(store, clock, c)
    claimed = store.create_claimed_run(new_run("g1", tenant="globex"), "w1", LEASE)
    assert claimed is not None
    store.append("g1", 1, [ev(clock, "g1", claimed.next_seq, 1)])
    store.kill_runs("stop", run_id="g1")
    store.create_run(new_run("g2", tenant="globex"))
    clock.advance(LEASE + 1)
    claim(store, "g2")
    clock.advance(LEASE + 1)
    assert store.claim_run("g2", "w3", LEASE, 0) is None  # quarantined
    store.create_run(new_run("g3", tenant="globex"))
    store.cancel_run("g3", "no")


# -- the suite -----------------------------------------------------------------------


class StoreContract:
    """Subclass and provide ``store`` and ``clock`` fixtures (see module doc)."""

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

    # -- timers and children ----------------------------------------------------

    def test_suspend_until_wake_at(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        wake = clock() + 10
        event = ev(clock, "r1", c.next_seq, c.run.epoch, EventType.RUN_SUSPENDED)
        store.suspend_run("r1", c.run.epoch, event, wake_at=wake, waiting_on=None)
        record = store.get_run("r1")
        assert record is not None
        assert (record.status, record.owner, record.lease_expires_at) == (RunStatus.SUSPENDED, None, None)
        assert (record.wake_at, record.waiting_on, record.epoch) == (wake, None, c.run.epoch)
        assert store.history("r1")[-1] == event
        clock.advance(9.9)
        assert store.claim_runs("w2", [WF], 10, LEASE, 3) == []
        assert store.claim_run("r1", "w2", LEASE, 3) is None
        clock.advance(0.1)
        woken = store.claim_runs("w2", [WF], 10, LEASE, 3)
        assert len(woken) == 1
        w = woken[0]
        assert w.run.status is RunStatus.RUNNING
        assert (w.run.owner, w.run.epoch) == ("w2", c.run.epoch + 1)
        assert (w.run.wake_at, w.run.waiting_on) == (None, None)
        assert types(w.history[-2:]) == [EventType.LEASE_CLAIMED, EventType.RUN_WOKEN]
        assert types(w.history).count(EventType.RUN_STARTED) == 1

    def test_suspend_with_past_wake_at_is_runnable_at_once(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        event = ev(clock, "r1", c.next_seq, c.run.epoch, EventType.RUN_SUSPENDED)
        store.suspend_run("r1", c.run.epoch, event, wake_at=clock() - 5, waiting_on=None)
        assert claim(store, "r1").history[-1].event is EventType.RUN_WOKEN

    def _parent_waiting_on_child(self, store: Store, clock: FakeClock) -> Claim:
        """``parent`` (held by w1) starts ``kid`` and suspends waiting on it."""
        p = running(store, clock, "parent")
        epoch = p.run.epoch
        store.start_child("parent", epoch, ev(clock, "parent", p.next_seq, epoch), new_run("kid"))
        event = ev(clock, "parent", p.next_seq + 1, epoch, EventType.RUN_SUSPENDED)
        store.suspend_run("parent", epoch, event, wake_at=None, waiting_on="kid")
        return p

    @pytest.mark.parametrize("outcome", [RunStatus.COMPLETED, RunStatus.FAILED])
    def test_child_finish_wakes_waiting_parent(
        self, store: Store, clock: FakeClock, outcome: RunStatus
    ) -> None:
        p = self._parent_waiting_on_child(store, clock)
        record = store.get_run("parent")
        assert record is not None
        assert (record.status, record.waiting_on, record.wake_at) == (RunStatus.SUSPENDED, "kid", None)
        clock.advance(1000)
        kid = store.claim_runs("w2", [WF], 10, LEASE, 3)
        assert [k.run.run_id for k in kid] == ["kid"], "the parent must not be runnable yet"
        clock.advance(1)
        finish(store, clock, kid[0], outcome)
        woken = store.claim_runs("w3", [WF], 10, LEASE, 3)
        assert [w.run.run_id for w in woken] == ["parent"]
        assert woken[0].run.epoch == p.run.epoch + 1
        assert woken[0].history[-1].event is EventType.RUN_WOKEN

    def test_waiting_on_already_finished_child_is_runnable_at_once(
        self, store: Store, clock: FakeClock
    ) -> None:
        p = running(store, clock, "parent")
        epoch = p.run.epoch
        store.start_child("parent", epoch, ev(clock, "parent", p.next_seq, epoch), new_run("kid"))
        finish(store, clock, claim(store, "kid", "w2"))
        event = ev(clock, "parent", p.next_seq + 1, epoch, EventType.RUN_SUSPENDED)
        store.suspend_run("parent", epoch, event, wake_at=None, waiting_on="kid")
        assert store.get_run("parent").status is RunStatus.SUSPENDED  # type: ignore[union-attr]
        assert [c.run.run_id for c in store.claim_runs("w1", [WF], 10, LEASE, 3)] == ["parent"]

    def test_child_finish_leaves_other_runs_alone(self, store: Store, clock: FakeClock) -> None:
        """Only a parent suspended on *this* child wakes: not one waiting on a
        sibling, and not one still running (its lease stays its own)."""
        p = self._parent_waiting_on_child(store, clock)
        q = running(store, clock, "busy")
        store.start_child("busy", q.run.epoch, ev(clock, "busy", q.next_seq, q.run.epoch), new_run("kid2"))
        r = running(store, clock, "other")
        e = r.run.epoch
        store.start_child("other", e, ev(clock, "other", r.next_seq, e), new_run("kid3"))
        event = ev(clock, "other", r.next_seq + 1, e, EventType.RUN_SUSPENDED)
        store.suspend_run("other", e, event, wake_at=None, waiting_on="kid3")
        busy_before = store.get_run("busy")
        finish(store, clock, claim(store, "kid2", "w2"))
        assert store.get_run("busy") == busy_before
        store.append("busy", q.run.epoch, [ev(clock, "busy", q.next_seq + 1, q.run.epoch)])
        # Only the still-pending children; neither waiting parent woke up.
        assert claimable_ids(store) == {"kid", "kid3"}
        assert store.get_run("parent").epoch == p.run.epoch  # type: ignore[union-attr]

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

    # -- fencing ------------------------------------------------------------------

    @pytest.mark.parametrize("op", FENCED_OPS)
    @pytest.mark.parametrize("scenario", list(LOSS_SCENARIOS))
    def test_fenced_write_is_rejected_and_changes_nothing(
        self, store: Store, clock: FakeClock, op: str, scenario: str
    ) -> None:
        run_id, epoch, seq = LOSS_SCENARIOS[scenario](store, clock)
        record, history = store.get_run(run_id), store.history(run_id)
        listed = store.list_runs(RunFilter(limit=1000))
        clock.advance(1)
        with pytest.raises(LeaseLost) as info:
            _fenced_write(op, store, clock, run_id, epoch, seq)
        assert info.value.run_id == run_id
        assert info.value.epoch == epoch
        assert store.get_run(run_id) == record
        assert store.history(run_id) == history
        assert store.get_run("child") is None
        assert store.list_runs(RunFilter(limit=1000)) == listed

    def test_lease_lost_escapes_except_exception(self, store: Store, clock: FakeClock) -> None:
        """A stale holder's user code may catch ``Exception``; ``LeaseLost`` must
        still get through to stop the worker."""
        run_id, epoch, seq = _lost_by_takeover(store, clock)

        def user_code() -> None:
            try:
                store.append(run_id, epoch, [ev(clock, run_id, seq, epoch)])
            except Exception:  # the mistake LeaseLost must survive
                return

        with pytest.raises(LeaseLost):
            user_code()

    def test_append_batch(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        batch = [ev(clock, "r1", c.next_seq + i, c.run.epoch, position=i) for i in range(3)]
        store.append("r1", c.run.epoch, batch)
        assert store.history("r1") == [*c.history, *batch]
        more = [ev(clock, "r1", c.next_seq + 3, c.run.epoch, position=3)]
        store.append("r1", c.run.epoch, more)
        assert store.history("r1")[-1] == more[0]
        assert store.get_run("r1").status is RunStatus.RUNNING  # type: ignore[union-attr]

    @pytest.mark.parametrize("offset", [-1, -3, 1])
    def test_append_with_wrong_seq_is_rejected(self, store: Store, clock: FakeClock, offset: int) -> None:
        """A taken ``seq`` means another writer appended; a gap would break the
        gap-free history. Both are refused with ``LeaseLost``, atomically."""
        c = running(store, clock)
        epoch = c.run.epoch
        with pytest.raises(LeaseLost):
            store.append("r1", epoch, [ev(clock, "r1", c.next_seq + offset, epoch)])
        # A bad entry later in a batch voids the whole batch.
        batch = [ev(clock, "r1", c.next_seq, epoch), ev(clock, "r1", c.next_seq + 1 + offset, epoch)]
        if offset == -1:
            batch[1] = replace(batch[1], seq=c.next_seq)  # the same seq twice
        with pytest.raises(LeaseLost):
            store.append("r1", epoch, batch)
        assert store.history("r1") == c.history
        assert store.get_run("r1") == c.run
        # The lease itself is untouched: the right seq still goes through.
        store.append("r1", epoch, [ev(clock, "r1", c.next_seq, epoch)])
        assert len(store.history("r1")) == len(c.history) + 1

    @pytest.mark.parametrize("op", [op for op in FENCED_OPS if op not in ("append", "start_child")])
    def test_transition_with_taken_seq_is_rejected(self, store: Store, clock: FakeClock, op: str) -> None:
        c = running(store, clock)
        with pytest.raises(LeaseLost):
            _fenced_write(op, store, clock, "r1", c.run.epoch, c.next_seq - 1)
        assert store.get_run("r1") == c.run
        assert store.history("r1") == c.history

    def test_append_for_another_run_is_a_bug(self, store: Store, clock: FakeClock) -> None:
        a = running(store, clock, "a")
        running(store, clock, "b")
        with pytest.raises(ValueError, match="b"):
            store.append("a", a.run.epoch, [ev(clock, "b", a.next_seq, a.run.epoch)])
        assert store.history("a") == a.history

    # -- start_child ----------------------------------------------------------------

    def test_start_child(self, store: Store, clock: FakeClock) -> None:
        p = running(store, clock, "parent")
        clock.advance(1)
        event = ev(clock, "parent", p.next_seq, p.run.epoch, step_kind="child", name="kid")
        spec = new_run("kid", workflow="kids", priority=3, queue="q", thread_id="t")
        kid = store.start_child("parent", p.run.epoch, event, spec)
        assert kid.parent_run_id == "parent"
        assert (kid.run_id, kid.workflow, kid.priority, kid.queue, kid.thread_id) == (
            "kid",
            "kids",
            3,
            "q",
            "t",
        )
        assert (kid.status, kid.epoch, kid.owner, kid.created_at) == (RunStatus.PENDING, 0, None, clock())
        assert store.get_run("kid") == kid
        assert types(store.history("kid")) == [EventType.RUN_CREATED]
        assert store.history("parent")[-1] == event
        assert [r.run_id for r in store.list_runs(RunFilter(parent_run_id="parent"))] == ["kid"]
        assert [c.run.run_id for c in store.claim_runs("w2", ["kids"], 10, LEASE, 3)] == ["kid"]

    def test_start_child_is_idempotent_on_child_id(self, store: Store, clock: FakeClock) -> None:
        """A replay after a crash starts the same child again: the parent's
        journal gets its entry, the child is left exactly as it is."""
        p = running(store, clock, "parent")
        first = store.start_child(
            "parent", p.run.epoch, ev(clock, "parent", p.next_seq, p.run.epoch), new_run("kid")
        )
        kid_claim = claim(store, "kid", "w2")
        clock.advance(LEASE + 1)
        p2 = claim(store, "parent", "w3")
        event = ev(clock, "parent", p2.next_seq, p2.run.epoch, worker="w3")
        again = store.start_child("parent", p2.run.epoch, event, new_run("kid", priority=9))
        assert again == kid_claim.run
        assert again != first
        assert store.history("kid") == kid_claim.history
        assert store.history("parent")[-1] == event

    def test_start_child_sets_parent_even_if_spec_disagrees(self, store: Store, clock: FakeClock) -> None:
        p = running(store, clock, "parent")
        event = ev(clock, "parent", p.next_seq, p.run.epoch)
        kid = store.start_child("parent", p.run.epoch, event, new_run("kid", parent_run_id="someone-else"))
        assert kid.parent_run_id == "parent"
        assert store.get_run("kid").parent_run_id == "parent"  # type: ignore[union-attr]

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

    # -- the effect barrier ----------------------------------------------------------

    @pytest.mark.parametrize("size", [1, 3])
    def test_barrier_append_appends_like_append(self, store: Store, clock: FakeClock, size: int) -> None:
        c = running(store, clock)
        e = c.run.epoch
        batch = [intent(clock, "r1", c.next_seq + i, e, position=i) for i in range(size)]
        store.append("r1", e, batch, barrier=True)
        assert store.history("r1") == [*c.history, *batch]
        assert store.get_run("r1") == c.run
        # The lease is untouched: plain and barrier appends go on from there.
        after = ev(clock, "r1", c.next_seq + size, e, position=0)
        store.append("r1", e, [after])
        again = intent(clock, "r1", c.next_seq + size + 1, e, position=1)
        store.append("r1", e, [again], barrier=True)
        assert store.history("r1")[-2:] == [after, again]
        assert_gap_free(store.history("r1"), "r1")

    def test_barrier_append_batch_is_atomic(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        e = c.run.epoch
        batch = [intent(clock, "r1", c.next_seq, e), intent(clock, "r1", c.next_seq + 2, e, position=1)]
        with pytest.raises(LeaseLost):
            store.append("r1", e, batch, barrier=True)
        assert store.history("r1") == c.history
        assert store.get_run("r1") == c.run

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
        [s for s in RunStatus if s not in (RunStatus.SUSPENDED, RunStatus.NEEDS_ATTENTION)],
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

    # -- kill switch -----------------------------------------------------------------

    def _assert_killed(
        self, store: Store, clock: FakeClock, rid: str, before: RunRecord, reason: str
    ) -> None:
        got = store.get_run(rid)
        assert got is not None, rid
        assert got.status is RunStatus.KILLED, rid
        assert got.status.terminal
        assert got.epoch == before.epoch + 1, rid
        assert (got.owner, got.lease_expires_at) == (None, None), rid
        assert got.error == {"type": "Killed", "message": reason}, rid
        assert got.updated_at == clock(), rid
        last = store.history(rid)[-1]
        assert last.event is EventType.RUN_KILLED, rid
        assert last.detail == {"reason": reason}, rid
        assert (last.epoch, last.at, last.worker) == (got.epoch, clock(), None), rid

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

    # -- budgets ---------------------------------------------------------------------

    def test_set_budget_replaces_the_budget(self, store: Store, clock: FakeClock) -> None:
        store.create_run(new_run("r1", budget={"max_tokens": 100, "max_usd": 0.5}))
        history = store.history("r1")
        clock.advance(4)
        record = store.set_budget("r1", {"max_tokens": 500, "tools": ("search",)})
        normalised = {"max_tokens": 500, "tools": ["search"]}
        assert record.budget == normalised
        assert (record.status, record.epoch, record.updated_at) == (RunStatus.PENDING, 0, clock())
        assert store.get_run("r1") == record
        full = store.history("r1")
        assert full[:-1] == history
        last = full[-1]
        assert (last.event, last.detail, last.epoch, last.at, last.worker) == (
            EventType.RUN_BUDGET_CHANGED,
            {"budget": normalised},
            0,
            clock(),
            None,
        )
        assert claimable_ids(store) == {"r1"}

    def test_set_budget_refuses_running_runs(self, store: Store, clock: FakeClock) -> None:
        """Only the holder may append to a running run's history, and it reads
        its limits at claim time: a running run's budget cannot change under it."""
        c = running(store, clock)
        before = (store.get_run("r1"), store.history("r1"))
        with pytest.raises(InvalidRunState, match="running"):
            store.set_budget("r1", {"max_tool_calls": 3})
        assert (store.get_run("r1"), store.history("r1")) == before
        assert store.renew_leases("w1", {"r1": c.run.epoch}, LEASE) == set()
        store.append("r1", c.run.epoch, [ev(clock, "r1", c.next_seq, c.run.epoch)])  # the holder goes on

    @pytest.mark.parametrize("parked", ["timer", "child", "needs_attention"])
    def test_set_budget_wakes_only_budget_suspensions(
        self, store: Store, clock: FakeClock, parked: str
    ) -> None:
        c = running(store, clock)
        store.create_run(new_run("broke"))
        park(store, clock, claim(store, "broke", "w2"))
        if parked == "timer":
            park(store, clock, c, wake_at=clock() + 100)
        elif parked == "child":
            store.start_child("r1", c.run.epoch, ev(clock, "r1", c.next_seq, c.run.epoch), new_run("kid"))
            park(store, clock, c, waiting_on="kid", seq=c.next_seq + 1)
        else:
            park(store, clock, c, RunStatus.NEEDS_ATTENTION)
        before = store.get_run("r1")
        assert before is not None
        clock.advance(1)
        for rid in ("r1", "broke"):
            store.set_budget(rid, {"max_tokens": 1_000_000})
        record = store.get_run("r1")
        assert record is not None
        assert (record.status, record.wake_at, record.waiting_on) == (
            before.status,
            before.wake_at,
            before.waiting_on,
        )
        assert store.claim_run("r1", "w3", LEASE, 3) is None
        expected = {"broke", "kid"} if parked == "child" else {"broke"}
        assert {x.run.run_id for x in store.claim_runs("w3", [WF], 10, LEASE, 3)} == expected
        if parked == "timer":  # the timer still fires when it is due
            clock.advance(100)
            assert claim(store, "r1", "w3").history[-1].event is EventType.RUN_WOKEN

    @pytest.mark.parametrize("state", ["completed", "cancelled", "killed", "halted"])
    def test_set_budget_does_not_revive_a_finished_run(
        self, store: Store, clock: FakeClock, state: str
    ) -> None:
        put_in_state(store, clock, "r1", state)
        before = store.get_run("r1")
        assert before is not None
        record = store.set_budget("r1", {"max_tokens": 1})
        assert (record.status, record.epoch) == (before.status, before.epoch)
        assert record.budget == {"max_tokens": 1}
        clock.advance(LEASE * 10)
        assert store.claim_run("r1", "w2", LEASE, 3) is None

    def test_set_budget_unknown_run(self, store: Store) -> None:
        with pytest.raises(RunNotFound):
            store.set_budget("ghost", {"max_tokens": 1})

    @pytest.mark.parametrize("how", ["create_run", "create_claimed_run", "start_child"])
    def test_budget_round_trips_as_json(self, store: Store, clock: FakeClock, how: str) -> None:
        """Stored and returned as JSON would keep it: tuples read back as lists."""
        budget = {"max_tokens": 1000, "max_usd": 2.5, "tools": ("search", "fetch"), "wall": None}
        normalised = {"max_tokens": 1000, "max_usd": 2.5, "tools": ["search", "fetch"], "wall": None}
        spec = new_run("r1", budget=budget)
        if how == "create_run":
            returned = store.create_run(spec)[0]
        elif how == "create_claimed_run":
            got = store.create_claimed_run(spec, "w1", LEASE)
            assert got is not None
            returned = got.run
        else:
            p = running(store, clock, "parent")
            event = ev(clock, "parent", p.next_seq, p.run.epoch)
            returned = store.start_child("parent", p.run.epoch, event, spec)
        assert returned.budget == normalised
        assert store.get_run("r1") == returned
        assert [r for r in store.list_runs(RunFilter()) if r.run_id == "r1"] == [returned]

    def test_budget_is_none_unless_given(self, store: Store, clock: FakeClock) -> None:
        assert store.create_run(new_run("r1"))[0].budget is None
        assert store.get_run("r1").budget is None  # type: ignore[union-attr]
        assert store.create_run(new_run("r1", budget={"max_tokens": 1}))[1] is False
        assert store.get_run("r1").budget is None  # type: ignore[union-attr]

    def test_budget_values_are_copies(self, store: Store, clock: FakeClock) -> None:
        budget: dict[str, Any] = {"max_tokens": 10, "tools": ["a"]}
        returned = store.create_run(new_run("r1", budget=budget))[0]
        budget["tools"].append("changed by caller")
        budget["max_tokens"] = 0
        assert returned.budget == {"max_tokens": 10, "tools": ["a"]}
        got = store.get_run("r1")
        assert got is not None
        assert got.budget == {"max_tokens": 10, "tools": ["a"]}
        got.budget["tools"].append("changed again")
        store.list_runs(RunFilter())[0].budget["max_tokens"] = 99  # type: ignore[index]
        new_budget: dict[str, Any] = {"max_tokens": 20}
        changed = store.set_budget("r1", new_budget)
        new_budget["max_tokens"] = 0
        changed.budget["max_tokens"] = 1  # type: ignore[index]
        assert store.get_run("r1").budget == {"max_tokens": 20}  # type: ignore[union-attr]
        assert store.history("r1")[-1].detail == {"budget": {"max_tokens": 20}}

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
        assert store.set_budget("r1", {"max_tokens": 1}).status is RunStatus.CANCELLED
        clock.advance(LEASE * 10)
        assert store.claim_run("r1", "w2", LEASE, 3) is None

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

    # -- artifacts --------------------------------------------------------------------

    def test_artifacts_round_trip(self, store: Store) -> None:
        big = bytes(range(256)) * 4096
        ref = store.put_artifact(big)
        assert store.get_artifact(ref) == big
        assert store.put_artifact(big) == ref
        other = store.put_artifact(b"other")
        assert other != ref
        assert store.get_artifact(other) == b"other"
        empty = store.put_artifact(b"")
        assert store.get_artifact(empty) == b""

    @pytest.mark.parametrize(
        "ref", [hashlib.sha256(b"never stored").hexdigest(), "not-a-ref", "", "../../etc/passwd"]
    )
    def test_unknown_artifact(self, store: Store, ref: str) -> None:
        store.put_artifact(b"something")
        with pytest.raises(PayloadError):
            store.get_artifact(ref)

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
        family(store, clock, "p")
        clock.advance(100)
        store.set_budget("p.g", {"max_tokens": 1})  # a change to a finished run: it is recent again
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
