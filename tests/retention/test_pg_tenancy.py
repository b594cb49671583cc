"""Retention policies under PostgreSQL's row-level security: a tenant's role
sets, sees and removes only its own tenant's policies (and reads the
installation's defaults, '*', which only the owner writes), whatever SQL
it runs; the controller's lease and the records of deleted runs are the
owner's alone.

Uses the deployment of ``tests/store/test_postgres_rls.py``: an owner role
that migrated the schema, and one scoped login role per tenant (acme, globex).
"""

from __future__ import annotations

import psycopg
import pytest

from cairn.errors import InvalidArgument, StoreError
from cairn.store import retention as rt
from cairn.store.retention import DataClass
from tests.store.test_postgres_rls import Deployment, deployment  # noqa: F401


def test_a_tenant_sets_and_sees_only_its_own_policies(deployment: Deployment) -> None:  # noqa: F811
    d = deployment
    d.owner.set_retention_policy(rt.policy(None, None, "history", "30d"), "cli:root@host")
    d.acme.set_retention_policy(rt.policy("acme", None, "model-bodies", "7d"), "http:acme-admin#t1")
    d.globex.set_retention_policy(rt.policy("globex", "chat", "history", "1y"), "http:globex-admin#t2")
    seen = {key: [(p.tenant, p.workflow, p.data_class.value, p.updated_by)
                  for p in store.retention_policies()]
            for key, store in (("acme", d.acme), ("globex", d.globex))}
    assert seen["acme"] == [("*", "*", "history", "cli:root@host"),
                            ("acme", "*", "model-bodies", "http:acme-admin#t1")]
    assert seen["globex"] == [("*", "*", "history", "cli:root@host"),
                              ("globex", "chat", "history", "http:globex-admin#t2")]
    assert d.acme.retention_policies("globex") == [p for p in d.acme.retention_policies() if p.tenant == "*"]
    assert len(d.owner.retention_policies()) == 3

    # acme can neither write globex's policies nor the installation's defaults ...
    for forged in (rt.policy("globex", "chat", "history", "1d"), rt.policy(None, None, "history", "1d")):
        with pytest.raises(StoreError, match="row-level security"):
            d.acme.set_retention_policy(forged, "http:acme-admin#t1")
    # ... nor remove them: another tenant's policy is no policy at all to it
    assert d.acme.remove_retention_policy("globex", "chat", DataClass.HISTORY) is False
    assert {(p.tenant, p.keep) for p in d.owner.retention_policies()} == {
        ("*", 30 * 86400.0), ("acme", 7 * 86400.0), ("globex", 365 * 86400.0)}
    # its audit policy is checked against the defaults it inherits
    with pytest.raises(InvalidArgument, match="tenant acme would be kept 1d"):
        d.acme.set_retention_policy(rt.policy("acme", None, "audit", "1d"), "http:acme-admin#t1")

    # the role's own SQL, as a bug would run it (one deployment for both halves: a cheap test)
    mine = "SELECT count(*) FROM retention_policies WHERE tenant <> '*'"
    assert d.as_role("acme", mine) == [(1,)]
    others = "tenant IN ('globex', '*')"
    assert d.as_role("acme", f"UPDATE retention_policies SET keep = 0 WHERE {others}") == [(0,)]
    assert d.as_role("acme", "DELETE FROM retention_policies WHERE tenant IN ('globex', '*')") == [(0,)]
    insert = ("INSERT INTO retention_policies (tenant, workflow, data_class, keep, updated_at, updated_by) "
              "VALUES (%s, '*', 'history', 0, 0, 'x')")
    for forged_tenant in ("globex", "*"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            d.as_role("acme", insert, (forged_tenant,))
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
        d.as_role("acme", "UPDATE retention_policies SET tenant = 'globex' WHERE tenant = 'acme'")
    for table in ("retention_lease", "retention_deleted"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
            d.as_role("acme", f"SELECT * FROM {table}")
    assert {(p.tenant, p.keep) for p in d.owner.retention_policies()} == {
        ("*", 30 * 86400.0), ("acme", 7 * 86400.0), ("globex", 365 * 86400.0)}
    with pytest.raises(StoreError):
        d.acme.take_retention_lease("acme-worker", 60)  # only the owner's controller deletes
