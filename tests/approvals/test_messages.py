"""Issue 22 item 3: the approval messages have public readers
(``cairn.engine.approvalmessages``). What a run stores as its request and
what a decider delivers are read back through them, from the real store, on
SQLite and PostgreSQL: the same types the engine writes and replays, so no
reader re-parses a decoded dict by key."""

from __future__ import annotations

import dataclasses

import cairn
from cairn.engine.approvalmessages import (
    DecisionMessage,
    RequestRecord,
    decision_message,
    read_decision,
    read_request,
)
from cairn.store.records import ApprovalStatus
from tests.approvals.conftest import one_pass


@dataclasses.dataclass(frozen=True)
class Refund:
    customer: str
    cents: int


def test_an_edit_carries_its_data_and_an_approval_none() -> None:
    edited = read_decision(decision_message(ApprovalStatus.EDITED, "less", {"cents": 5}), what="an edit")
    assert edited == DecisionMessage("edited", "less", {"cents": 5})
    assert edited.edited == {"cents": 5}
    approved = read_decision(decision_message(ApprovalStatus.APPROVED, None, {"cents": 5}), what="approval")
    assert (approved.data, approved.edited) == (None, None)  # the run acts on the details it asked about


def test_the_stored_request_and_decision_read_back_through_the_readers(app: cairn.App) -> None:
    @app.workflow(name="ask")
    def ask(ctx: cairn.Context, cents: int) -> int:
        decision = ctx.request_approval("refund", Refund("ada", cents), timeout=3600)
        return int(decision.data.cents) if decision.data is not None else -1

    run_id = app.start(ask, 1500, tenant="acme").run_id
    assert one_pass(app, run_id) == "suspended"
    (pending,) = app.store.approvals(run_id=run_id, pending=True, limit=10)
    assert pending.request is not None
    request = read_request(app.runtime.payloads.raw(pending.request, what="the request"), what="the request")
    assert request == RequestRecord(pending.request_id, "refund", {"customer": "ada", "cents": 1500},
                                    pending.type_name, None, pending.expires_at)

    app.approve(run_id, pending.request_id, comment="half", edit={"customer": "ada", "cents": 750})
    (decided,) = app.store.approvals(run_id=run_id, pending=False, limit=10)
    assert decided.decision is not None
    message = read_decision(app.runtime.payloads.raw(decided.decision, what="the decision"), what="decision")
    assert message == DecisionMessage("edited", "half", {"customer": "ada", "cents": 750})
    (view,) = app.approvals(run_id=run_id, pending=False)
    assert (view.details, view.edited) == (request.details, message.edited)
    one_pass(app, run_id)
    assert app.handle(run_id).result(timeout=5) == 750
