"""Protected tools (``@app.tool(..., approval=...)``): the run suspends
before the intent, the request records the exact arguments, and the tool
executes exactly the approved or edited ones, once, under its usual
operation id; a rejection or an expiry raises in the workflow and the tool
never runs. SQLite and PostgreSQL, sync and async."""

from __future__ import annotations

import datetime
import decimal
import time
from typing import Any

import pytest

import cairn
from cairn.engine.approvalmessages import decision_message
from cairn.store.records import ApprovalStatus, EventType
from tests.approvals.conftest import one_pass
from tests.engine.kinds import Flow, Kind, both


class Bank:
    """The outside world: transfers by idempotency key (a repeated key is the same transfer)."""

    def __init__(self) -> None:
        self.transfers: dict[str, dict[str, Any]] = {}
        self.calls = 0

    def transfer(self, key: str, to: str, cents: int, memo: str) -> dict[str, Any]:
        self.calls += 1
        return self.transfers.setdefault(key, {"to": to, "cents": cents, "memo": memo})


def _build(app: cairn.App, kind: Kind, bank: Bank, **protection: Any) -> Any:
    def pay(op: cairn.Operation, to: str, cents: int, memo: str = "refund") -> dict[str, Any]:
        return bank.transfer(op.operation_id, to, cents, memo)

    def lookup(op: cairn.Operation) -> cairn.Done[dict[str, Any]] | cairn.NotFound:
        found = bank.transfers.get(op.operation_id)
        return cairn.Done(found) if found is not None else cairn.NotFound()

    tool = app.tool(effect="write", name="pay", reconcile=kind.fn(lookup), **protection)(kind.fn(pay))

    @kind.workflow(app, "refund")
    def refund(ctx: cairn.Context, to: str, cents: int) -> Flow[Any]:
        try:
            receipt = yield tool(to, cents)
        except cairn.ApprovalRejected as exc:
            return {"refused": type(exc).__name__, "status": exc.decision.status.value,
                    "comment": exc.decision.comment}
        return receipt

    return refund


def _request(app: cairn.App, run_id: str) -> cairn.ApprovalView:
    (view,) = app.approvals(run_id=run_id)
    return view


def _kinds(app: cairn.App, run_id: str) -> list[str]:
    return [f"{e.event.value}:{e.step_kind}" for e in app.history(run_id) if e.position is not None]


@both
def test_the_run_suspends_before_the_intent_with_the_exact_arguments(app: cairn.App, kind: Kind) -> None:
    bank = Bank()
    refund = _build(app, kind, bank, approval=True)
    handle = app.start(refund, "ada", 5000)
    assert one_pass(app, handle.run_id) == "suspended"
    assert bank.calls == 0
    assert not any(e.event is EventType.OP_INTENT for e in app.history(handle.run_id))  # no intent yet
    view = _request(app, handle.run_id)
    assert view.action == "pay"
    # defaults included: all it runs with
    assert view.details == {"to": "ada", "cents": 5000, "memo": "refund"}
    app.approve(handle.run_id, view.request_id)
    assert one_pass(app, handle.run_id) == "completed"
    assert handle.result(timeout=5) == {"to": "ada", "cents": 5000, "memo": "refund"}
    # the operation id is the tool call's own, as for any tool: (run, its position)
    assert list(bank.transfers) == [cairn.operation_id(handle.run_id, 2)]
    assert bank.calls == 1
    assert _kinds(app, handle.run_id) == ["step.completed:approval", "step.completed:decision",
                                          "op.intent:tool", "step.completed:tool"]


@both
def test_an_edit_is_executed_exactly(app: cairn.App, kind: Kind) -> None:
    bank = Bank()
    refund = _build(app, kind, bank, approval=True)
    handle = app.start(refund, "ada", 5000)
    one_pass(app, handle.run_id)
    view = _request(app, handle.run_id)
    app.approve(handle.run_id, view.request_id, edit={"to": "ada", "cents": 1250, "memo": "partial"},
                comment="half")
    one_pass(app, handle.run_id)
    assert handle.result(timeout=5) == {"to": "ada", "cents": 1250, "memo": "partial"}
    assert list(bank.transfers.values()) == [{"to": "ada", "cents": 1250, "memo": "partial"}]
    (intent,) = [e for e in app.history(handle.run_id) if e.event is EventType.OP_INTENT]
    assert intent.payload is not None
    assert app.runtime.payloads.load(intent.payload, what="intent") == {"to": "ada", "cents": 1250,
                                                                        "memo": "partial"}


@both
def test_edits_that_do_not_fit_the_arguments_are_refused(app: cairn.App, kind: Kind) -> None:
    bank = Bank()
    refund = _build(app, kind, bank, approval=True)
    handle = app.start(refund, "ada", 5000)
    one_pass(app, handle.run_id)
    request_id = _request(app, handle.run_id).request_id
    for bad in ({"to": "ada", "cents": "5"}, {"to": "ada"}, {"to": "ada", "cents": 5, "extra": 1},
                {"to": 7, "cents": 5}):
        with pytest.raises(cairn.InvalidEdit):
            app.approve(handle.run_id, request_id, edit=bad)
    assert app.store.deliveries(handle.run_id) == []
    app.approve(handle.run_id, request_id, edit={"to": "bob", "cents": 5})  # memo keeps its default
    one_pass(app, handle.run_id)
    assert handle.result(timeout=5) == {"to": "bob", "cents": 5, "memo": "refund"}


@both
def test_a_rejection_raises_in_the_workflow_and_nothing_runs(app: cairn.App, kind: Kind) -> None:
    bank = Bank()
    refund = _build(app, kind, bank, approval=True)
    handle = app.start(refund, "ada", 5000)
    one_pass(app, handle.run_id)
    app.reject(handle.run_id, _request(app, handle.run_id).request_id, comment="fraud")
    assert one_pass(app, handle.run_id) == "completed"
    assert handle.result(timeout=5) == {"refused": "ApprovalRejected", "status": "rejected",
                                        "comment": "fraud"}
    assert bank.calls == 0
    assert not any(e.event is EventType.OP_INTENT for e in app.history(handle.run_id))


@both
def test_an_expired_approval_raises_approval_expired(app: cairn.App, kind: Kind) -> None:
    bank = Bank()
    refund = _build(app, kind, bank, approval=True, approval_timeout=1.0)
    handle = app.start(refund, "ada", 5000)
    assert one_pass(app, handle.run_id) == "suspended"
    (view,) = app.approvals(run_id=handle.run_id)
    assert view.expires_at is not None
    time.sleep(max(0.0, view.expires_at - time.time()) + 0.05)
    assert one_pass(app, handle.run_id) == "completed"
    assert handle.result(timeout=5) == {"refused": "ApprovalExpired", "status": "expired", "comment": None}
    assert bank.calls == 0


@both
def test_a_policy_sees_the_bound_arguments(app: cairn.App, kind: Kind) -> None:
    bank = Bank()
    seen: list[dict[str, Any]] = []

    def over_1000(arguments: dict[str, Any]) -> bool:
        seen.append(dict(arguments))
        return bool(arguments["cents"] > 1000)

    refund = _build(app, kind, bank, approval=over_1000, approvers="ada")
    small = app.start(refund, "ada", 900)
    assert one_pass(app, small.run_id) == "completed"  # under the threshold: no approval asked
    assert small.result(timeout=5)["cents"] == 900
    assert seen[0] == {"to": "ada", "cents": 900, "memo": "refund"}
    large = app.start(refund, "bob", 1001)
    assert one_pass(app, large.run_id) == "suspended"
    view = _request(app, large.run_id)
    assert view.approvers == ("ada",)
    with pytest.raises(cairn.NotAnApprover):
        app.approve(large.run_id, view.request_id)
    app.approve(large.run_id, view.request_id, by="cli:ada@desk")
    one_pass(app, large.run_id)
    assert large.result(timeout=5)["cents"] == 1001
    assert bank.calls == 2


@pytest.mark.parametrize("app", ["sqlite"], indirect=True)  # the rule is the engine's; one backend shows it
def test_the_arguments_are_never_re_derived_after_the_wait(app: cairn.App) -> None:
    """The workflow computes the amount from something that changed while
    the run waited (here a global, with input checking off, so replay does not
    object): what runs is what was approved, not what the code derives now."""
    bank = Bank()
    app.runtime.check_inputs = False
    source = {"cents": 5000}

    @app.tool(effect="write", approval=True)
    def pay(op: cairn.Operation, to: str, cents: int) -> dict[str, Any]:
        return bank.transfer(op.operation_id, to, cents, "")

    @app.workflow(name="derived")
    def derived(ctx: cairn.Context) -> dict[str, Any]:
        return pay("ada", source["cents"])

    handle = app.start(derived)
    one_pass(app, handle.run_id)
    source["cents"] = 999_999  # re-derived after the wait, the amount would be this
    app.approve(handle.run_id, _request(app, handle.run_id).request_id)
    one_pass(app, handle.run_id)
    assert handle.result(timeout=5)["cents"] == 5000
    assert [t["cents"] for t in bank.transfers.values()] == [5000]


def test_registration_refuses_what_cannot_be_approved_by_name(tmp_path: Any) -> None:
    app = cairn.App(db=f"sqlite:///{tmp_path}/c.db")
    try:
        with pytest.raises(TypeError, match="by name"):
            @app.tool(effect="write", approval=True)
            def many(*amounts: int) -> None: ...
        with pytest.raises(ValueError, match="need approval="):
            @app.tool(effect="write", approvers=["ada"])
            def unprotected(amount: int) -> None: ...
        with pytest.raises(ValueError, match="one or more identities"):
            @app.tool(effect="write", approval=True, approvers=[])
            def nobody(amount: int) -> None: ...
        with pytest.raises(ValueError, match="seconds >= 0"):
            @app.tool(effect="write", approval=True, approval_timeout=-1)
            def negative(amount: int) -> None: ...
        with pytest.raises(TypeError, match="True or a function"):
            @app.tool(effect="write", approval="yes")  # type: ignore[arg-type]
            def odd(amount: int) -> None: ...
    finally:
        app.close()


@pytest.mark.parametrize("app", ["sqlite"], indirect=True)  # one backend: the tool is plain Python here
def test_a_protected_tool_outside_a_run_is_the_plain_function(app: cairn.App) -> None:
    @app.tool(effect="write", approval=True)
    def pay(to: str, cents: int) -> str:
        return f"{to}:{cents}"

    assert pay("ada", 1) == "ada:1"
    assert ApprovalStatus.APPROVED == "approved"


# -- a protected tool that takes a secret ----------------------------------------------------

VALUES = {"ops-token": "tok-ops-4242", "root-token": "tok-root-9999"}


def _with_secret(app: cairn.App, seen: list[tuple[str, int]], ref: Any = None) -> Any:
    app.secrets = cairn.CallableSecrets(lambda ref, access: VALUES[ref.name])

    @app.tool(effect="write", name="charge", approval=True, reconcile=lambda op: cairn.NotFound())
    def charge(op: cairn.Operation, token: cairn.SecretValue, cents: int) -> dict[str, Any]:
        seen.append((token.reveal(), cents))
        return {"charged": cents}

    @app.workflow(name="charging")
    def charging(ctx: cairn.Context, cents: int) -> Any:
        return charge(cairn.Secret("ops-token") if ref is None else ref, cents)

    return charging


def test_a_protected_tool_with_a_secret_asks_with_the_reference_and_runs_with_the_value(
    app: cairn.App,
) -> None:
    """Approvers see (and an edit keeps) which secret the call uses, never its
    value; the tool gets the value resolved at the call. (It used to fail every
    run: the request's type held a SecretValue, which nothing can decode.)"""
    seen: list[tuple[str, int]] = []
    handle = app.start(_with_secret(app, seen), 500, run_id="charge-1")
    assert one_pass(app, "charge-1") == "suspended"
    view = _request(app, "charge-1")
    assert view.details == {"token": {"$cairn": "secret", "name": "ops-token"}, "cents": 500}
    app.approve("charge-1", view.request_id, edit={"token": view.details["token"], "cents": 450})
    assert one_pass(app, "charge-1") == "completed"
    assert handle.result(timeout=5) == {"charged": 450}
    assert seen == [("tok-ops-4242", 450)]
    recorded = repr([(e.payload, e.detail) for e in app.history("charge-1")])
    assert "tok-ops" not in recorded


def test_an_edit_cannot_change_which_secret_a_protected_tool_uses(app: cairn.App) -> None:
    """An approver may change the amount, not swap the credential for a
    stronger one the worker can also resolve: refused where the decision is
    taken, and nothing stored."""
    seen: list[tuple[str, int]] = []
    app.start(_with_secret(app, seen), 500, run_id="charge-2")
    one_pass(app, "charge-2")
    view = _request(app, "charge-2")
    swapped = {"token": {"$cairn": "secret", "name": "root-token"}, "cents": 500}
    with pytest.raises(cairn.InvalidEdit, match=r"\['token'\]"):
        app.approve("charge-2", view.request_id, edit=swapped)
    with pytest.raises(cairn.InvalidEdit, match=r"\['token'\]"):
        app.approve("charge-2", view.request_id, edit={"token": None, "cents": 500})
    assert _request(app, "charge-2").status is ApprovalStatus.PENDING
    assert app.store.deliveries("charge-2") == []


def test_a_decision_that_swapped_the_secret_past_the_check_halts_the_run(app: cairn.App) -> None:
    """A decision written around the operator's check (straight to the store,
    as a bug or an intruder would) is caught by the run before the tool runs."""
    seen: list[tuple[str, int]] = []
    app.start(_with_secret(app, seen), 500, run_id="charge-3")
    one_pass(app, "charge-3")
    view = _request(app, "charge-3")
    swapped = {"token": {"$cairn": "secret", "name": "root-token"}, "cents": 500}
    message = decision_message(ApprovalStatus.EDITED, None, swapped)
    app.store.decide_approval("charge-3", view.request_id, ApprovalStatus.EDITED,
                              app.runtime.payloads.wrap(message), None, actor="intruder")
    assert one_pass(app, "charge-3") == "halted"
    assert seen == []
    assert app.get_run("charge-3").status is cairn.RunStatus.HALTED
    assert "changed which secret" in app.get_run("charge-3").error["message"]


def test_a_reference_passed_in_its_json_form_is_approved_as_the_same_reference(app: cairn.App) -> None:
    """A workflow that got its reference as data (a run's input decoded as
    ``Any``) passes the JSON form: the approved call names the same secret,
    so it runs, and is not taken for a swap."""
    seen: list[tuple[str, int]] = []
    as_data = {"$cairn": "secret", "name": "ops-token"}
    handle = app.start(_with_secret(app, seen, as_data), 300, run_id="charge-4")
    one_pass(app, "charge-4")
    app.approve("charge-4", _request(app, "charge-4").request_id)
    assert one_pass(app, "charge-4") == "completed"
    assert handle.result(timeout=5) == {"charged": 300}
    assert seen == [("tok-ops-4242", 300)]


def _scheduled(app: cairn.App, kind: Kind, paid: list[Any]) -> Any:
    """A protected tool whose arguments msgspec reads from strings (a
    ``datetime``, a ``Decimal``) and an ``int``: what JSON Schema alone says
    less about than the type."""
    def schedule(op: cairn.Operation, when: datetime.datetime, amount: decimal.Decimal, times: int) -> str:
        paid.append((when, amount, times))
        return f"{amount} x{times} at {when.isoformat()}"

    tool = app.tool(effect="write", name="schedule", approval=True)(kind.fn(schedule))

    @kind.workflow(app, "scheduled")
    def scheduled(ctx: cairn.Context) -> Flow[Any]:
        return (yield tool(datetime.datetime(2030, 1, 1, 9, 0), decimal.Decimal("12.50"), 2))

    return scheduled


@both
def test_an_edit_the_type_refuses_is_refused_where_it_is_made(app: cairn.App, kind: Kind) -> None:
    """A value the schema alone would admit but the run's type refuses ("next
    tuesday" for a datetime, "lots" for a Decimal, 2.0 for an int) is an
    ``InvalidEdit`` at decision time, nothing stored: the request can still
    be decided, and the run does what the good edit says."""
    paid: list[Any] = []
    handle = app.start(_scheduled(app, kind, paid))
    one_pass(app, handle.run_id)
    request_id = _request(app, handle.run_id).request_id
    good = {"when": "2030-01-02T10:00:00", "amount": "7.25", "times": 3}
    for field, bad in (("when", "next tuesday"), ("amount", "lots"), ("times", 2.0)):
        with pytest.raises(cairn.InvalidEdit, match=rf"\['{field}'\]"):
            app.approve(handle.run_id, request_id, edit={**good, field: bad})
    assert app.store.deliveries(handle.run_id) == []
    assert _request(app, handle.run_id).status is ApprovalStatus.PENDING
    app.approve(handle.run_id, request_id, edit=good)
    assert one_pass(app, handle.run_id) == "completed"
    assert paid == [(datetime.datetime(2030, 1, 2, 10, 0), decimal.Decimal("7.25"), 3)]


@both
def test_a_decision_no_type_accepts_fails_the_decision_call_and_the_tool_never_runs(
    app: cairn.App, kind: Kind
) -> None:
    """The type has the last word: an edit written straight to the store,
    past the decider's check, fails the run's decision call with
    ``InvalidEdit`` and records nothing as decided; the tool is not run."""
    paid: list[Any] = []
    handle = app.start(_scheduled(app, kind, paid))
    one_pass(app, handle.run_id)
    view = _request(app, handle.run_id)
    bad = {"when": "next tuesday", "amount": "7.25", "times": 3}
    app.store.decide_approval(handle.run_id, view.request_id, ApprovalStatus.EDITED,
                              app.runtime.payloads.wrap(decision_message(ApprovalStatus.EDITED, None, bad)),
                              None, actor="intruder")
    assert one_pass(app, handle.run_id) == "failed"
    assert paid == []
    run = app.get_run(handle.run_id)
    assert run.status is cairn.RunStatus.FAILED
    assert run.error is not None
    assert "InvalidEdit" in run.error["message"], run.error
    assert _kinds(app, handle.run_id) == ["step.completed:approval", "step.failed:decision"]
