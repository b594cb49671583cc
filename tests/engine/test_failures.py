"""Non-determinism, retries, error classification and operator retry."""

from __future__ import annotations

import time

import pytest

import cairn
from cairn.store.records import EventType, RunStatus
from tests.engine.conftest import Calls, execute_once
from tests.engine.kinds import Flow, Kind, both
from tests.timing import NAP, wait_out_nap


def test_nondeterminism_fails_the_run_and_overwrites_nothing(app: cairn.App) -> None:
    version = {"v": 1}

    @app.step()
    def a() -> str:
        return "a"

    @app.step()
    def b() -> str:
        return "b"

    @app.workflow(name="wf")
    def wf(ctx: cairn.Context) -> str:
        first = a() if version["v"] == 1 else b()
        ctx.sleep(NAP)
        return first

    app.start(wf, run_id="nd")
    # the first pass records step a and suspends on the timer; then the code changes
    assert execute_once(app, "nd") == "suspended"
    before = [e for e in app.history("nd") if e.position is not None]
    version["v"] = 2
    wait_out_nap()
    with pytest.raises(cairn.RunFailed, match="NonDeterminismError"):
        app.resume("nd")
    run = app.get_run("nd")
    assert run.status is RunStatus.FAILED
    assert run.error is not None
    assert "journal recorded step 'a'" in run.error["message"]
    assert "workflow requested step 'b'" in run.error["message"]
    after = [e for e in app.history("nd") if e.position is not None]
    assert after == before  # the journal is untouched


def test_changed_step_arguments_are_detected(app: cairn.App) -> None:
    arg = {"x": 1}

    @app.step()
    def f(x: int) -> int:
        return x

    @app.workflow(name="args")
    def args(ctx: cairn.Context) -> int:
        value = f(arg["x"])
        ctx.sleep(NAP)
        return value

    app.start(args, run_id="ar")
    assert execute_once(app, "ar") == "suspended"
    arg["x"] = 2
    wait_out_nap()
    with pytest.raises(cairn.RunFailed, match="input #"):
        app.resume("ar")


@both
def test_retries_wait_durably_then_succeed(app: cairn.App, kind: Kind, calls: Calls) -> None:
    def flaky_body() -> str:
        calls.hit("flaky")
        if calls["flaky"] < 3:
            raise TimeoutError("upstream slow")
        return "ok"

    policy = cairn.RetryPolicy(max_attempts=4, initial_delay=0.05, backoff=2.0, jitter=0.0)
    flaky = app.step(name="flaky", retry=policy)(kind.fn(flaky_body))

    @kind.workflow(app, "r")
    def r(ctx: cairn.Context) -> Flow[str]:
        return (yield flaky())

    started = time.monotonic()
    assert app.run(r, run_id="rt") == "ok"
    assert time.monotonic() - started >= 0.05 + 0.1  # the two backoffs were waited out
    history = app.history("rt")
    retried = [e for e in history if e.event is EventType.STEP_RETRIED]
    assert [e.attempt for e in retried] == [1, 2]
    assert all(e.detail and e.detail["error"]["type"] == "TimeoutError" for e in retried)
    # each wait was a suspension: the worker was released, then woken
    assert sum(e.event is EventType.RUN_SUSPENDED for e in history) == 2
    assert sum(e.event is EventType.RUN_WOKEN for e in history) == 2


@both
def test_terminal_errors_are_not_retried(app: cairn.App, kind: Kind, calls: Calls) -> None:
    def bad_body() -> None:
        calls.hit("bad")
        raise ValueError("invalid account")

    policy = cairn.RetryPolicy(max_attempts=5, initial_delay=0.0, no_retry_on=(ValueError,))
    bad = app.step(name="bad", retry=policy)(kind.fn(bad_body))

    @kind.workflow(app, "t")
    def t(ctx: cairn.Context) -> Flow[None]:
        yield bad()

    with pytest.raises(cairn.RunFailed, match="invalid account"):
        app.run(t, run_id="te")
    assert calls["bad"] == 1
    failed = [e for e in app.history("te") if e.event is EventType.STEP_FAILED]
    assert len(failed) == 1
    assert failed[0].detail == {
        "error": {"type": "ValueError", "message": "invalid account", "retryable": False, "class": "terminal"}
    }
    run = app.get_run("te")
    assert run.error is not None
    assert run.error["type"] == "StepFailed"
    assert run.error["step"].endswith("bad")


@both
def test_exhausted_retries_raise_step_failed_inside_the_workflow(
    app: cairn.App, kind: Kind, calls: Calls
) -> None:
    def down_body() -> None:
        calls.hit("down")
        raise ConnectionError("refused")

    down = app.step(name="down", retry=cairn.RetryPolicy(max_attempts=2, initial_delay=0.0, jitter=0.0))(
        kind.fn(down_body))

    @kind.workflow(app, "handled")
    def handled(ctx: cairn.Context) -> Flow[str]:
        try:
            yield down()
        except cairn.StepFailed as failure:
            return f"fallback after {failure.attempts}: {failure.error_type}"
        return "unreachable"

    assert app.run(handled, run_id="h") == "fallback after 2: ConnectionError"
    assert calls["down"] == 2
    assert [e.event for e in app.history("h") if e.position == 0] == [
        EventType.STEP_RETRIED,
        EventType.STEP_FAILED,
    ]


@both
def test_recorded_step_failure_is_raised_again_on_replay(app: cairn.App, kind: Kind, calls: Calls) -> None:
    def down_body() -> None:
        calls.hit("down")
        raise ConnectionError("refused")

    down = app.step(name="down")(kind.fn(down_body))

    @kind.workflow(app, "replayed_failure")
    def replayed_failure(ctx: cairn.Context) -> Flow[str]:
        try:
            yield down()
        except cairn.StepFailed as failure:
            outcome = failure.error_type
        ctx.sleep(NAP)
        return outcome

    app.start(replayed_failure, run_id="rf")
    assert execute_once(app, "rf") == "suspended"
    wait_out_nap()
    assert app.resume("rf") == "ConnectionError"
    assert calls["down"] == 1  # the replay raised the recorded failure without running the body


def test_retry_is_refused_for_runs_that_did_not_fail(app: cairn.App) -> None:
    @app.workflow(name="fine")
    def fine(ctx: cairn.Context) -> int:
        return 1

    app.run(fine, run_id="f")
    with pytest.raises(cairn.CairnError, match="only failed or quarantined"):
        app.retry("f")
    with pytest.raises(cairn.RunNotFound):
        app.retry("missing")


def test_workflow_exception_outside_steps_fails_the_run(app: cairn.App) -> None:
    @app.workflow(name="oops")
    def oops(ctx: cairn.Context) -> None:
        raise KeyError("missing key")

    with pytest.raises(cairn.RunFailed, match="KeyError"):
        app.run(oops, run_id="o")
    assert app.get_run("o").status is RunStatus.FAILED
    assert [e.event for e in app.history("o")][-1] is EventType.RUN_FAILED
