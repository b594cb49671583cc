"""The role a run was started with, attacked by a tenant's SQL role on
PostgreSQL (row-level security): whatever that role can write to its own
runs, it cannot raise a run's rights (migration 0033).

A tenant's role may insert and update its runs (0014) and mint its own
tenant's tokens (0011), so a run it inserts as ``admin`` is within what it
already is; what it must not do is promote a run that exists (started as
``viewer``) or record ``installation``, the operator of every tenant."""

from __future__ import annotations

import contextlib

import psycopg
import pytest

import cairn
from cairn.store.records import EventType
from tests.store.contract.helpers import new_run
from tests.store.test_postgres_rls import Deployment, deployment  # noqa: F401 - the fixture

PROMOTIONS = {
    "role": "UPDATE runs SET started_role = 'admin' WHERE run_id = %s",
    "token": "UPDATE runs SET started_token = 'someone-else' WHERE run_id = %s",
    "cleared": "UPDATE runs SET started_role = NULL, started_token = NULL WHERE run_id = %s",
    "installation": "UPDATE runs SET started_role = 'installation' WHERE run_id = %s",
}


@pytest.mark.parametrize("attack", sorted(PROMOTIONS))
def test_a_tenants_role_cannot_change_a_runs_started_role(
    deployment: Deployment, attack: str  # noqa: F811 - the fixture
) -> None:
    d = deployment
    d.acme.create_run(new_run("low", tenant="acme", started_role="viewer", started_token="t1"))
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match=r"never change"):
        d.as_role("acme", PROMOTIONS[attack], ("low",))
    assert d.owner.started_with("low") == ("viewer", "t1")
    # the owner is bound too: the pair is a fact of the run's start, not a setting
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match=r"never change"):
        d.as_role("owner", PROMOTIONS[attack], ("low",))


def test_a_tenants_role_cannot_insert_a_run_as_installation(
    deployment: Deployment,  # noqa: F811 - the fixture
) -> None:
    d = deployment
    with pytest.raises(cairn.CairnError):
        d.acme.create_run(new_run("forged", tenant="acme", started_role="installation"))
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match=r"cannot start a run as installation"):
        d.as_role("acme", "INSERT INTO runs (run_id, tenant, workflow, workflow_version, status, created_at, "
                          "updated_at, started_role) VALUES ('raw', 'acme', 'wf', '1', 'pending', 0, 0, "
                          "'installation')")
    assert d.owner.get_run("forged") is None
    assert d.owner.get_run("raw") is None
    # the owner (the installation itself) may
    d.owner.create_run(new_run("ops", tenant="acme", started_role="installation"))
    assert d.owner.started_with("ops") == ("installation", None)


def test_a_run_on_a_tenants_role_cannot_promote_itself_to_call_an_admin_tool(
    deployment: Deployment,  # noqa: F811 - the fixture
) -> None:
    """The whole path on the tenant's role: a viewer's run whose
    transactional step rewrites its own row, then calls a tool reserved to
    admin. The step fails, the call is refused and recorded."""
    ran: list[str] = []
    app = cairn.App(store=deployment.acme, lease_seconds=5.0)
    try:
        @app.tool(effect="write", access=cairn.ToolAccess(role="admin"))
        def drop_table(name: str) -> str:
            ran.append(name)
            return f"dropped {name}"

        @app.transaction(name="promote-myself")
        def promote(tx: cairn.Tx, run_id: str) -> int:
            return tx.execute("UPDATE runs SET started_role = 'admin' WHERE run_id = %s", (run_id,)).rowcount

        @app.workflow(name="climber")
        def climber(ctx: cairn.Context) -> str:
            with contextlib.suppress(cairn.StepFailed):
                promote(ctx.run_id)
            return drop_table("users")

        with pytest.raises(cairn.RunFailed, match=r"started as viewer \(token t1\) may not call it"):
            app.run(climber, run_id="climber", tenant="acme", started_role="viewer", started_token="t1")
        assert ran == []
        assert deployment.owner.started_with("climber") == ("viewer", "t1")
        failed = [e for e in deployment.owner.history("climber") if e.event is EventType.STEP_FAILED]
        assert [e.step_kind for e in failed] == ["transaction", "tool"]
    finally:
        app.close()
