"""A suspension workflow code swallows still suspends the run (issue 30).

A suspension (``ctx.sleep``, a signal or an approval to wait for) is a
``BaseException`` so that ``except Exception`` lets it by; a bare ``except:``
or ``except BaseException`` does not. Once a run has begun to suspend, every
further journaled call raises the suspension again and so does the workflow
returning: the run waits as it asked, nothing after the wait runs before it
is over, and a ``finally:`` block's step waits for the decision too.

Each test runs on SQLite and PostgreSQL, as a sync and as an async workflow
(written out: the async one awaits, so the suspension passes through its own
``try``).
"""

# ruff: noqa: SIM105  (the point of these workflows is a try/except that swallows)
from __future__ import annotations

import time
from typing import Any

import cairn
from cairn.store.records import RunStatus
from tests.engine.conftest import Calls, execute_once
from tests.engine.kinds import Kind, both


@both
def test_a_sleep_swallowed_by_a_bare_except_still_sleeps(app: cairn.App, kind: Kind, calls: Calls) -> None:
    @app.step(name="after")
    def after() -> str:
        calls.hit("after")
        return "after"

    if kind.is_async:
        @app.workflow(name="napper")
        async def napper(ctx: cairn.Context) -> str:
            try:
                await ctx.sleep(30)
            except BaseException:  # swallows the suspension
                pass
            return "woke"
    else:
        @app.workflow(name="napper")
        def napper(ctx: cairn.Context) -> str:
            try:
                ctx.sleep(30)
            except:  # noqa: E722  (the point: a bare except)
                pass
            return "woke"

    run_id = app.start(napper).run_id
    assert execute_once(app, run_id) == "suspended"
    record = app.get_run(run_id)
    assert record.status is RunStatus.SUSPENDED
    assert record.wake_at is not None
    assert record.wake_at > time.time() + 20
    assert calls["after"] == 0


@both
def test_a_journaled_call_after_a_swallowed_sleep_suspends_instead(
    app: cairn.App, kind: Kind, calls: Calls
) -> None:
    @app.step(name="after")
    def after() -> str:
        calls.hit("after")
        return "after"

    if kind.is_async:
        @app.workflow(name="napper")
        async def napper(ctx: cairn.Context) -> str:
            try:
                await ctx.sleep(30)
            except BaseException:
                pass
            return str(after())
    else:
        @app.workflow(name="napper")
        def napper(ctx: cairn.Context) -> str:
            try:
                ctx.sleep(30)
            except BaseException:
                pass
            return str(after())

    run_id = app.start(napper).run_id
    assert execute_once(app, run_id) == "suspended"
    assert calls["after"] == 0
    assert not [e for e in app.history(run_id) if e.step_kind == "step"]


def _pay(app: cairn.App, kind: Kind, calls: Calls) -> Any:
    def pay(op: cairn.Operation, cents: int) -> int:
        calls.hit("pay")
        return cents

    return app.tool(effect="write", name="pay", approval=True)(kind.fn(pay))


def _notify(app: cairn.App, calls: Calls) -> Any:
    @app.step(name="notify")
    def notify(what: str) -> str:
        calls.hit("notify")
        return what

    return notify


@both
def test_an_approval_swallowed_around_a_protected_tool_still_asks(
    app: cairn.App, kind: Kind, calls: Calls
) -> None:
    pay, notify = _pay(app, kind, calls), _notify(app, calls)

    if kind.is_async:
        @app.workflow(name="payer")
        async def payer(ctx: cairn.Context) -> str:
            try:
                await pay(500)
            except BaseException:
                pass
            return str(notify("went on"))
    else:
        @app.workflow(name="payer")
        def payer(ctx: cairn.Context) -> str:
            try:
                pay(500)
            except BaseException:
                pass
            return str(notify("went on"))

    run_id = app.start(payer).run_id
    assert execute_once(app, run_id) == "suspended"
    assert (calls["pay"], calls["notify"]) == (0, 0)
    (request,) = app.approvals(run_id=run_id)
    assert app.get_run(run_id).waiting_for == f"approval:{request.request_id}"
    app.approve(run_id, request.request_id)
    assert execute_once(app, run_id) == "completed"
    assert (calls["pay"], calls["notify"]) == (1, 1)


@both
def test_a_finally_step_waits_for_the_decision(app: cairn.App, kind: Kind, calls: Calls) -> None:
    pay, notify = _pay(app, kind, calls), _notify(app, calls)

    if kind.is_async:
        @app.workflow(name="payer")
        async def payer(ctx: cairn.Context) -> int:
            try:
                return int(await pay(500))
            finally:
                notify("done")
    else:
        @app.workflow(name="payer")
        def payer(ctx: cairn.Context) -> int:
            try:
                return int(pay(500))
            finally:
                notify("done")

    run_id = app.start(payer).run_id
    assert execute_once(app, run_id) == "suspended"
    assert (calls["pay"], calls["notify"]) == (0, 0)  # the finally's effect waits for the decision
    (request,) = app.approvals(run_id=run_id)
    app.approve(run_id, request.request_id)
    assert execute_once(app, run_id) == "completed"
    assert app.handle(run_id).result(timeout=5) == 500
    assert (calls["pay"], calls["notify"]) == (1, 1)
