"""A tenant's own run ids under PostgreSQL's row-level security: ids in the
``tenant:<tenant>:`` namespace (``store.runids``) belong to the tenant they
name, whatever SQL another tenant's role runs (migration 0022's CHECK).

Uses the deployment of ``tests/store/test_postgres_rls.py``: an owner role
that migrated the schema, and one scoped login role per tenant (acme, globex).
"""

from __future__ import annotations

import psycopg
import pytest

from cairn.errors import InvalidArgument
from cairn.store.runids import scoped_run_id
from tests.store.contract import new_run
from tests.store.test_postgres_rls import Deployment, deployment  # noqa: F401

INSERT = ("INSERT INTO runs (run_id, tenant, workflow, workflow_version, status, created_at, updated_at) "
          "VALUES (%s, %s, 'wf', '1', 'pending', 0, 0)")


def test_a_tenant_cannot_take_an_id_in_another_tenants_namespace(deployment: Deployment) -> None:  # noqa: F811
    d = deployment
    wanted = scoped_run_id("acme", "order-42")
    with pytest.raises(InvalidArgument, match="is reserved"):
        d.globex.create_run(new_run(wanted, tenant="globex"))
    with pytest.raises(psycopg.errors.CheckViolation, match="runs_tenant_ids"):
        d.as_role("globex", INSERT, (wanted, "globex"))
    for forged in (wanted.replace("acme", "acme%3A", 1), "tenant:acme:", "tenant:acme"):
        with pytest.raises(psycopg.errors.CheckViolation, match="runs_tenant_ids"):
            d.as_role("globex", INSERT, (forged, "globex"))
    d.globex.create_run(new_run("globex-own", tenant="globex"))
    with pytest.raises(psycopg.errors.CheckViolation, match="runs_tenant_ids"):
        d.as_role("globex", "UPDATE runs SET run_id = %s WHERE run_id = 'globex-own'", (wanted,))
    # globex's own namespace is globex's, by SQL as by the store
    assert d.as_role("globex", INSERT, (scoped_run_id("globex", "order-42"), "globex")) == [(1,)]
    assert d.globex.create_run(new_run(scoped_run_id("globex", "order-43"), tenant="globex"))[1] is True

    assert d.owner.get_run(wanted) is None
    assert d.acme.create_run(new_run(wanted, tenant="acme"))[1] is True
    assert d.owner.get_run(wanted).tenant == "acme"  # type: ignore[union-attr]
