"""``ctx.request_approval``: approve, reject, edit, and every decision that
must be refused, on SQLite and PostgreSQL, from sync and async workflows.

A run that asks waits suspended (holding no worker) until a decision is
delivered; the decision it records is the one that was taken, with who took
it, and replay returns the very same ``Decision``.
"""

from __future__ import annotations

import contextvars
import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import cairn
from cairn.store.records import ApprovalStatus, EventType, RunStatus
from tests.approvals.conftest import one_pass
from tests.engine.kinds import Flow, Kind, both


@dataclasses.dataclass(frozen=True)
class Refund:
    customer: str
    cents: int


def _asking(app: cairn.App, kind: Kind, name: str = "ask", **options: Any) -> Any:
    @kind.workflow(app, name)
    def ask(ctx: cairn.Context, cents: int) -> Flow[dict[str, Any]]:
        decision = yield ctx.request_approval("refund", Refund("ada", cents), **options)
        return {"status": decision.status.value, "data": decision.data, "by": decision.decided_by,
                "at": decision.decided_at, "comment": decision.comment, "approved": decision.approved,
                "request_id": decision.request_id}

    return ask


def _pending(app: cairn.App, run_id: str) -> cairn.ApprovalView:
    (view,) = app.approvals(run_id=run_id)
    return view


@both
def test_a_request_suspends_the_run_and_is_listed(app: cairn.App, kind: Kind) -> None:
    ask = _asking(app, kind)
    handle = app.start(ask, 1500, tenant="acme")
    assert one_pass(app, handle.run_id) == "suspended"
    record = app.get_run(handle.run_id)
    assert record.status is RunStatus.SUSPENDED
    assert record.owner is None  # the waiting run holds no worker
    view = _pending(app, handle.run_id)
    assert view.request_id == cairn.operation_id(handle.run_id, 0)  # derived: stable across replays
    assert record.waiting_for == f"approval:{view.request_id}"
    assert (view.action, view.tenant, view.details) == ("refund", "acme", {"customer": "ada", "cents": 1500})
    assert view.type_name.endswith("Refund")
    assert view.pending
    assert view.status is ApprovalStatus.PENDING
    assert app.approvals(tenant="acme") == [view]
    assert app.approvals(tenant="other") == []
    # nothing woke it: another pass finds it not claimable
    assert app.store.claim_run(handle.run_id, "w", 5.0, 5) is None


@both
def test_approve(app: cairn.App, kind: Kind) -> None:
    ask = _asking(app, kind)
    handle = app.start(ask, 1500)
    one_pass(app, handle.run_id)
    view = _pending(app, handle.run_id)
    decided = app.approve(handle.run_id, view.request_id, comment="fine", by="cli:ada@desk")
    assert (decided.status, decided.decided_by, decided.comment) == (ApprovalStatus.APPROVED, "cli:ada@desk",
                                                                     "fine")
    assert one_pass(app, handle.run_id) == "completed"
    result = handle.result(timeout=5)
    assert result["status"] == "approved"
    assert result["approved"]
    assert result["data"] == {"customer": "ada", "cents": 1500}
    assert (result["by"], result["comment"]) == ("cli:ada@desk", "fine")
    assert result["at"] == decided.decided_at
    # the run's history records the decision with its decider
    (entry,) = [e for e in app.history(handle.run_id)
                if e.event is EventType.STEP_COMPLETED and e.step_kind == "decision"]
    assert entry.detail is not None
    assert entry.detail["sender"] == "cli:ada@desk"
    assert entry.detail["decision"] == "approved"
    assert app.approvals() == []


@both
def test_reject(app: cairn.App, kind: Kind) -> None:
    ask = _asking(app, kind)
    handle = app.start(ask, 1500)
    one_pass(app, handle.run_id)
    app.reject(handle.run_id, _pending(app, handle.run_id).request_id, comment="too much")
    one_pass(app, handle.run_id)
    result = handle.result(timeout=5)
    assert (result["status"], result["approved"], result["data"]) == ("rejected", False, None)
    assert result["comment"] == "too much"
    assert result["by"] == cairn.api.operator.app_actor()


@both
def test_edit_gives_the_run_the_edited_value_of_its_type(app: cairn.App, kind: Kind) -> None:
    seen: list[Any] = []

    @kind.workflow(app, "typed")
    def typed(ctx: cairn.Context) -> Flow[int]:
        decision = yield ctx.request_approval("refund", Refund("ada", 5000))
        seen.append(decision.data)
        return decision.data.cents

    handle = app.start(typed)
    one_pass(app, handle.run_id)
    view = _pending(app, handle.run_id)
    decided = app.approve(handle.run_id, view.request_id, edit={"customer": "ada", "cents": 1200})
    assert decided.status is ApprovalStatus.EDITED
    assert decided.edited == {"customer": "ada", "cents": 1200}
    one_pass(app, handle.run_id)
    assert handle.result(timeout=5) == 1200
    assert seen == [Refund("ada", 1200)]  # the edit, decoded into the request's type


@both
def test_an_edit_that_does_not_fit_is_refused_and_nothing_is_stored(app: cairn.App, kind: Kind) -> None:
    ask = _asking(app, kind)
    handle = app.start(ask, 1500)
    one_pass(app, handle.run_id)
    view = _pending(app, handle.run_id)
    for bad in ({"customer": "ada", "cents": "a lot"}, {"customer": "ada"}, [1, 2], "x", None,
                {"customer": "ada", "cents": 1.5}):
        with pytest.raises(cairn.InvalidEdit, match="does not fit"):
            app.approve(handle.run_id, view.request_id, edit=bad)
    with pytest.raises(cairn.InvalidEdit, match="finite"):
        app.approve(handle.run_id, view.request_id, edit={"customer": "ada", "cents": float("nan")})
    assert app.store.deliveries(handle.run_id) == []
    assert _pending(app, handle.run_id) == view
    assert app.store.claim_run(handle.run_id, "w", 5.0, 5) is None  # still waiting


@both
def test_a_second_decision_is_refused(app: cairn.App, kind: Kind) -> None:
    ask = _asking(app, kind)
    handle = app.start(ask, 1500)
    one_pass(app, handle.run_id)
    request_id = _pending(app, handle.run_id).request_id
    app.approve(handle.run_id, request_id)
    with pytest.raises(cairn.ApprovalClosed, match="decided once"):
        app.reject(handle.run_id, request_id)
    with pytest.raises(cairn.ApprovalClosed):
        app.approve(handle.run_id, request_id, edit={"customer": "bob", "cents": 1})
    one_pass(app, handle.run_id)
    assert handle.result(timeout=5)["status"] == "approved"
    assert len(app.store.deliveries(handle.run_id)) == 1


@both
def test_a_decision_on_a_finished_run_is_refused(app: cairn.App, kind: Kind) -> None:
    ask = _asking(app, kind)
    handle = app.start(ask, 1500)
    one_pass(app, handle.run_id)
    request_id = _pending(app, handle.run_id).request_id
    app.cancel(handle.run_id)
    with pytest.raises(cairn.CairnError, match="cancelled"):
        app.approve(handle.run_id, request_id)
    assert app.approvals() == []  # a finished run's request is not pending any more
    (view,) = app.approvals(pending=False)
    assert view.status is ApprovalStatus.PENDING
    assert not view.pending


@both
def test_unknown_runs_and_requests(app: cairn.App, kind: Kind) -> None:
    ask = _asking(app, kind)
    handle = app.start(ask, 1500)
    one_pass(app, handle.run_id)
    with pytest.raises(cairn.RunNotFound):
        app.approve("no-such-run", "x")
    with pytest.raises(cairn.ApprovalNotFound):
        app.approve(handle.run_id, "no-such-request")
    with pytest.raises(cairn.RunNotFound):
        app.approve("no-such-run", "x", edit={"a": 1})


@both
def test_only_approvers_may_decide(app: cairn.App, kind: Kind) -> None:
    ask = _asking(app, kind, approvers=["ada", "cli:root@ops"])
    handle = app.start(ask, 1500)
    one_pass(app, handle.run_id)
    view = _pending(app, handle.run_id)
    assert view.approvers == ("ada", "cli:root@ops")
    for stranger in (None, "cli:bob@desk", "cli:root@dev", "cli:adam@desk"):
        with pytest.raises(cairn.NotAnApprover):
            app.approve(handle.run_id, view.request_id, by=stranger)
        with pytest.raises(cairn.NotAnApprover):
            app.reject(handle.run_id, view.request_id, by=stranger)
    assert app.store.deliveries(handle.run_id) == []
    app.approve(handle.run_id, view.request_id, by="cli:ada@laptop")
    one_pass(app, handle.run_id)
    assert handle.result(timeout=5)["by"] == "cli:ada@laptop"


@both
def test_a_timeout_fires_after_a_restart(app: cairn.App, kind: Kind, tmp_path: Any) -> None:
    """The deadline is journaled at the first request: a fresh App (a
    restarted process) sees the same one, and the run wakes at it."""
    ask = _asking(app, kind, timeout=1.0)
    handle = app.start(ask, 1500)
    assert one_pass(app, handle.run_id) == "suspended"
    view = _pending(app, handle.run_id)
    assert view.expires_at is not None
    record = app.get_run(handle.run_id)
    assert record.wake_at == view.expires_at  # the timeout is the wake-up
    restarted = cairn.App(db=app.db_url, lease_seconds=5.0)
    try:
        _asking(restarted, kind, timeout=99)  # a deploy changed the timeout: the recorded one holds
        time.sleep(max(0.0, view.expires_at - time.time()) + 0.05)
        assert one_pass(restarted, handle.run_id) == "completed"
        result = restarted.handle(handle.run_id).result(timeout=5)
    finally:
        restarted.close()
    assert (result["status"], result["approved"], result["data"], result["by"]) == ("expired", False, None,
                                                                                    None)
    (expired,) = app.approvals(pending=False)
    assert expired.status is ApprovalStatus.EXPIRED
    with pytest.raises(cairn.CairnError, match="completed"):  # the run went on: it is finished
        app.approve(handle.run_id, view.request_id)


@both
def test_a_decision_before_the_timeout_wins(app: cairn.App, kind: Kind) -> None:
    ask = _asking(app, kind, timeout=3600)
    handle = app.start(ask, 1500)
    one_pass(app, handle.run_id)
    app.approve(handle.run_id, _pending(app, handle.run_id).request_id)
    assert one_pass(app, handle.run_id) == "completed"  # woken by the decision, not the timer
    assert handle.result(timeout=5)["status"] == "approved"


@both
def test_replay_returns_the_recorded_decision(app: cairn.App, kind: Kind) -> None:
    """After the decision is recorded, a crash and replay see the very same
    decision, and the request is not made again."""
    seen: list[Any] = []

    @kind.workflow(app, "twice")
    def twice(ctx: cairn.Context) -> Flow[str]:
        decision = yield ctx.request_approval("refund", {"cents": 10})
        seen.append((decision.status, decision.data, decision.decided_at))
        yield ctx.sleep(0.5)  # long enough that the pass which records it is over before it is due
        return str(decision.status)

    handle = app.start(twice)
    one_pass(app, handle.run_id)
    app.approve(handle.run_id, _pending(app, handle.run_id).request_id, edit={"cents": 7})
    assert one_pass(app, handle.run_id) == "suspended"  # the sleep
    time.sleep(0.55)
    assert one_pass(app, handle.run_id) == "completed"
    assert seen[0] == seen[1]
    assert seen[0][:2] == (ApprovalStatus.EDITED, {"cents": 7})
    assert len(app.approvals(pending=False)) == 1


@both
def test_bad_requests_are_refused_before_anything_is_recorded(app: cairn.App, kind: Kind) -> None:
    @kind.workflow(app, "bad")
    def bad(ctx: cairn.Context, which: str) -> Flow[str]:
        options: dict[str, Any] = {
            "action": {"action": ""},
            "approvers": {"approvers": []},
            "timeout": {"timeout": -1},
            "details": {"details": float("inf")},
            "type": {"type_": int},
        }[which]
        try:
            yield ctx.request_approval(options.pop("action", "refund"), options.pop("details", {"a": 1}),
                                       **options)
        except (cairn.InvalidArgument, cairn.PayloadError) as exc:
            return type(exc).__name__
        return "asked"

    for which in ("action", "approvers", "timeout", "details", "type"):
        handle = app.start(bad, which)
        assert one_pass(app, handle.run_id) == "completed"
        assert handle.result(timeout=5) in ("InvalidArgument", "PayloadError")
    assert app.approvals(pending=False) == []


def test_app_run_of_a_waiting_run_says_it_waits(tmp_path: Any) -> None:
    """``app.run`` of a run that waits for a decision with no timeout would
    block forever: it raises ``RunSuspended`` naming the request."""
    app = cairn.App(db=f"sqlite:///{tmp_path}/c.db")
    try:
        @app.workflow(name="inline")
        def inline(ctx: cairn.Context) -> str:
            return str(ctx.request_approval("deploy", {"version": 3}).status)

        with pytest.raises(cairn.RunSuspended, match="waiting for a decision on approval request") as info:
            app.run(inline, run_id="i1")
        app.approve("i1", app.approvals()[0].request_id)
        assert app.resume(info.value.run_id) == "approved"
    finally:
        app.close()


def test_a_request_undone_by_a_rewind_is_voided_and_asked_again(app: cairn.App) -> None:
    """A request made from a thread of the workflow while the workflow goes
    on; the workflow then fails logically back to a step before it. The
    replay asks again under a new id (a new generation of that position), so
    the first request must stop being pending: otherwise approvers see two, and
    a decision on the first is delivered to a run that never reads it."""
    tries: list[int] = []

    @app.step()
    def plan() -> int:
        return 500 + 100 * len(tries)

    @app.step()
    def check(cents: int) -> int:
        tries.append(cents)
        if len(tries) == 1:
            raise cairn.LogicalFailure("the first plan is wrong", rewind_to="plan")
        return cents

    @app.workflow(name="asks-in-a-thread")
    def asks(ctx: cairn.Context) -> dict[str, Any]:
        cents = plan()
        with ThreadPoolExecutor(1) as pool:
            asked = pool.submit(contextvars.copy_context().run, ctx.request_approval, "refund",
                                Refund("ada", cents))
            asked.exception()  # the request is recorded (and waits) before the check runs
            check(cents)
            decision = asked.result()
        return {"cents": decision.data.cents, "request_id": decision.request_id}

    handle = app.start(asks, run_id="voided")
    assert one_pass(app, "voided") == "released"  # rewound
    (first,) = app.approvals(run_id="voided", pending=False)
    assert first.status is ApprovalStatus.VOIDED
    assert not first.pending
    with pytest.raises(cairn.ApprovalClosed, match="was voided"):
        app.approve("voided", first.request_id)
    assert one_pass(app, "voided") == "suspended"
    (second,) = app.approvals(run_id="voided")
    assert second.request_id != first.request_id
    assert second.details == {"customer": "ada", "cents": 600}
    app.approve("voided", second.request_id, by="cli:ada@desk")
    assert one_pass(app, "voided") == "completed"
    assert handle.result(timeout=5) == {"cents": 600, "request_id": second.request_id}
    assert {a.request_id: a.status for a in app.approvals(run_id="voided", pending=False)} == {
        first.request_id: ApprovalStatus.VOIDED, second.request_id: ApprovalStatus.APPROVED}
