"""Store contract: approvals — requests a run makes, decisions people take.

A request is written with the journal entry that makes it, fenced; a
decision is taken once (a second one, one on a finished run, one by someone
who is not an approver, one after the expiry are refused and store nothing),
records who decided and delivers itself into the run's mailbox in the same
transaction, waking the run; an expiry and a decision exclude each other.
"""

from __future__ import annotations

import dataclasses

import pytest

from cairn.errors import (
    ApprovalClosed,
    ApprovalNotFound,
    InvalidRunState,
    LeaseLost,
    NotAnApprover,
    RunNotFound,
)
from cairn.store.contract import Store
from cairn.store.records import (
    Approval,
    ApprovalRequest,
    ApprovalStatus,
    Claim,
    EventType,
    HistoryEvent,
    Payload,
    RunStatus,
    approval_key,
)
from tests.store.contract.helpers import (
    ContractBase,
    FakeClock,
    claim,
    claimable_ids,
    ev,
    finish,
    running,
)

REQ = "req-1"
APPROVED = ApprovalStatus.APPROVED


def _request(
    store: Store, clock: FakeClock, c: Claim, *, request_id: str = REQ, seq: int | None = None,
    approvers: tuple[str, ...] | None = None, expires_at: float | None = None, position: int = 0,
) -> HistoryEvent:
    rid = c.run.run_id
    event = ev(clock, rid, seq or c.next_seq, c.run.epoch, position=position, step_kind="approval",
               name="refund", payload=Payload(data=b'{"details":{"cents":500}}'))
    request = ApprovalRequest(request_id, "refund", "Refund", {"type": "object"}, approvers, expires_at)
    store.request_approval(rid, c.run.epoch, event, request)
    return event


def _suspend(store: Store, clock: FakeClock, c: Claim, seq: int, *, wake_at: float | None = None) -> None:
    rid = c.run.run_id
    event = ev(clock, rid, seq, c.run.epoch, EventType.RUN_SUSPENDED)
    store.suspend_run(rid, c.run.epoch, event, wake_at, None, RunStatus.SUSPENDED,
                      waiting_for=approval_key(REQ))


def _decide(store: Store, status: ApprovalStatus = APPROVED, *, actor: str = "cli:ada@host",
            run_id: str = "r1", request_id: str = REQ) -> Approval:
    return store.decide_approval(run_id, request_id, status, Payload(data=b'{"status":"approved"}'),
                                 "looks right", actor=actor)


class ApprovalsContract(ContractBase):
    def test_a_request_is_recorded_with_its_entry_and_listed_pending(
        self, store: Store, clock: FakeClock
    ) -> None:
        c = running(store, clock)
        event = _request(store, clock, c, approvers=("ada",), expires_at=clock() + 60)
        assert store.history("r1")[-1] == event
        (found,) = store.approvals()
        assert (found.run_id, found.request_id, found.tenant) == ("r1", REQ, "default")
        assert found.action == "refund"
        assert found.status is ApprovalStatus.PENDING
        assert (found.position, found.request_seq) == (0, event.seq)
        assert found.request == event.payload  # the details live in the entry
        assert found.approvers == ("ada",)
        assert found.schema == {"type": "object"}
        assert found.expires_at == clock() + 60
        assert found.requested_at == clock()
        assert found.run_status is RunStatus.RUNNING
        assert found.decided_by is None
        assert found.decision is None

    def test_a_request_is_fenced_and_written_whole_or_not_at_all(
        self, store: Store, clock: FakeClock
    ) -> None:
        c = running(store, clock)
        stale = Claim(dataclasses.replace(c.run, epoch=c.run.epoch - 1), c.history, c.next_seq)
        with pytest.raises(LeaseLost):
            _request(store, clock, stale)
        assert store.approvals(pending=False) == []
        assert store.history("r1") == c.history

    def test_a_decision_is_recorded_delivered_and_wakes_the_run(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        _request(store, clock, c)
        _suspend(store, clock, c, c.next_seq + 1)
        history = store.history("r1")
        assert claimable_ids(store) == set()
        clock.advance(5)
        decided = _decide(store)
        assert decided.status is APPROVED
        assert decided.decided_by == "cli:ada@host"
        assert decided.decided_at == clock()
        assert decided.comment == "looks right"
        (message,) = store.deliveries("r1", approval_key(REQ))
        assert message.sender == "cli:ada@host"
        assert message.payload == Payload(data=b'{"status":"approved"}')
        assert decided.decision_seq == message.seq
        assert decided.decision == message.payload
        assert store.history("r1") == history  # the holder records it when it takes the message
        assert claimable_ids(store) == {"r1"}
        assert store.approvals() == []  # no longer pending
        (listed,) = store.approvals(pending=False)
        assert listed.status is APPROVED

    def test_a_second_decision_is_refused_and_changes_nothing(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        _request(store, clock, c)
        _decide(store, ApprovalStatus.REJECTED, actor="cli:bob@host")
        for status in (APPROVED, ApprovalStatus.REJECTED, ApprovalStatus.EDITED):
            with pytest.raises(ApprovalClosed, match="rejected by cli:bob@host already"):
                _decide(store, status)
        (listed,) = store.approvals(pending=False)
        assert (listed.status, listed.decided_by) == (ApprovalStatus.REJECTED, "cli:bob@host")
        assert len(store.deliveries("r1")) == 1

    def test_a_decision_on_a_finished_run_is_refused(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        _request(store, clock, c)
        finish(store, clock, c, seq=c.next_seq + 1)
        with pytest.raises(InvalidRunState, match="completed"):
            _decide(store)
        assert store.deliveries("r1") == []
        assert store.approvals() == []  # a finished run's request is not pending
        (listed,) = store.approvals(pending=False)
        assert listed.status is ApprovalStatus.PENDING

    def test_unknown_runs_and_requests_are_refused(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        _request(store, clock, c)
        with pytest.raises(RunNotFound):
            _decide(store, run_id="nope")
        with pytest.raises(ApprovalNotFound):
            _decide(store, request_id="other")
        assert store.deliveries("r1") == []

    def test_only_an_approver_may_decide(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        _request(store, clock, c, approvers=("ada", "cli:root@ops"))
        for stranger in ("cli:bob@host", "cli:root@elsewhere", "app:4242", "adam", "cli:adam@host"):
            with pytest.raises(NotAnApprover, match="ada, cli:root@ops"):
                _decide(store, actor=stranger)
        assert store.deliveries("r1") == []
        assert _decide(store, actor="cli:ada@laptop").decided_by == "cli:ada@laptop"

    def test_an_exact_identity_approver(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        _request(store, clock, c, approvers=("cli:root@ops",))
        with pytest.raises(NotAnApprover):
            _decide(store, actor="cli:root@dev")
        assert _decide(store, actor="cli:root@ops").status is APPROVED

    def test_expiry_and_decision_exclude_each_other(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        _request(store, clock, c, expires_at=clock() + 60)
        seq = c.next_seq + 1
        outcome = ev(clock, "r1", seq, c.run.epoch, position=1, step_kind="decision", name=REQ)
        assert store.expire_approval("r1", c.run.epoch, outcome, REQ)
        assert store.history("r1")[-1] == outcome
        with pytest.raises(ApprovalClosed, match="expired"):
            _decide(store)
        assert store.deliveries("r1") == []
        (listed,) = store.approvals(pending=False)
        assert listed.status is ApprovalStatus.EXPIRED

        # the other order: the decision first, then the expiry writes nothing
        _request(store, clock, c, request_id="req-2", seq=seq + 1, position=2, expires_at=clock() + 60)
        _decide(store, request_id="req-2")
        late = ev(clock, "r1", seq + 2, c.run.epoch, position=3, step_kind="decision", name="req-2")
        before = store.history("r1")
        assert not store.expire_approval("r1", c.run.epoch, late, "req-2")
        assert store.history("r1") == before
        assert {a.request_id: a.status for a in store.approvals(pending=False)}["req-2"] is APPROVED

    def test_an_expiry_is_fenced(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        _request(store, clock, c, expires_at=clock() + 60)
        outcome = ev(clock, "r1", c.next_seq + 1, c.run.epoch - 1, position=1, step_kind="decision", name=REQ)
        with pytest.raises(LeaseLost):
            store.expire_approval("r1", c.run.epoch - 1, outcome, REQ)
        assert store.approvals()[0].status is ApprovalStatus.PENDING

    def test_no_decision_after_the_expiry_time(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        _request(store, clock, c, expires_at=clock() + 60)
        clock.advance(60)
        with pytest.raises(ApprovalClosed, match="timeout passed"):
            _decide(store)
        assert store.deliveries("r1") == []

    def test_listing_filters_by_tenant_and_run(self, store: Store, clock: FakeClock) -> None:
        from tests.store.contract.helpers import new_run

        store.create_run(new_run("a", tenant="acme"))
        store.create_run(new_run("b", tenant="umbrella"))
        for rid in ("a", "b"):
            _request(store, clock, claim(store, rid))
            clock.advance(1)
        assert [x.run_id for x in store.approvals()] == ["a", "b"]
        assert [x.run_id for x in store.approvals(tenant="acme")] == ["a"]
        assert [x.run_id for x in store.approvals(run_id="b")] == ["b"]
        assert [x.tenant for x in store.approvals(request_id=REQ)] == ["acme", "umbrella"]

    def test_a_request_made_again_keeps_its_decision(self, store: Store, clock: FakeClock) -> None:
        """A retry voided the entry that made the request and the run makes
        it again at the same position (same id): the decision stands, and the
        row points at the new entry."""
        c = running(store, clock)
        _request(store, clock, c)
        _decide(store)
        again = _request(store, clock, c, seq=c.next_seq + 1)
        (listed,) = store.approvals(pending=False)
        assert (listed.status, listed.request_seq) == (APPROVED, again.seq)

    def test_prune_deletes_a_runs_approvals(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        _request(store, clock, c)
        finish(store, clock, c, seq=c.next_seq + 1)
        clock.advance(100)
        assert store.prune_runs(clock() - 50) == 1
        assert store.approvals(pending=False) == []

    # -- a rewind voids the requests it undid ---------------------------------------------

    def _rewind(self, store: Store, clock: FakeClock, c: Claim, seq: int, cut: int, *,
                epoch: int | None = None) -> None:
        held = c.run.epoch if epoch is None else epoch
        rewound = ev(clock, "r1", seq, held, EventType.RUN_REWOUND,
                     detail={"from_position": cut, "to": "plan", "reason": "bad plan", "rewind": 1})
        released = ev(clock, "r1", seq + 1, held, EventType.RUN_RELEASED)
        store.rewind_run("r1", held, rewound, released)

    def test_a_rewind_voids_the_pending_requests_it_undid_and_gives_the_run_back(
        self, store: Store, clock: FakeClock
    ) -> None:
        """A request at or after the cut is re-made under a new id when the run
        replays; left pending, it would be listed to approvers and a decision
        on it delivered but never read."""
        c = running(store, clock)
        kept = _request(store, clock, c, request_id="before", position=1)
        _request(store, clock, c, request_id="at", seq=kept.seq + 1, position=3)
        last = _request(store, clock, c, request_id="after", seq=kept.seq + 2, position=5)
        clock.advance(2)
        self._rewind(store, clock, c, last.seq + 1, cut=3)
        statuses = {a.request_id: (a.status, a.decided_at) for a in store.approvals(pending=False)}
        assert statuses == {"before": (ApprovalStatus.PENDING, None),
                            "at": (ApprovalStatus.VOIDED, clock()), "after": (ApprovalStatus.VOIDED, clock())}
        assert [a.request_id for a in store.approvals()] == ["before"]
        assert [e.event for e in store.history("r1")[-2:]] == [EventType.RUN_REWOUND, EventType.RUN_RELEASED]
        run = store.get_run("r1")
        assert run is not None
        assert (run.status, run.owner) == (RunStatus.PENDING, None)
        assert claimable_ids(store) == {"r1"}
        for request_id in ("at", "after"):
            with pytest.raises(ApprovalClosed, match="was voided: its run was rewound"):
                _decide(store, request_id=request_id)
        assert store.deliveries("r1") == []
        assert _decide(store, request_id="before").status is APPROVED

    def test_a_decided_request_stays_decided_through_a_rewind(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        made = _request(store, clock, c, position=4)
        _decide(store)
        self._rewind(store, clock, c, made.seq + 1, cut=2)
        (listed,) = store.approvals(pending=False)
        assert (listed.status, listed.decided_by) == (APPROVED, "cli:ada@host")

    def test_a_stale_rewind_writes_nothing(self, store: Store, clock: FakeClock) -> None:
        c = running(store, clock)
        made = _request(store, clock, c, position=3)
        history = store.history("r1")
        with pytest.raises(LeaseLost):
            self._rewind(store, clock, c, made.seq + 1, cut=0, epoch=c.run.epoch - 1)
        assert store.approvals()[0].status is ApprovalStatus.PENDING
        assert store.history("r1") == history
        run = store.get_run("r1")
        assert run is not None
        assert run.status is RunStatus.RUNNING
