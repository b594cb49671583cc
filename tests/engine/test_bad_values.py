"""Issue 30 item 3: a number no run can use is a one-line error at the call,
and nothing is stored. On both backends where a store is involved.

Before: ``ctx.sleep(nan)`` did not sleep; ``ctx.sleep(inf)`` and
``timeout=inf`` failed with an encoding error; ``priority=2**70`` raised a
raw ``OverflowError`` and ``priority=nan`` a ``StoreError`` ("database
failure"); ``Budget(tokens=nan)`` never triggered; ``RetryPolicy(
initial_delay=nan)`` was accepted; ``handle.result(timeout=nan)`` blocked
for ever; a write tool returning an integer beyond 64 bits left its run
``failed`` after its effect happened.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

import cairn
from cairn.engine.budget import Budget
from cairn.errors import InvalidArgument
from cairn.retry import RetryPolicy
from cairn.store.records import EventType, RunFilter, RunStatus
from tests.engine.conftest import execute_once

NAN, INF = math.nan, math.inf


def test_a_sleep_or_a_timeout_that_is_no_duration_fails_at_the_call(app: cairn.App) -> None:
    cases = {"sleep-nan": lambda ctx: ctx.sleep(NAN), "sleep-inf": lambda ctx: ctx.sleep(INF),
             "sleep-text": lambda ctx: ctx.sleep("5"),
             "signal-inf": lambda ctx: ctx.wait_for_signal("go", timeout=INF),
             "signal-nan": lambda ctx: ctx.wait_for_signal("go", timeout=NAN),
             "signal-negative": lambda ctx: ctx.wait_for_signal("go", timeout=-1),
             "approval-inf": lambda ctx: ctx.request_approval("pay", {"x": 1}, timeout=INF),
             "approval-nan": lambda ctx: ctx.request_approval("pay", {"x": 1}, timeout=NAN)}
    for name, call in cases.items():
        @app.workflow(name=name)
        def wf(ctx: cairn.Context, call: Any = call) -> str:
            try:
                call(ctx)
            except InvalidArgument as exc:
                return f"refused: {exc}"
            return "went ahead"

        app.start(wf, run_id=name)
        assert execute_once(app, name) == "completed", name
        result = app.handle(name).result(timeout=5)
        assert result.startswith("refused: "), (name, result)
        assert "\n" not in result
        steps = [e for e in app.history(name) if e.step_kind is not None]
        assert steps == [], (name, steps)  # nothing recorded for the call


@pytest.mark.parametrize("priority", [2**70, -(2**70), NAN, 1.5, "1", True])
def test_a_priority_that_is_no_64_bit_integer_is_refused_at_start(app: cairn.App, priority: Any) -> None:
    @app.workflow(name="echo")
    def echo(ctx: cairn.Context) -> int:
        return 1

    with pytest.raises(InvalidArgument, match="priority"):
        app.start(echo, priority=priority)
    assert app.store.list_runs(RunFilter()) == []


def test_the_largest_priorities_are_accepted(app: cairn.App) -> None:
    @app.workflow(name="echo")
    def echo(ctx: cairn.Context) -> int:
        return 1

    for priority in (2**63 - 1, -(2**63)):
        assert app.get_run(app.start(echo, priority=priority).run_id).priority == priority


@pytest.mark.parametrize("limits", [{"tokens": NAN}, {"cost": NAN}, {"cost": INF}, {"wall_seconds": NAN},
                                    {"tool_calls": 1.5}, {"tokens": -1}, {"cost": -0.5}, {"tokens": True}])
def test_a_budget_limit_that_could_never_trigger_is_refused(limits: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument, match=next(iter(limits))):
        Budget(**limits)


@pytest.mark.parametrize("field", ["initial_delay", "max_delay", "backoff", "jitter"])
def test_a_retry_policy_with_nan_is_refused(field: str) -> None:
    with pytest.raises(InvalidArgument, match=field):
        RetryPolicy(**{field: NAN})
    with pytest.raises(InvalidArgument, match=field):
        RetryPolicy(**{field: INF})


def test_waiting_for_a_result_with_a_nan_timeout_is_refused(app: cairn.App) -> None:
    @app.workflow(name="echo")
    def echo(ctx: cairn.Context) -> int:
        return 1

    handle = app.start(echo)
    for bad in (NAN, -1.0, "5"):
        with pytest.raises(InvalidArgument, match="timeout"):
            handle.result(timeout=bad)  # type: ignore[arg-type]


def test_a_write_tool_returning_an_integer_beyond_64_bits_needs_attention(app: cairn.App) -> None:
    sent: list[int] = []

    @app.tool(effect="write")
    def transfer(amount: int) -> Any:
        sent.append(amount)
        return {"receipt": 2**70}  # the money moved; its receipt cannot be recorded

    @app.workflow(name="pay")
    def wf(ctx: cairn.Context) -> Any:
        return transfer(5)

    app.start(wf, run_id="p")
    app.worker(concurrency=1, poll_interval=0.01).run(install_signals=False, max_idle=0.3)
    assert app.get_run("p").status is RunStatus.NEEDS_ATTENTION
    assert sent == [5]
    attention = [e for e in app.history("p") if e.event is EventType.RUN_NEEDS_ATTENTION][-1]
    assert "64 bits" in attention.detail["why"]  # type: ignore[index]
