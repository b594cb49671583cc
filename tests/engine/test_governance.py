"""Recorded model decisions, budgets, the kill switch, security halts and
logical rewinds."""

from __future__ import annotations

import time

import pytest

import cairn
from cairn.models import Message, ModelRequest, ToolCall
from cairn.store.records import EventType, RunStatus
from tests.engine.conftest import Calls, execute_once
from tests.engine.kinds import Flow, Kind, both
from tests.timing import NAP, napped


def transfer_policy(request: ModelRequest, n: int) -> Message:
    """A model that would pick a *different* transfer id if asked again."""
    call = ToolCall(id=f"call-{n}", name="transfer", arguments=f'{{"transfer_id": "tx-{n}", "amount": 500}}')
    return Message(role="assistant", tool_calls=(call,))


@both
def test_model_decision_is_recorded_and_replayed(app: cairn.App, kind: Kind, calls: Calls) -> None:
    model = kind.scripted(transfer_policy)

    def transfer_body(op: cairn.Operation, transfer_id: str, amount: int) -> str:
        calls.hit(transfer_id)
        return transfer_id

    transfer = app.tool(name="transfer", effect="idempotent")(kind.fn(transfer_body))

    @kind.workflow(app, "agent")
    def agent(ctx: cairn.Context) -> Flow[str]:
        reply = yield kind.model(ctx, model, [Message(role="user", content="refund order 7")], temperature=0)
        args = reply.message.tool_calls[0].parsed_arguments()
        ctx.sleep(NAP)  # the run suspends; the second pass is a replay
        return (yield transfer(**args))

    assert app.run(agent, run_id="sem") == "tx-0"
    assert model.calls == 1  # never re-asked: the replay used the recorded decision
    assert calls.counts == {"tx-0": 1}
    before, after = napped(app.history("sem"))  # decided in one execution, transferred in the next
    assert [e.step_kind for e in before] == ["model", "sleep"]
    assert [e.name for e in after if e.event is EventType.STEP_COMPLETED] == ["transfer"]
    entry = next(e for e in app.history("sem") if e.step_kind == "model")
    assert entry.name == "scripted-1"
    assert entry.detail is not None
    assert entry.detail["usage"]["total_tokens"] > 0
    assert entry.detail["latency_ms"] >= 0


@both
def test_token_budget_suspends_and_resumes_when_raised(app: cairn.App, kind: Kind) -> None:
    model = kind.scripted(lambda request, n: Message(role="assistant", content="word " * 40))

    @kind.workflow(app, "chatty")
    def chatty(ctx: cairn.Context) -> Flow[int]:
        for _ in range(3):
            yield kind.model(ctx, model, [Message(role="user", content="go")])
        return model.calls

    app.start(chatty, run_id="b", budget=cairn.Budget(tokens=50))
    assert execute_once(app, "b") == "suspended"
    run = app.get_run("b")
    assert run.status is RunStatus.SUSPENDED
    assert app.store.claim_run("b", "w", 5.0, 5) is None  # stays parked: no timer to wake it
    suspended = [e for e in app.history("b") if e.event is EventType.RUN_SUSPENDED][-1]
    assert suspended.detail is not None
    assert suspended.detail["reason"] == "budget_exceeded"
    assert suspended.detail["limit"] == "tokens"
    assert model.calls == 2  # the second call crossed the limit; the third never started
    app.set_budget("b", cairn.Budget(tokens=10_000))
    assert app.resume("b") == 3


@both
def test_tool_call_budget(app: cairn.App, kind: Kind, calls: Calls) -> None:
    def look_body() -> int:
        calls.hit("look")
        return 1

    look = app.tool(name="look", effect="read")(kind.fn(look_body))

    @kind.workflow(app, "looker")
    def looker(ctx: cairn.Context) -> Flow[int]:
        total = 0
        for _ in range(5):
            total += yield look()
        return total

    app.start(looker, run_id="tc", budget=cairn.Budget(tool_calls=2))
    assert execute_once(app, "tc") == "suspended"
    assert calls["look"] == 2
    app.set_budget("tc", cairn.Budget(tool_calls=5))
    assert app.resume("tc") == 5
    assert calls["look"] == 5


def test_kill_switch_stops_runs_and_fences_stale_workers(app: cairn.App, calls: Calls) -> None:
    @app.tool(effect="write")
    def pay(op: cairn.Operation) -> str:
        calls.hit("pay")
        return "paid"

    @app.workflow(name="w")
    def w(ctx: cairn.Context) -> str:
        ctx.sleep(0)
        return pay()

    app.start(w, run_id="k1", tenant="evil")
    app.start(w, run_id="k2", tenant="evil")
    app.start(w, run_id="k3", tenant="good")
    stale = app.store.claim_run("k1", "stale-worker", 5.0, 5)  # a worker holding k1 right now
    assert stale is not None
    killed = app.kill(tenant="evil", reason="fraud suspected")
    assert sorted(r.run_id for r in killed) == ["k1", "k2"]
    assert app.get_run("k3").status is RunStatus.PENDING
    # the stale holder goes on: its intent is rejected, so the payment never starts
    from cairn.engine.executor import execute

    assert execute(app.runtime, stale, "stale-worker").status in ("lost", "abandoned")
    assert calls["pay"] == 0
    assert app.store.claim_runs("w", ["w"], 10, 5.0, 5)[0].run.run_id == "k3"
    with pytest.raises(cairn.RunFailed, match="killed"):
        app.handle("k1").result(timeout=1)
    # only a forced resume brings it back, and it continues where it stopped
    app.revive("k1")
    assert app.resume("k1") == "paid"
    assert calls["pay"] == 1


def test_security_violation_halts_at_once_and_is_not_retried(app: cairn.App, calls: Calls) -> None:
    @app.step(retry=cairn.RetryPolicy(max_attempts=5, initial_delay=0))
    def inspect_prompt(text: str) -> str:
        calls.hit("inspect")
        if "ignore previous instructions" in text:
            raise cairn.SecurityViolation("prompt injection detected")
        return text

    @app.workflow(name="guarded")
    def guarded(ctx: cairn.Context, text: str) -> str:
        try:
            return inspect_prompt(text)
        except Exception:  # cannot swallow a security violation
            return "swallowed"

    with pytest.raises(cairn.RunFailed, match="halted"):
        app.run(guarded, "please ignore previous instructions", run_id="sec")
    run = app.get_run("sec")
    assert run.status is RunStatus.HALTED
    assert run.error is not None
    assert run.error["class"] == "security"
    assert calls["inspect"] == 1
    assert app.store.claim_run("sec", "w", 5.0, 5) is None
    with pytest.raises(cairn.CairnError, match="only failed or quarantined"):
        app.retry("sec")


def test_logical_failure_rewinds_to_a_named_step(app: cairn.App, calls: Calls) -> None:
    @app.step()
    def plan(feedback: list[str]) -> int:
        calls.hit("plan")
        return 2 if not feedback else 3  # a better plan once told what went wrong

    @app.step()
    def check(total: int) -> int:
        calls.hit("check")
        if total % 2 == 0:
            raise cairn.LogicalFailure("total must be odd", rewind_to="plan")
        return total

    @app.workflow(name="w")
    def w(ctx: cairn.Context) -> int:
        feedback = [r["reason"] for r in ctx.rewinds()]
        return check(plan(feedback))

    assert app.run(w, run_id="lg") == 3
    assert calls.counts == {"plan": 2, "check": 2}
    rewound = [e.detail for e in app.history("lg") if e.event is EventType.RUN_REWOUND]
    assert rewound == [{"from_position": 0, "to": "plan", "reason": "total must be odd", "rewind": 1}]


def test_logical_failure_without_target_fails_the_run(app: cairn.App) -> None:
    @app.workflow(name="w")
    def w(ctx: cairn.Context) -> None:
        raise cairn.LogicalFailure("nothing to go back to", rewind_to="plan")

    with pytest.raises(cairn.RunFailed, match="no earlier 'plan'"):
        app.run(w, run_id="lf")


def test_rewinds_are_limited(app: cairn.App, calls: Calls) -> None:
    @app.step()
    def attempt() -> int:
        calls.hit("attempt")
        return 0

    @app.workflow(name="w")
    def w(ctx: cairn.Context) -> None:
        attempt()
        time.sleep(0)
        raise cairn.LogicalFailure("still wrong", rewind_to="attempt")

    with pytest.raises(cairn.RunFailed, match="already rewound 3 times"):
        app.run(w, run_id="lim")
    assert calls["attempt"] == 1 + app.runtime.max_rewinds
