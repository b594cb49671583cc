"""Tools in one process: classification of failures, schemas, operations."""

from __future__ import annotations

import dataclasses

import pytest

import cairn
from cairn.store.records import EventType, RunStatus
from tests.engine.conftest import Calls


@dataclasses.dataclass
class Receipt:
    id: str
    amount: int


def test_operation_is_injected_and_stable(app: cairn.App) -> None:
    seen: list[cairn.Operation] = []

    @app.tool(effect="idempotent", retry=cairn.RetryPolicy(max_attempts=2, initial_delay=0, jitter=0))
    def send(op: cairn.Operation, to: str, body: str) -> str:
        seen.append(op)
        if op.attempt == 1:
            raise ConnectionError("reset")
        return op.operation_id

    @app.workflow(name="mail")
    def mail(ctx: cairn.Context) -> str:
        return send("ada@example.com", body="hi")

    result = app.run(mail, run_id="m", tenant="acme")
    assert [op.attempt for op in seen] == [1, 2]
    assert {op.operation_id for op in seen} == {result, cairn.operation_id("m", 0)}
    assert seen[0].arguments == {"to": "ada@example.com", "body": "hi"}
    assert seen[0].tenant == "acme"
    assert seen[0].effect is cairn.Effect.IDEMPOTENT
    # every attempt of an idempotent tool was preceded by a durable intent
    intents = [e for e in app.history("m") if e.event is EventType.OP_INTENT]
    assert [e.attempt for e in intents] == [1, 2]


def test_a_tool_outside_a_workflow_is_a_plain_call(app: cairn.App) -> None:
    @app.tool(effect="write")
    def charge(op: cairn.Operation, amount: int) -> int:
        assert op.operation_id
        return amount

    assert charge(5) == 5


def test_uncertain_write_failure_is_reconciled_not_resent(app: cairn.App, calls: Calls) -> None:
    bank: dict[str, int] = {}

    def reconcile(op: cairn.Operation) -> cairn.Done[int] | cairn.NotFound:
        calls.hit("reconcile")
        return cairn.Done(bank[op.operation_id]) if op.operation_id in bank else cairn.NotFound()

    @app.tool(effect="write", reconcile=reconcile, retry=cairn.RetryPolicy(max_attempts=5))
    def pay(op: cairn.Operation, amount: int) -> int:
        calls.hit("pay")
        bank[op.operation_id] = amount
        raise TimeoutError("the bank did not answer in time")  # but it did apply the payment

    @app.workflow(name="w")
    def w(ctx: cairn.Context) -> int:
        return pay(42)

    assert app.run(w, run_id="u") == 42
    assert calls.counts == {"pay": 1, "reconcile": 1}
    assert len(bank) == 1


def test_unknown_reconciliation_backs_off_durably(app: cairn.App, calls: Calls) -> None:
    answers = iter([cairn.Unknown("bank is indexing"), cairn.Done(7)])

    def reconcile(op: cairn.Operation) -> cairn.Done[int] | cairn.Unknown:
        calls.hit("reconcile")
        return next(answers)

    @app.tool(effect="write", reconcile=reconcile,
              reconcile_retry=cairn.RetryPolicy(initial_delay=0.05, jitter=0))
    def pay(op: cairn.Operation) -> int:
        calls.hit("pay")
        raise ConnectionResetError("connection dropped mid-request")

    @app.workflow(name="w")
    def w(ctx: cairn.Context) -> int:
        return pay()

    assert app.run(w, run_id="unk") == 7
    assert calls.counts == {"pay": 1, "reconcile": 2}
    reconciled = [e.detail for e in app.history("unk") if e.event is EventType.OP_RECONCILED]
    assert reconciled
    assert reconciled[0] is not None
    assert reconciled[0]["outcome"] == "unknown"
    assert any(e.event is EventType.RUN_SUSPENDED for e in app.history("unk"))


def test_effect_not_applied_is_retried_per_policy(app: cairn.App, calls: Calls) -> None:
    @app.tool(effect="write", retry=cairn.RetryPolicy(max_attempts=3, initial_delay=0, jitter=0))
    def pay(op: cairn.Operation) -> str:
        calls.hit("pay")
        if calls["pay"] < 3:
            raise cairn.EffectNotApplied("429: try later")
        return "paid"

    @app.workflow(name="w")
    def w(ctx: cairn.Context) -> str:
        return pay()

    assert app.run(w, run_id="ena") == "paid"
    assert calls["pay"] == 3


def test_uncertain_write_without_reconcile_needs_attention(app: cairn.App, calls: Calls) -> None:
    @app.tool(effect="write")
    def pay(op: cairn.Operation) -> str:
        calls.hit("pay")
        raise TimeoutError("no answer")

    @app.workflow(name="w")
    def w(ctx: cairn.Context) -> str:
        return pay()

    app.start(w, run_id="na")
    claim = app.store.claim_run("na", "w1", 5.0, 5)
    assert claim is not None
    from cairn.engine.executor import execute

    assert execute(app.runtime, claim, "w1").status == "suspended"
    run = app.get_run("na")
    assert run.status is RunStatus.NEEDS_ATTENTION
    entry = [e for e in app.history("na") if e.event is EventType.RUN_NEEDS_ATTENTION][-1]
    assert entry.detail is not None
    assert entry.detail["operation_id"] == cairn.operation_id("na", 0)
    assert "TimeoutError" in entry.detail["why"]
    app.resolve_operation("na", 0, done=True, result="paid-by-operator")
    assert app.resume("na") == "paid-by-operator"
    assert calls["pay"] == 1


def test_malformed_tool_result_is_a_classified_failure(app: cairn.App) -> None:
    @app.tool(effect="read", schema=Receipt)
    def lookup() -> object:
        return {"id": "r-1", "amount": "lots"}

    @app.workflow(name="w")
    def w(ctx: cairn.Context) -> str:
        try:
            lookup()
        except cairn.StepFailed as failure:
            return failure.error_type
        return "unreachable"

    assert app.run(w, run_id="bad") == "ToolResultInvalid"
    failed = [e for e in app.history("bad") if e.event is EventType.STEP_FAILED]
    assert failed[0].detail is not None
    assert failed[0].detail["error"]["class"] == "terminal"


def test_tool_result_is_validated_into_the_schema(app: cairn.App) -> None:
    @app.tool(effect="read", schema=Receipt)
    def lookup() -> object:
        return {"id": "r-1", "amount": 3}

    @app.workflow(name="w")
    def w(ctx: cairn.Context) -> int:
        receipt = lookup()
        assert isinstance(receipt, Receipt)
        return receipt.amount

    assert app.run(w, run_id="ok") == 3


def test_sync_tool_timeout_makes_a_write_uncertain(app: cairn.App, calls: Calls) -> None:
    import threading

    gate = threading.Event()

    def reconcile(op: cairn.Operation) -> cairn.NotFound:
        calls.hit("reconcile")
        return cairn.NotFound()

    @app.tool(effect="write", reconcile=reconcile, timeout=0.05)
    def slow(op: cairn.Operation) -> str:
        calls.hit("slow")
        if calls["slow"] == 1:
            gate.wait(2)
        return "done"

    @app.workflow(name="w")
    def w(ctx: cairn.Context) -> str:
        return slow()

    try:
        assert app.run(w, run_id="to") == "done"
    finally:
        gate.set()
    assert calls["reconcile"] == 1  # asked before sending again
    assert calls["slow"] == 2


def test_reconcile_only_for_write_tools(app: cairn.App) -> None:
    with pytest.raises(ValueError, match="only meaningful"):
        app.tool(effect="read", reconcile=lambda op: cairn.NotFound())(lambda: 1)


def test_async_tool_with_async_reconcile(app: cairn.App, calls: Calls) -> None:
    answers = iter([RuntimeError("bank API down"), cairn.Done(9)])

    async def reconcile(op: cairn.Operation) -> cairn.Done[int]:
        calls.hit("reconcile")
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    @app.tool(effect="write", reconcile=reconcile,
              reconcile_retry=cairn.RetryPolicy(initial_delay=0.02, jitter=0))
    async def pay(op: cairn.Operation) -> int:
        calls.hit("pay")
        raise ConnectionResetError("dropped")

    @app.workflow(name="w")
    async def w(ctx: cairn.Context) -> int:
        return await pay()

    assert app.run(w, run_id="ar") == 9
    assert calls.counts == {"pay": 1, "reconcile": 2}  # the raising reconciler counted as Unknown
