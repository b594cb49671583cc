"""Per-tool authorization by token role (``cairn.ToolAccess(role=...)``),
on both backends: a run has the rights it was started with, read from its
row wherever it executes; a run started as a low role calling a tool
reserved to ``admin`` is refused and the refusal recorded; nothing a run's
own SQL writes can raise its rights; a child has its parent's rights."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

import cairn
from cairn.store.records import EventType
from tests.engine.test_transactions import sql

ADMIN_ONLY = cairn.ToolAccess(role="admin")


def register(app: cairn.App, ran: list[str]) -> dict[str, Any]:
    """The same tool and workflows on any App (another App is another worker)."""

    @app.tool(effect="write", access=ADMIN_ONLY)
    def drop_table(name: str) -> str:
        ran.append(name)
        return f"dropped {name}"

    @app.workflow(name="cleanup")
    def cleanup(ctx: cairn.Context, name: str) -> str:
        return drop_table(name)

    @app.workflow(name="delegate")
    def delegate(ctx: cairn.Context, name: str) -> str:
        return ctx.child(cleanup, name)

    @app.transaction(name="promote-myself")
    def promote(tx: cairn.Tx, run_id: str) -> int:
        return tx.execute(sql(tx, "UPDATE runs SET started_role = 'admin', started_token = NULL "
                                  "WHERE run_id = ?"), (run_id,)).rowcount

    @app.workflow(name="climber")
    def climber(ctx: cairn.Context, name: str) -> str:
        with contextlib.suppress(cairn.StepFailed):  # refused: it goes on with the rights it has
            promote(ctx.run_id)
        return drop_table(name)

    return {"cleanup": cleanup, "delegate": delegate, "climber": climber}


def refusals(app: cairn.App, run_id: str) -> list[cairn.HistoryEvent]:
    return [e for e in app.history(run_id) if e.event is EventType.STEP_FAILED and e.step_kind == "tool"]


def test_a_run_below_the_tools_role_is_refused_and_the_refusal_recorded(app: cairn.App) -> None:
    ran: list[str] = []
    flows = register(app, ran)
    for role in ("viewer", "operator", None):
        run_id = f"as-{role}"
        with pytest.raises(cairn.RunFailed, match=r"ToolRefused: tool 'drop_table' refused: a run started "):
            app.run(flows["cleanup"], "users", run_id=run_id, started_role=role,
                    started_token="tok-low" if role else None)
        [refused] = refusals(app, run_id)
        message = (refused.detail or {})["error"]["message"]
        assert ("without a token role" if role is None else f"as {role} (token tok-low)") in message
        assert "it needs admin" in message
        assert not [e for e in app.history(run_id) if e.event is EventType.OP_INTENT]
    assert ran == []
    assert app.run(flows["cleanup"], "users", run_id="as-admin", started_role="admin") == "dropped users"
    assert app.run(flows["cleanup"], "logs", run_id="as-installation",
                   started_role="installation") == "dropped logs"
    assert ran == ["users", "logs"]


def test_a_run_resumed_by_another_worker_has_the_rights_it_started_with(app: cairn.App) -> None:
    """Started here (not executed), executed by another App on the same
    database that was told nothing about the role: the row decides."""
    ran: list[str] = []
    flows = register(app, ran)
    app.start(flows["cleanup"], "users", run_id="low", started_role="viewer", started_token="t1")
    app.start(flows["cleanup"], "users", run_id="high", started_role="admin", started_token="t2")
    other = cairn.App(db=app.db_url, lease_seconds=5.0)
    try:
        register(other, ran)
        with pytest.raises(cairn.RunFailed, match=r"started as viewer \(token t1\) may not call it"):
            other.resume("low")
        assert other.resume("high") == "dropped users"
    finally:
        other.close()
    assert ran == ["users"]
    created = app.history("low")[0]
    assert created.event is EventType.RUN_CREATED
    assert (created.detail or {})["started_role"] == "viewer"


def test_a_child_has_its_parents_rights(app: cairn.App) -> None:
    ran: list[str] = []
    flows = register(app, ran)
    with pytest.raises(cairn.RunFailed, match=r"ChildFailed"):
        app.run(flows["delegate"], "users", run_id="viewer-parent", started_role="viewer")
    [child] = [r for r in app.list_runs() if r.parent_run_id == "viewer-parent"]
    assert app.store.started_with(child.run_id) == ("viewer", None)
    assert refusals(app, child.run_id)
    assert app.run(flows["delegate"], "users", run_id="admin-parent", started_role="admin") == "dropped users"
    assert ran == ["users"]


def test_a_runs_own_sql_cannot_raise_its_rights(app: cairn.App) -> None:
    """The run's transactional step rewrites its own row to admin: the
    database refuses the change (the step fails), and the tool still refuses."""
    ran: list[str] = []
    flows = register(app, ran)
    with pytest.raises(cairn.RunFailed, match=r"started as viewer \(token tok\) may not call it"):
        app.run(flows["climber"], "users", run_id="climber", started_role="viewer", started_token="tok")
    assert ran == []
    assert app.store.started_with("climber") == ("viewer", "tok")
    [failed] = [e for e in app.history("climber") if e.event is EventType.STEP_FAILED
                and e.step_kind != "tool"]
    assert "never change" in str((failed.detail or {})["error"])


def test_the_started_role_is_checked_when_the_run_is_started(app: cairn.App) -> None:
    ran: list[str] = []
    flows = register(app, ran)
    with pytest.raises(cairn.InvalidArgument, match=r"started as one of viewer, operator, admin, install"):
        app.start(flows["cleanup"], "users", run_id="bad", started_role="root")
    with pytest.raises(cairn.InvalidArgument, match=r"records the token's id and role"):
        app.start(flows["cleanup"], "users", run_id="bad", started_token="tok")
    assert app.store.get_run("bad") is None
    with pytest.raises(cairn.InvalidArgument, match=r"ToolAccess\(role=...\) is one of"):
        cairn.ToolAccess(role="superuser")
