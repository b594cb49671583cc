"""Schedules under PostgreSQL's row-level security: a tenant's role sees,
registers and fires only its own tenants' schedules, whatever SQL it runs,
and no tenant can take the run ids of another tenant's ticks.

Uses the deployment of ``tests/store/test_postgres_rls.py``: an owner role
that migrated the schema, and one scoped login role per tenant (acme,
globex) granted through ``grant_tenant``.
"""

from __future__ import annotations

import psycopg
import pytest

import cairn
from cairn import App, Context
from cairn.engine.schedules import tick_run_id
from cairn.errors import InvalidArgument, StoreError
from cairn.store.records import RunFilter
from cairn.store.runids import id_part
from cairn.store.schedules import Fired
from cairn.worker.scheduler import Scheduler
from tests.store.contract import new_run
from tests.store.schedule_contract import TICK, spec, tick_run
from tests.store.test_postgres_rls import SCHEMA, Deployment, deployment  # noqa: F401


def test_a_tenant_sees_and_fires_only_its_own_schedules(deployment: Deployment) -> None:  # noqa: F811
    d = deployment
    d.acme.register_schedule(spec(tenant="acme"))
    d.globex.register_schedule(spec(tenant="globex"))
    assert [(s.tenant, s.name) for s in d.acme.list_schedules()] == [("acme", "nightly")]
    assert d.acme.list_schedules("globex") == []
    assert [s.tenant for s in d.owner.list_schedules()] == ["acme", "globex"]

    # globex can neither fire acme's schedule (it does not exist for globex) ...
    assert d.globex.fire_schedule("acme", "nightly", TICK, None) is Fired.MISSING
    assert d.owner.list_schedules("acme")[0].last_tick is None
    # ... nor register one in acme's name
    with pytest.raises(StoreError, match="row-level security"):
        d.globex.register_schedule(spec("sneaky", tenant="acme"))
    assert [s.name for s in d.owner.list_schedules("acme")] == ["nightly"]

    assert d.acme.fire_schedule("acme", "nightly", TICK, tick_run()) is Fired.CREATED
    assert d.globex.get_run(tick_run().run_id) is None


def test_raw_sql_of_a_tenant_role_reaches_no_other_tenants_schedule(deployment: Deployment) -> None:  # noqa: F811
    d = deployment
    d.acme.register_schedule(spec(tenant="acme"))
    assert d.as_role("globex", "SELECT count(*) FROM schedules") == [(0,)]
    assert d.as_role("globex", "UPDATE schedules SET last_tick = 1e12 WHERE tenant = 'acme'") == [(0,)]
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
        d.as_role("globex", "DELETE FROM schedules")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
        d.as_role("globex", "INSERT INTO schedules (tenant, name, workflow, cron, timezone, missed, "
                            "grace, created_at, updated_at) VALUES ('acme', 'x', 'wf', '* * * * *', 'UTC', "
                            "'once', 1, 0, 0)")
    (state,) = d.owner.list_schedules()
    assert (state.name, state.last_tick) == ("nightly", None)


def test_a_tenant_cannot_squat_another_tenants_tick_ids(deployment: Deployment) -> None:  # noqa: F811
    """Tick ids are predictable: globex taking acme's next tick ids would make
    acme's schedule start nothing, tick after tick. Neither its store nor its
    role's raw SQL (an insert, or renaming a run of its own) can."""
    d = deployment
    d.acme.register_schedule(spec(tenant="acme"))
    squatted = tick_run_id("acme", "nightly", TICK)
    with pytest.raises(InvalidArgument, match="is reserved"):
        d.globex.create_run(new_run(squatted, tenant="globex"))
    insert = ("INSERT INTO runs (run_id, tenant, workflow, workflow_version, status, created_at, updated_at) "
              "VALUES (%s, %s, 'wf', '1', 'pending', 0, 0)")
    with pytest.raises(psycopg.errors.CheckViolation, match="runs_schedule_ids"):
        d.as_role("globex", insert, (squatted, "globex"))
    # a name made to look like acme's prefix once encoded, or not encoded at all
    for forged in (tick_run_id("acme", "nightly", TICK + 60).replace("acme", "acme%3A", 1),
                   "schedule:acme:nightly:later"):
        with pytest.raises(psycopg.errors.CheckViolation, match="runs_schedule_ids"):
            d.as_role("globex", insert, (forged, "globex"))
    d.globex.create_run(new_run("globex-own", tenant="globex"))
    with pytest.raises(psycopg.errors.CheckViolation, match="runs_schedule_ids"):
        d.as_role("globex", "UPDATE runs SET run_id = %s WHERE run_id = 'globex-own'", (squatted,))
    # globex's own tick ids are globex's to take, by SQL as by the store
    assert d.as_role("globex", insert, (tick_run_id("globex", "x", TICK), "globex")) == [(1,)]
    assert d.globex.create_run(new_run(tick_run_id("globex", "x", TICK + 60), tenant="globex"))[1] is True

    assert d.owner.get_run(squatted) is None
    assert d.acme.fire_schedule("acme", "nightly", TICK, tick_run()) is Fired.CREATED
    assert d.owner.get_run(squatted).tenant == "acme"  # type: ignore[union-attr]


@pytest.mark.parametrize("text", ["acme", "a:b", "100%", "Ünïcødé ☃", "a b/c?d=e&f", "it's \\ \"quoted\"",
                                  "-._~", "\t\n\x7f", "\U0001d54f", "schedule:acme:"])
def test_the_databases_encoding_of_a_tenant_is_the_schedulers(
    deployment: Deployment, text: str  # noqa: F811
) -> None:
    """The constraint's ``url_quote`` and ``store.runids.id_part`` must agree
    byte for byte, or a tenant's own ticks would be refused (or another's let through)."""
    assert deployment.as_role("owner", "SELECT url_quote(%s)", (text,)) == [(id_part(text),)]


def test_roles_granted_before_the_migration_get_the_schedules_table(deployment: Deployment) -> None:  # noqa: F811
    d = deployment
    # Undo migration 0008 (and the later ones altering its table) as the owner, as if the roles had
    # been granted on the version before it.
    with psycopg.connect(d.urls["owner"], autocommit=True) as conn:
        conn.execute(f"SET search_path = {SCHEMA}")
        versions = [v for (v,) in conn.execute(
            "SELECT version FROM schema_migrations WHERE name IN ('schedules', 'schedule_role') "
            "ORDER BY version")]
        assert len(versions) == 2
        conn.execute("DROP TABLE schedules")
        conn.execute("DELETE FROM schema_migrations WHERE version = ANY(%s)", (versions,))
    assert d.owner.migrate() == versions
    d.acme.register_schedule(spec(tenant="acme"))
    assert [s.tenant for s in d.acme.list_schedules()] == ["acme"]


def test_a_worker_scoped_to_a_tenant_fires_its_schedules_and_names_the_others_once(
    deployment: Deployment, caplog: pytest.LogCaptureFixture  # noqa: F811
) -> None:
    d = deployment
    app = App(store=d.acme)

    @app.workflow(name="wf")
    def wf(ctx: Context) -> str:
        return "ok"

    app.schedule("* * * * * *", wf, name="nightly", tenant="acme")
    app.schedule("* * * * * *", wf, name="nightly", tenant="globex")
    scheduler = Scheduler(app.runtime, list(app.runtime.schedules.values()))
    scheduler.run_pass()
    d.clock.advance(2.0)
    scheduler.run_pass()
    assert [s.tenant for s in d.owner.list_schedules()] == ["acme"]
    assert scheduler.created == 2
    assert {r.tenant for r in d.owner.list_runs(RunFilter())} == {"acme"}
    refusals = [r for r in caplog.records if "cannot be registered" in r.getMessage()]
    assert len(refusals) == 1
    assert "globex" in refusals[0].getMessage()


def test_a_tenants_role_editing_its_schedules_role_raises_no_ticks_rights(
    deployment: Deployment,  # noqa: F811
) -> None:
    """The schedule's row shows the role its ticks' runs are started with;
    a tenant's role may rewrite its own rows, so the row is never what a
    run's rights come from: the next tick's run has the declaration's role
    (none here), and a tool reserved to admin refuses it."""
    d = deployment
    ran: list[str] = []
    app = App(store=d.acme)
    try:
        @app.tool(effect="write", access=cairn.ToolAccess(role="admin"))
        def purge() -> str:
            ran.append("purged")
            return "purged"

        @app.workflow(name="wf")
        def wf(ctx: Context) -> str:
            return purge()

        app.schedule("* * * * * *", wf, name="nightly", tenant="acme", role="viewer")
        scheduler = Scheduler(app.runtime, list(app.runtime.schedules.values()))
        scheduler.run_pass()
        assert d.as_role("acme", "UPDATE schedules SET started_role = 'admin'") == [(1,)]
        with pytest.raises(psycopg.errors.CheckViolation):
            d.as_role("acme", "UPDATE schedules SET started_role = 'root'")
        d.clock.advance(1.0)
        scheduler.run_pass()
        [run] = d.owner.list_runs(RunFilter())
        assert d.owner.started_with(run.run_id) == ("viewer", None)
        with pytest.raises(cairn.RunFailed, match="started as viewer may not call it"):
            app.resume(run.run_id)
        assert ran == []
    finally:
        app.close()
