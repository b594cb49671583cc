"""Schedules under PostgreSQL's row-level security: a tenant's role sees,
registers and fires only its own tenants' schedules, whatever SQL it runs,
and a run id squatted by another tenant cannot stop a schedule.

Uses the deployment of ``tests/store/test_postgres_rls.py``: an owner role
that migrated the schema, and one scoped login role per tenant (acme,
globex) granted through ``grant_tenant``.
"""

from __future__ import annotations

import psycopg
import pytest

from cairn import App, Context
from cairn.engine.schedules import tick_run_id
from cairn.errors import StoreError
from cairn.store.records import RunFilter
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


def test_a_tick_id_squatted_by_another_tenant_skips_that_tick_only(deployment: Deployment) -> None:  # noqa: F811
    d = deployment
    d.acme.register_schedule(spec(tenant="acme"))
    squatted = tick_run_id("acme", "nightly", TICK)
    d.globex.create_run(new_run(squatted, tenant="globex"))
    assert d.acme.fire_schedule("acme", "nightly", TICK, tick_run()) is Fired.TAKEN
    record = d.owner.get_run(squatted)
    assert record is not None
    assert record.tenant == "globex"
    assert d.acme.fire_schedule("acme", "nightly", TICK + 60, tick_run(TICK + 60)) is Fired.CREATED
    assert [r.run_id for r in d.acme.list_runs(RunFilter())] == [tick_run_id("acme", "nightly", TICK + 60)]


def test_roles_granted_before_the_migration_get_the_schedules_table(deployment: Deployment) -> None:  # noqa: F811
    d = deployment
    # Undo migration 0008 as the owner, as if the roles had been granted on the version before it.
    with psycopg.connect(d.urls["owner"], autocommit=True) as conn:
        conn.execute(f"SET search_path = {SCHEMA}")
        version = conn.execute("SELECT version FROM schema_migrations WHERE name = 'schedules'").fetchone()
        assert version is not None
        conn.execute("DROP TABLE schedules")
        conn.execute("DELETE FROM schema_migrations WHERE version = %s", version)
    assert d.owner.migrate() == [version[0]]
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
