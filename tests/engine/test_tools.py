"""Tools in one process: classification of failures, schemas, operations.

The engine rules are tested on both paths (``kind``: sync or async workflow,
tool and reconciler, built from one body by ``tests.engine.kinds``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import pytest

import cairn
from cairn.store.records import EventType, RunStatus
from tests.engine.conftest import Calls, execute_once
from tests.engine.kinds import Flow, Kind, both
from tests.timing import NAP, napped


@dataclasses.dataclass
class Receipt:
    id: str
    amount: int


@both
def test_operation_is_injected_and_stable(app: cairn.App, kind: Kind) -> None:
    seen: list[cairn.Operation] = []

    def send(op: cairn.Operation, to: str, body: str) -> str:
        seen.append(op)
        if op.attempt == 1:
            raise ConnectionError("reset")
        return op.operation_id

    tool = app.tool(effect="idempotent", retry=cairn.RetryPolicy(max_attempts=2, initial_delay=0, jitter=0))(
        kind.fn(send))

    @kind.workflow(app, "mail")
    def mail(ctx: cairn.Context) -> Flow[str]:
        return (yield tool("ada@example.com", body="hi"))

    result = app.run(mail, run_id="m", tenant="acme")
    assert [op.attempt for op in seen] == [1, 2]
    assert {op.operation_id for op in seen} == {result, cairn.operation_id("m", 0)}
    assert seen[0].arguments == {"to": "ada@example.com", "body": "hi"}
    assert seen[0].tenant == "acme"
    assert seen[0].effect is cairn.Effect.IDEMPOTENT
    # every attempt of an idempotent tool was preceded by a durable intent
    intents = [e for e in app.history("m") if e.event is EventType.OP_INTENT]
    assert [e.attempt for e in intents] == [1, 2]


@both
def test_a_read_tool_records_no_intent_and_no_operation(app: cairn.App, kind: Kind, calls: Calls) -> None:
    def look(key: str) -> str:
        calls.hit("look")
        info = cairn.step_info()
        return f"{key}@{info.position}"

    tool = app.tool(effect="read")(kind.fn(look))

    @kind.workflow(app, "reader")
    def reader(ctx: cairn.Context) -> Flow[str]:
        first = yield tool("a")
        ctx.sleep(NAP)  # suspends: the second pass replays the recorded read
        return first + (yield tool("b"))

    assert app.run(reader, run_id="rd") == "a@0b@2"
    assert calls["look"] == 2  # not 3: the read of "a" was replayed, not made again
    history = app.history("rd")
    before, after = napped(history)
    assert [e.position for e in before] == [0, 1]
    assert [e.position for e in after] == [2]
    assert not [e for e in history if e.event is EventType.OP_INTENT]
    completed = [e for e in history if e.event is EventType.STEP_COMPLETED and e.step_kind == "tool"]
    assert [e.detail for e in completed] == [None, None]


def test_a_tool_outside_a_workflow_is_a_plain_call(app: cairn.App) -> None:
    @app.tool(effect="write")
    def charge(op: cairn.Operation, amount: int) -> int:
        assert op.operation_id
        return amount

    assert charge(5) == 5


@both
def test_uncertain_write_failure_is_reconciled_not_resent(app: cairn.App, kind: Kind, calls: Calls) -> None:
    bank: dict[str, int] = {}

    def reconcile(op: cairn.Operation) -> cairn.Done[int] | cairn.NotFound:
        calls.hit("reconcile")
        return cairn.Done(bank[op.operation_id]) if op.operation_id in bank else cairn.NotFound()

    def pay(op: cairn.Operation, amount: int) -> int:
        calls.hit("pay")
        bank[op.operation_id] = amount
        raise TimeoutError("the bank did not answer in time")  # but it did apply the payment

    tool = app.tool(effect="write", reconcile=kind.fn(reconcile), retry=cairn.RetryPolicy(max_attempts=5))(
        kind.fn(pay))

    @kind.workflow(app, "w")
    def w(ctx: cairn.Context) -> Flow[int]:
        return (yield tool(42))

    assert app.run(w, run_id="u") == 42
    assert calls.counts == {"pay": 1, "reconcile": 1}
    assert len(bank) == 1
    [done] = [e for e in app.history("u") if e.event is EventType.STEP_COMPLETED]
    assert done.detail == {"operation_id": cairn.operation_id("u", 0), "reconciled": "done"}


@both
def test_not_found_reconciliation_sends_again_with_the_same_key(
    app: cairn.App, kind: Kind, calls: Calls
) -> None:
    keys: list[str] = []

    def reconcile(op: cairn.Operation) -> cairn.NotFound:
        calls.hit("reconcile")
        return cairn.NotFound()

    def pay(op: cairn.Operation, amount: int) -> int:
        calls.hit("pay")
        keys.append(op.operation_id)
        if calls["pay"] == 1:
            raise ConnectionResetError("dropped before the bank saw it")
        return amount

    # the attempt failed and left no trace: the tool's retry policy decides (issue 9 item 5)
    tool = app.tool(effect="write", reconcile=kind.fn(reconcile),
                    retry=cairn.RetryPolicy(max_attempts=2, initial_delay=0, jitter=0))(kind.fn(pay))

    @kind.workflow(app, "w")
    def w(ctx: cairn.Context) -> Flow[int]:
        return (yield tool(5))

    assert app.run(w, run_id="nf") == 5
    assert calls.counts == {"pay": 2, "reconcile": 1}
    assert keys == [cairn.operation_id("nf", 0)] * 2
    reconciled = [e.detail for e in app.history("nf") if e.event is EventType.OP_RECONCILED]
    assert [d and d["outcome"] for d in reconciled] == ["not_found"]


@both
def test_unknown_reconciliation_backs_off_durably(app: cairn.App, kind: Kind, calls: Calls) -> None:
    answers = iter([cairn.Unknown("bank is indexing"), cairn.Done(7)])

    def reconcile(op: cairn.Operation) -> cairn.Done[int] | cairn.Unknown:
        calls.hit("reconcile")
        return next(answers)

    def pay(op: cairn.Operation) -> int:
        calls.hit("pay")
        raise ConnectionResetError("connection dropped mid-request")

    tool = app.tool(effect="write", reconcile=kind.fn(reconcile),
                    reconcile_retry=cairn.RetryPolicy(initial_delay=0.05, jitter=0))(kind.fn(pay))

    @kind.workflow(app, "w")
    def w(ctx: cairn.Context) -> Flow[int]:
        return (yield tool())

    assert app.run(w, run_id="unk") == 7
    assert calls.counts == {"pay": 1, "reconcile": 2}
    reconciled = [e.detail for e in app.history("unk") if e.event is EventType.OP_RECONCILED]
    assert reconciled
    assert reconciled[0] is not None
    assert reconciled[0]["outcome"] == "unknown"
    assert reconciled[0]["reason"] == "bank is indexing"
    assert any(e.event is EventType.RUN_SUSPENDED for e in app.history("unk"))


@both
def test_a_raising_reconciler_counts_as_unknown(app: cairn.App, kind: Kind, calls: Calls) -> None:
    answers = iter([RuntimeError("bank API down"), cairn.Done(9)])

    def reconcile(op: cairn.Operation) -> cairn.Done[int]:
        calls.hit("reconcile")
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def pay(op: cairn.Operation) -> int:
        calls.hit("pay")
        raise ConnectionResetError("dropped")

    tool = app.tool(effect="write", reconcile=kind.fn(reconcile),
                    reconcile_retry=cairn.RetryPolicy(initial_delay=0.02, jitter=0))(kind.fn(pay))

    @kind.workflow(app, "w")
    def w(ctx: cairn.Context) -> Flow[int]:
        return (yield tool())

    assert app.run(w, run_id="ar") == 9
    assert calls.counts == {"pay": 1, "reconcile": 2}
    [unknown] = [e.detail for e in app.history("ar") if e.event is EventType.OP_RECONCILED]
    assert unknown is not None
    assert unknown["reason"] == "reconcile raised RuntimeError: bank API down"


@both
def test_effect_not_applied_is_retried_per_policy(app: cairn.App, kind: Kind, calls: Calls) -> None:
    def pay(op: cairn.Operation) -> str:
        calls.hit("pay")
        if calls["pay"] < 3:
            raise cairn.EffectNotApplied("429: try later")
        return "paid"

    tool = app.tool(effect="write", retry=cairn.RetryPolicy(max_attempts=3, initial_delay=0, jitter=0))(
        kind.fn(pay))

    @kind.workflow(app, "w")
    def w(ctx: cairn.Context) -> Flow[str]:
        return (yield tool())

    assert app.run(w, run_id="ena") == "paid"
    assert calls["pay"] == 3
    retried = [e for e in app.history("ena") if e.event is EventType.STEP_RETRIED]
    assert [e.attempt for e in retried] == [1, 2]


@both
def test_uncertain_write_without_reconcile_needs_attention(app: cairn.App, kind: Kind, calls: Calls) -> None:
    def pay(op: cairn.Operation) -> str:
        calls.hit("pay")
        raise TimeoutError("no answer")

    tool = app.tool(effect="write")(kind.fn(pay))

    @kind.workflow(app, "w")
    def w(ctx: cairn.Context) -> Flow[str]:
        return (yield tool())

    app.start(w, run_id="na")
    assert execute_once(app, "na") == "suspended"
    run = app.get_run("na")
    assert run.status is RunStatus.NEEDS_ATTENTION
    entry = [e for e in app.history("na") if e.event is EventType.RUN_NEEDS_ATTENTION][-1]
    assert entry.detail is not None
    assert entry.detail["operation_id"] == cairn.operation_id("na", 0)
    assert "TimeoutError" in entry.detail["why"]
    app.resolve_operation("na", 0, done=True, result="paid-by-operator")
    assert app.resume("na") == "paid-by-operator"
    assert calls["pay"] == 1


@both
def test_malformed_tool_result_is_a_classified_failure(app: cairn.App, kind: Kind) -> None:
    def lookup() -> object:
        return {"id": "r-1", "amount": "lots"}

    tool = app.tool(effect="read", schema=Receipt)(kind.fn(lookup))

    @kind.workflow(app, "w")
    def w(ctx: cairn.Context) -> Flow[str]:
        try:
            yield tool()
        except cairn.StepFailed as failure:
            return failure.error_type
        return "unreachable"

    assert app.run(w, run_id="bad") == "ToolResultInvalid"
    failed = [e for e in app.history("bad") if e.event is EventType.STEP_FAILED]
    assert failed[0].detail is not None
    assert failed[0].detail["error"]["class"] == "terminal"


@both
def test_tool_result_is_validated_into_the_schema(app: cairn.App, kind: Kind) -> None:
    def lookup() -> object:
        return {"id": "r-1", "amount": 3}

    tool = app.tool(effect="read", schema=Receipt)(kind.fn(lookup))

    @kind.workflow(app, "w")
    def w(ctx: cairn.Context) -> Flow[int]:
        receipt = yield tool()
        assert isinstance(receipt, Receipt)
        return receipt.amount

    assert app.run(w, run_id="ok") == 3


@both
def test_tool_timeout_makes_a_write_uncertain(app: cairn.App, kind: Kind, calls: Calls) -> None:
    """A sync tool runs in a thread that cannot be stopped; an async one is
    cancelled. Either way the effect may have happened: reconcile first."""
    gate = threading.Event()
    positions: list[int | None] = []

    def reconcile(op: cairn.Operation) -> cairn.NotFound:
        calls.hit("reconcile")
        return cairn.NotFound()

    def slow(op: cairn.Operation) -> str:
        calls.hit("slow")
        try:  # the thread sees the step's identity
            positions.append(cairn.step_info().position)
        except cairn.CairnError:
            positions.append(None)
        if calls["slow"] == 1:
            gate.wait(2)
        return "done"

    async def slow_async(op: cairn.Operation) -> str:
        calls.hit("slow")
        if calls["slow"] == 1:
            await asyncio.sleep(2)
        return "done"

    body = slow_async if kind.is_async else slow
    tool = app.tool(effect="write", reconcile=kind.fn(reconcile), timeout=0.05,
                    retry=cairn.RetryPolicy(max_attempts=2, initial_delay=0, jitter=0))(body)

    @kind.workflow(app, "w")
    def w(ctx: cairn.Context) -> Flow[str]:
        return (yield tool())

    try:
        assert app.run(w, run_id="to") == "done"
    finally:
        gate.set()
    assert calls["reconcile"] == 1  # asked before sending again
    assert calls["slow"] == 2
    if not kind.is_async:
        assert positions == [0, 0]


def test_reconcile_only_for_write_tools(app: cairn.App) -> None:
    with pytest.raises(ValueError, match="only meaningful"):
        app.tool(effect="read", reconcile=lambda op: cairn.NotFound())(lambda: 1)


def test_a_sync_tool_with_an_async_reconciler_is_an_error(app: cairn.App, calls: Calls) -> None:
    """Refused at registration (issue 10 item 4): at run time it would fail
    only after an uncertain outcome, the worst moment to find out."""
    async def reconcile(op: cairn.Operation) -> cairn.NotFound:
        calls.hit("reconcile")
        return cairn.NotFound()

    def pay(op: cairn.Operation) -> str:
        calls.hit("pay")
        raise ConnectionResetError("dropped")

    with pytest.raises(TypeError, match="tool 'pay' is sync but its reconcile function is async"):
        app.tool(effect="write", reconcile=reconcile)(pay)
    assert calls.counts == {}
