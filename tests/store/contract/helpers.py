"""Helpers of the store contract suite: the fake clock, run and entry
builders, runs put into every state, and the fenced-write scenarios."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cairn.store.contract import HOLDER_WRITES, Store
from cairn.store.memrecords import Provenance, RunPut
from cairn.store.records import (
    ApprovalRequest,
    Claim,
    EventType,
    HistoryEvent,
    NewRun,
    Payload,
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


HolderWrite = Callable[[Store, FakeClock, str, int, int], object]


def _suspend(
    kind: EventType, status: RunStatus, wake_in: float | None = None, waiting_on: str | None = None,
    waiting_for: str | None = None,
) -> HolderWrite:
    def write(store: Store, clock: FakeClock, run_id: str, epoch: int, seq: int) -> object:
        wake_at = None if wake_in is None else clock() + wake_in
        store.suspend_run(run_id, epoch, ev(clock, run_id, seq, epoch, kind), wake_at, waiting_on,
                          status=status, waiting_for=waiting_for)
        return None

    return write


def _transact(store: Store, clock: FakeClock, run_id: str, epoch: int, seq: int) -> object:
    return store.transact(run_id, epoch, lambda tx: ([ev(clock, run_id, seq, epoch)], None))


def _rewind(store: Store, clock: FakeClock, run_id: str, epoch: int, seq: int) -> object:
    rewound = ev(clock, run_id, seq, epoch, EventType.RUN_REWOUND,
                 detail={"from_position": 0, "to": "s", "reason": "r", "rewind": 1})
    store.rewind_run(run_id, epoch, rewound, ev(clock, run_id, seq + 1, epoch, EventType.RUN_RELEASED))
    return None


def _approval_entry(clock: FakeClock, run_id: str, seq: int, epoch: int) -> HistoryEvent:
    return ev(clock, run_id, seq, epoch, position=0, step_kind="approval", name="ok")


FENCED_REQUEST = ApprovalRequest("fenced-req", "ok", "T", None, None, None)

#: The cases of the fencing matrix: label -> (the ``Store`` method, the
#: call a holder makes with its view ``(run_id, epoch, seq)``). A method
#: with branches that write differently has a case per branch.
HOLDER_CASES: dict[str, tuple[str, HolderWrite]] = {
    "append": ("append", lambda s, c, r, e, q: s.append(r, e, [ev(c, r, q, e)])),
    "append_batch": ("append", lambda s, c, r, e, q: s.append(r, e, [ev(c, r, q, e),
                                                                     ev(c, r, q + 1, e, position=1)])),
    "append_barrier": ("append", lambda s, c, r, e, q: s.append(r, e, [intent(c, r, q, e)], barrier=True)),
    "transact": ("transact", _transact),
    "suspend": ("suspend_run", _suspend(EventType.RUN_SUSPENDED, RunStatus.SUSPENDED, wake_in=5)),
    "suspend_attention": ("suspend_run", _suspend(EventType.RUN_NEEDS_ATTENTION, RunStatus.NEEDS_ATTENTION)),
    "suspend_waiting_for": ("suspend_run", _suspend(EventType.RUN_SUSPENDED, RunStatus.SUSPENDED,
                                                    waiting_for="signal:go")),
    "suspend_waiting_on": ("suspend_run", _suspend(EventType.RUN_SUSPENDED, RunStatus.SUSPENDED,
                                                   waiting_on="child")),
    "release": ("release_run", lambda s, c, r, e, q: s.release_run(
        r, e, ev(c, r, q, e, EventType.RUN_RELEASED))),
    "rewind": ("rewind_run", _rewind),
    "finish": ("finish_run", lambda s, c, r, e, q: s.finish_run(
        r, e, ev(c, r, q, e, EventType.RUN_COMPLETED), RunStatus.COMPLETED, Payload(data=b"1"), None)),
    "finish_failed": ("finish_run", lambda s, c, r, e, q: s.finish_run(
        r, e, ev(c, r, q, e, EventType.RUN_FAILED), RunStatus.FAILED, None, {"type": "E", "message": "m"})),
    "start_child": ("start_child", lambda s, c, r, e, q: s.start_child(
        r, e, ev(c, r, q, e), new_run("child"))),
    "take_delivery": ("take_delivery", lambda s, c, r, e, q: s.take_delivery(
        r, e, ev(c, r, q, e, position=0, step_kind="receive", name="signal:go"), 1)),
    "request_approval": ("request_approval", lambda s, c, r, e, q: s.request_approval(
        r, e, _approval_entry(c, r, q, e), FENCED_REQUEST)),
    "expire_approval": ("expire_approval", lambda s, c, r, e, q: s.expire_approval(
        r, e, _approval_entry(c, r, q, e), FENCED_REQUEST.request_id)),
    "halt": ("halt_run", lambda s, c, r, e, q: s.halt_run(r, e, ev(c, r, q, e, EventType.RUN_HALTED),
                                                          SECURITY_ERROR)),
    "append_memory": ("append_memory", lambda s, c, r, e, q: s.append_memory(
        r, e, [ev(c, r, q, e)], [RunPut("k", Payload(data=b"1"))], Provenance(run_id=r, position=0))),
    "put_workspace_objects": ("put_workspace_objects", lambda s, c, r, e, q: s.put_workspace_objects(
        r, e, {"0" * 64: b"nstale holder's object"})),
}

#: The fencing matrix's rows: every case of ``HOLDER_CASES``, and, for a
#: holder write of the contract (``contract.HOLDER_WRITES``) that has no
#: case yet, a row that fails saying so.
FENCED_OPS = list(HOLDER_CASES) + [f"uncovered:{method}" for method in
                                   sorted(HOLDER_WRITES - {m for m, _ in HOLDER_CASES.values()})]


def _fenced_write(op: str, store: Store, clock: FakeClock, run_id: str, epoch: int, seq: int) -> object:
    if op.startswith("uncovered:"):
        raise AssertionError(f"the holder write {op.split(':', 1)[1]} has no case in HOLDER_CASES "
                             "(tests/store/contract/helpers.py): add one")
    _, write = HOLDER_CASES[op]
    return write(store, clock, run_id, epoch, seq)


def held_state(store: Store, run_id: str) -> tuple[object, ...]:
    """Everything a holder write may change about ``run_id`` (and the child
    the matrix's ``start_child`` would create): a refused write leaves all
    of it as it was."""
    run = store.get_run(run_id)
    objects = store.workspace_objects(run.tenant, ["0" * 64]) if run is not None else {}
    return (run, store.history(run_id), store.get_run("child"),
            store.approvals(run_id=run_id, pending=False), store.deliveries(run_id), store.run_memory(run_id),
            objects)


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




class ContractBase:
    """What several topics' tests share (methods, as when the suite was one class)."""

    def _parent_waiting_on_child(self, store: Store, clock: FakeClock) -> Claim:
        """``parent`` (held by w1) starts ``kid`` and suspends waiting on it."""
        p = running(store, clock, "parent")
        epoch = p.run.epoch
        store.start_child("parent", epoch, ev(clock, "parent", p.next_seq, epoch), new_run("kid"))
        event = ev(clock, "parent", p.next_seq + 1, epoch, EventType.RUN_SUSPENDED)
        store.suspend_run("parent", epoch, event, wake_at=None, waiting_on="kid")
        return p


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


__all__ = [
    "FENCED_OPS",
    "HOLDER_CASES",
    "LEASE",
    "LOSS_SCENARIOS",
    "SECURITY_ERROR",
    "STATES",
    "WF",
    "ContractBase",
    "FakeClock",
    "assert_gap_free",
    "claim",
    "claimable_ids",
    "ev",
    "exercise_every_writer",
    "family",
    "finish",
    "halt",
    "held_state",
    "intent",
    "needs_attention",
    "new_run",
    "park",
    "put_in_state",
    "running",
    "types",
]
