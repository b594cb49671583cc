"""The tenant rule of row-level security, written once (migration 0044).

Every tenant policy calls ``cairn_tenants()`` as
``tenant = ANY ((SELECT cairn_tenants())::TEXT[])``. These tests pin what
that form buys and what the function must not give away:

* the plans of a tenant role's typical queries evaluate the rule once per
  query (one init plan, run once) and use the index they used when the rule
  was written out in each policy: the primary keys for a run, its history
  and its mailbox, ``runs_tenant_updated`` with the rule itself as the index
  condition for a listing (called bare, the function would be a per-row
  filter and no init plan);
* no policy writes the rule out again or calls the function bare;
* the function's search_path is pinned: a tenant role's own table or
  temporary table named ``tenant_grants`` does not widen its tenants.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from cairn.store.sqlfiles import load_queries
from tests.store.contract import new_run
from tests.store.test_postgres_rls import SCHEMA, Deployment, deploy

TENANTS = ["acme", "globex", *(f"t{i}" for i in range(6))]
RUNS_PER_TENANT = 200

#: A typical query of a tenant's role (the store's own SQL), its parameters,
#: and the index its plan used before 0044 (the same data, sequential scans off).
QUERIES: dict[str, tuple[dict[str, Any], str]] = {
    "select_run": ({"run_id": "acme-17"}, "runs_pkey"),
    "select_history": ({"run_id": "acme-17", "after_seq": 0, "limit": 100}, "history_pkey"),
    "next_message": ({"run_id": "acme-17", "key": "k"}, "mailbox_pkey"),
    "list_runs": ({"tenant": None, "workflow": None, "thread_id": None, "parent_run_id": None,
                   "statuses": None, "limit": 20}, "runs_tenant_updated"),
}

#: The init plan's parameter in a condition: $0 up to PostgreSQL 16, (InitPlan 1).col1 from 17.
PARAM = r"(\$\d+|\(InitPlan \d+\)\.col\d+)"


@pytest.fixture
def deployed(pg_url: str) -> Iterator[Deployment]:
    """The owner and two tenant roles of ``tests/store/test_postgres_rls.py``."""
    with deploy(pg_url) as built:
        yield built


def _fill(d: Deployment) -> None:
    """Runs, history and mailbox rows of several tenants, written as the owner."""
    with psycopg.connect(d.urls["owner"], autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(SCHEMA)))
        conn.execute(
            "INSERT INTO runs (run_id, tenant, workflow, workflow_version, status, created_at, updated_at) "
            "SELECT t || '-' || i, t, 'wf', '1', 'completed', i, i "
            "FROM unnest(%s::text[]) AS t, generate_series(1, %s) AS i", (TENANTS, RUNS_PER_TENANT))
        conn.execute("INSERT INTO history (run_id, seq, event, at, epoch, tenant) "
                     "SELECT r.run_id, s, 'x', s, 0, r.tenant FROM runs AS r, generate_series(1, 5) AS s")
        conn.execute("INSERT INTO mailbox (run_id, seq, tenant, key, sent_at) "
                     "SELECT r.run_id, s, r.tenant, 'k', s FROM runs AS r, generate_series(1, 2) AS s")
        conn.execute("ANALYZE")


def _explain(conn: psycopg.Connection[Any], query: str, params: dict[str, Any]) -> str:
    rows = conn.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + query, params).fetchall()
    return "\n".join(str(row[0]) for row in rows)


def test_tenant_queries_evaluate_the_rule_once_and_keep_their_index(deployed: Deployment) -> None:
    """One deployment for all the queries: each costs a migrated schema and its rows."""
    d = deployed
    _fill(d)
    queries = load_queries("postgres")
    with psycopg.connect(d.urls["acme"], autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(SCHEMA)))
        conn.execute("SELECT set_config('cairn.tenant', 'acme', false)")
        # Tables this small are cheapest to read whole, whatever the rule:
        # without sequential scans the planner says which index it would use.
        conn.execute("SET enable_seqscan = off")
        for name, (params, index) in sorted(QUERIES.items()):
            plan = _explain(conn, queries[name], params)
            rows = conn.execute(queries[name], params).fetchall()
            where = f"{name}:\n{plan}"
            assert rows, f"found nothing of acme's, so the plan proves nothing: {where}"
            assert all("acme" in str(row) for row in rows), where
            assert plan.count("InitPlan") == 1, where
            assert re.search(r"InitPlan 1\b[^\n]*\n\s*->  Result \(actual rows=1 loops=1\)", plan), where
            assert "cairn_tenants" not in plan, f"the rule is evaluated outside its init plan: {where}"
            assert re.search(rf"tenant = ANY \({PARAM}\)", plan), where
            assert f" on {index} " in plan or f" using {index} " in plan, where
            if name == "list_runs":  # the rule itself selects the rows from the index
                assert re.search(rf"Index Cond: \(tenant = ANY \({PARAM}\)\)", plan), where


def test_every_tenant_policy_calls_the_rule_in_a_scalar_subquery(deployed: Deployment) -> None:
    policies = deployed.as_role(
        "owner", "SELECT tablename, policyname, coalesce(qual, ''), coalesce(with_check, '') "
                 "FROM pg_policies WHERE schemaname = current_schema() ORDER BY tablename, policyname")
    calling = {(table, policy) for table, policy, qual, check in policies if "cairn_tenants" in qual + check}
    assert len(calling) >= 30, calling  # 23 tenant_isolation, and the shares', buckets' and retention's
    assert ("runs", "tenant_isolation") in calling
    for table, policy, qual, check in policies:
        text = qual + " " + check
        assert "tenant_grants" not in text, f"{table}.{policy} writes the rule out: {text}"
        calls = re.findall(r"(SELECT )?(\w+\.)?cairn_tenants\(\)", text)  # qualified off the search_path
        bare = sum(1 for select, _ in calls if not select)
        assert bare == 0, f"{table}.{policy} calls the rule outside a scalar subquery: {text}"


@pytest.mark.parametrize("shadow", ["own_schema", "temporary_table"])
def test_a_tenant_role_cannot_widen_its_tenants_with_its_own_tenant_grants(
    deployed: Deployment, shadow: str
) -> None:
    """The rule's body is resolved when it runs, as the caller: without its
    pinned search_path, a ``tenant_grants`` of the caller's own (in a schema
    it puts first, or a temporary table, which is searched first unless
    named) would answer instead of the store's."""
    d = deployed
    d.acme.create_run(new_run("a1", tenant="acme"))
    d.globex.create_run(new_run("g1", tenant="globex"))
    role = conninfo_to_dict(d.urls["globex"])["user"]
    if shadow == "own_schema":
        database = conninfo_to_dict(d.admin_url)["dbname"]
        with psycopg.connect(d.admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                sql.Identifier(str(database)), sql.Identifier(str(role))))
    with psycopg.connect(d.urls["globex"], autocommit=True) as conn:
        if shadow == "own_schema":
            conn.execute("CREATE SCHEMA shadow")
            conn.execute("CREATE TABLE shadow.tenant_grants (role NAME, tenant TEXT)")
            conn.execute(sql.SQL("SET search_path = shadow, {}").format(sql.Identifier(SCHEMA)))
        else:
            conn.execute("CREATE TEMPORARY TABLE tenant_grants (role NAME, tenant TEXT)")
            conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(SCHEMA)))
        conn.execute("INSERT INTO tenant_grants VALUES (current_user, 'acme'), (current_user, 'globex')")
        # the shadow is in place: the role's unqualified tenant_grants is its own
        assert conn.execute("SELECT tenant FROM tenant_grants ORDER BY tenant").fetchall() == [
            ("acme",), ("globex",)]
        assert conn.execute("SELECT cairn_tenants()").fetchall() == [(["globex"],)]
        assert conn.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall() == [("g1",)]
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE runs SET tenant = 'acme' WHERE run_id = 'g1'")
    assert d.acme.get_run("a1") is not None
    assert d.globex.get_run("a1") is None
