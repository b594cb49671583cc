"""``delete_for_runs`` finds a tenant's checkpoints of the given runs through
the index on ``lg_checkpoints (tenant, run_id)`` (migrations SQLite 0019,
PostgreSQL 0028), not by scanning every checkpoint of the tenant: the plan of
the store's own statement names the index, on both backends."""

from __future__ import annotations

import json
import sqlite3

import psycopg

import cairn
from cairn.store.sqlfiles import load_queries


def _plan(db_url: str) -> str:
    if db_url.startswith("sqlite"):
        sql = load_queries("sqlite")["lg_delete_runs"]
        with sqlite3.connect(db_url.removeprefix("sqlite:///")) as conn:
            rows = conn.execute(f"EXPLAIN QUERY PLAN {sql}",
                                {"tenant": "acme", "run_ids": json.dumps(["r1", "r2"])}).fetchall()
        return "\n".join(str(r[-1]) for r in rows)
    sql = load_queries("postgres")["lg_delete_runs"]
    with psycopg.connect(db_url) as conn:
        conn.execute("SET search_path = cairn")
        conn.execute("ANALYZE lg_checkpoints")
        # a table this small is cheapest to scan whole; what is asked is whether
        # an index serves the statement, and which one the planner takes
        conn.execute("SET enable_seqscan = off")
        rows = conn.execute(f"EXPLAIN {sql}", {"tenant": "acme", "run_ids": ["r1", "r2"]}).fetchall()
        conn.rollback()
    return "\n".join(str(r[0]) for r in rows)


def test_delete_for_runs_uses_the_run_index(app: cairn.App, db_url: str) -> None:
    from cairn.langgraph import CairnSaver
    from tests.langgraph.graphs import counting_loop

    saver = CairnSaver(app, tenant="acme")
    for thread in ("t1", "t2"):  # the run id as LangGraph's server passes it, in the metadata
        counting_loop(3, "a").compile(checkpointer=saver).invoke(
            {"log": []}, {"configurable": {"thread_id": thread}, "metadata": {"run_id": f"run-{thread}"}})
    plan = _plan(db_url)
    assert "lg_checkpoints_run" in plan, plan
    # and the statement still deletes what it should
    saver.delete_for_runs(["run-t1"])
    assert saver.get_tuple({"configurable": {"thread_id": "t1"}}) is None
    assert saver.get_tuple({"configurable": {"thread_id": "t2"}}) is not None
