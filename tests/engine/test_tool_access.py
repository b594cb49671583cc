"""Per-tool authorization for local tools (``app.tool(..., access=...)``):
a tenant or workflow not allowed is refused before the tool runs, and the
refusal is recorded in the journal (and raised again on replay)."""

from __future__ import annotations

import pytest

import cairn
from cairn.store.records import EventType
from tests.timing import NAP


def test_only_the_allowed_tenants_and_workflows_call_the_tool(app: cairn.App) -> None:
    ran: list[str] = []

    @app.tool(effect="write", access=cairn.ToolAccess(tenants=frozenset({"acme"}),
                                                      workflows=frozenset({"payroll"})))
    def pay(who: str) -> str:
        ran.append(who)
        return f"paid {who}"

    @app.workflow(name="payroll")
    def payroll(ctx: cairn.Context, who: str) -> str:
        return pay(who)

    @app.workflow(name="intruder")
    def intruder(ctx: cairn.Context, who: str) -> str:
        return pay(who)

    with pytest.raises(cairn.RunFailed, match=r"ToolRefused: tool 'pay' refused: tenant 'default' may not"):
        app.run(payroll, "mallory", run_id="wrong-tenant")
    with pytest.raises(cairn.RunFailed, match=r"tool 'pay' refused: workflow 'intruder' may not"):
        app.run(intruder, "mallory", run_id="wrong-workflow", tenant="acme")
    assert ran == []  # never ran, no intent written
    for run_id in ("wrong-tenant", "wrong-workflow"):
        history = app.history(run_id)
        [refused] = [e for e in history if e.event is EventType.STEP_FAILED]
        assert refused.step_kind == "tool"
        assert refused.name == "pay"
        assert (refused.detail or {})["error"]["type"] == "ToolRefused"
        assert not [e for e in history if e.event is EventType.OP_INTENT]
    assert app.run(payroll, "ada", run_id="allowed", tenant="acme") == "paid ada"
    assert ran == ["ada"]


def test_a_recorded_refusal_is_raised_again_on_replay(app: cairn.App) -> None:
    """A workflow that catches the refusal and goes on (to a durable sleep:
    the rest runs on a replay) sees the same refusal at the same position."""
    seen: list[str] = []

    @app.tool(effect="read", access=cairn.ToolAccess(tenants=frozenset({"acme"})))
    def secret() -> str:
        return "the secret"

    @app.workflow(name="curious")
    def curious(ctx: cairn.Context) -> str:
        try:
            secret()
        except cairn.StepFailed as exc:
            seen.append(str(exc))
        ctx.sleep(NAP)  # a suspension whatever the machine's load: the replay is what is checked
        return "gave up"

    assert app.run(curious, run_id="curious") == "gave up"
    assert len(seen) == 2  # the first execution and the replay after the sleep
    assert seen[0] == seen[1]
    assert "ToolRefused" in seen[0]


def test_access_takes_sets_of_names() -> None:
    with pytest.raises(cairn.InvalidArgument, match=r"is a set of names"):
        cairn.ToolAccess(tenants="acme")  # type: ignore[arg-type]
    assert cairn.ToolAccess(tenants={"a"}).tenants == frozenset({"a"})  # type: ignore[arg-type]
