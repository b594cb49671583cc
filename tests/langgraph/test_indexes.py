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


def _explain(db_url: str, name: str, params: dict[str, object], *, indexes: bool = False) -> str:
    """The plan of the dialect's statement ``name``; ``indexes``: PostgreSQL
    scans nothing whole (a table this small is cheapest to scan whole: what is
    asked is which index serves the statement, and whether it serves its order)."""
    dialect = "sqlite" if db_url.startswith("sqlite") else "postgres"
    sql = load_queries(dialect)[name]
    if dialect == "sqlite":
        with sqlite3.connect(db_url.removeprefix("sqlite:///")) as conn:
            rows = conn.execute(f"EXPLAIN QUERY PLAN {sql}", {
                k: json.dumps(v) if isinstance(v, list) else v for k, v in params.items()}).fetchall()
        return "\n".join(str(r[-1]) for r in rows)
    with psycopg.connect(db_url) as conn:
        conn.execute("SET search_path = cairn")
        if indexes:
            conn.execute("SET enable_seqscan = off")
        rows = conn.execute(f"EXPLAIN {sql}", params).fetchall()
        conn.rollback()
    return "\n".join(str(r[0]) for r in rows)


def test_a_read_finds_each_blob_by_its_whole_key(app: cairn.App, db_url: str) -> None:
    """Reading a checkpoint's channels (``lg_blob_chains``) looks each blob of
    each chain up by its whole primary key, on a freshly filled table too
    (PostgreSQL's planner, with the statistics of an empty table, was seen
    scanning the thread's every blob per chain step: 120 ms at 300 super-steps)."""
    from cairn.langgraph import CairnSaver
    from tests.langgraph.graphs import counting_loop

    saver = CairnSaver(app, tenant="acme")
    graph = counting_loop(30, "a").compile(checkpointer=saver)
    graph.invoke({"log": []}, {"configurable": {"thread_id": "t"}})
    if db_url.startswith("sqlite"):
        plan = _explain(db_url, "lg_blob_chains", {"tenant": "acme", "thread_id": "t", "ns": "",
                                                   "channels": ["log", "x"], "versions": ["1", "2"]})
        whole = "USING PRIMARY KEY (tenant=? AND thread_id=? AND ns=? AND channel=? AND version=?)"
        assert plan.count(whole) == 2, plan
        assert "SCAN b" not in plan, plan
    else:  # a page's chains and writes in one statement
        plan = _explain(db_url, "lg_page_reads", {
            "tenant": "acme", "rows": [0, 0], "threads": ["t", "t"], "nss": ["", ""],
            "channels": ["log", "x"], "versions": ["1", "2"], "wrows": [0], "wthreads": ["t"], "wnss": [""],
            "wids": ["c"]})
        assert plan.count("Index Scan using lg_blobs_pkey") == 2, plan
        assert "(version = w_1.version)" in plan, plan
        assert "(version = c.base)" in plan, plan
        assert "(checkpoint_id = w.checkpoint_id)" in plan, plan  # the writes by their key too
        # and the checkpoint's folded writes by its key (checkpointsql.read_writes)
        assert "Index Scan using lg_checkpoints_pkey" in plan, plan
        assert "(checkpoint_id = f.checkpoint_id)" in plan, plan
        assert "Join Filter" not in plan, plan
        assert "Seq Scan" not in plan, plan


def test_a_read_finds_each_value_by_its_whole_key(app: cairn.App, db_url: str) -> None:
    """Reading the values a checkpoint names (``lg_values``) looks each up by
    its whole primary key, on a freshly filled table too (PostgreSQL's
    planner, with the statistics of a fresh table, took ``digest = ANY(...)``
    as a filter over the thread's every value: 4 ms a read at 3,000 values)."""
    from cairn.langgraph import CairnSaver
    from tests.langgraph.graphs import counting_loop

    saver = CairnSaver(app, tenant="acme")
    graph = counting_loop(30, "a").compile(checkpointer=saver)
    graph.invoke({"log": []}, {"configurable": {"thread_id": "t"}})
    if db_url.startswith("sqlite"):
        plan = _explain(db_url, "lg_values", {"tenant": "acme", "thread_id": "t", "digests": [1, 2, 3]})
        assert "SEARCH lg_values USING INDEX sqlite_autoindex_lg_values_1 (tenant=? AND thread_id=? AND " \
               "digest=?)" in plan, plan
        assert "SCAN lg_values" not in plan, plan
    else:
        plan = _explain(db_url, "lg_page_values",
                        {"tenant": "acme", "threads": ["t"] * 3, "digests": [1, 2, 3]})
        assert "Index Scan using lg_values_pkey" in plan, plan
        assert "digest = w.digest" in plan, plan
        assert "Filter" not in plan, plan
    assert saver.get_tuple({"configurable": {"thread_id": "t"}}) is not None


def test_a_threads_history_page_is_read_from_the_end_of_its_key(app: cairn.App, db_url: str) -> None:
    """A history page of one thread's namespace (``lg_list_thread``, what
    ``get_state_history`` asks) reads the newest rows of its primary key on
    SQLite, sorting nothing (the catch-all listing sorted every checkpoint of
    the tenant: 4.7 ms a first page at 3,000), and on PostgreSQL too since its
    ids are "C" strings (migration 0041: before, the "C" order of ids in a key
    of the database's collation sorted the thread's checkpoints). On both, the
    pages, with ``before`` too, are the newest first, as LangGraph lists them."""
    from cairn.langgraph import CairnSaver
    from tests.langgraph.graphs import counting_loop

    saver = CairnSaver(app, tenant="acme")
    graph = counting_loop(12, "a").compile(checkpointer=saver)
    for thread in ("t", "u"):
        graph.invoke({"log": []}, {"configurable": {"thread_id": thread}})
    params = {"tenant": "acme", "thread_id": "t", "ns": "", "limit": 10, "before": "z"}
    for name in ("lg_list_thread", "lg_list_thread_before", "lg_latest_checkpoint"):
        plan = _explain(db_url, name, params, indexes=True)
        if db_url.startswith("sqlite"):
            assert "USING PRIMARY KEY (tenant=? AND thread_id=? AND ns=?" in plan, plan
            assert "TEMP B-TREE" not in plan, plan
        else:
            assert "Index Scan Backward using lg_checkpoints_pkey" in plan, plan
            assert "Sort" not in plan, plan
    listed = saver.list({"configurable": {"thread_id": "t"}})
    every = [t.config["configurable"]["checkpoint_id"] for t in listed]
    assert every == sorted(every, reverse=True), every
    assert len(every) == 14, every  # the input, 12 steps, the end
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    first = [t.config["configurable"]["checkpoint_id"] for t in saver.list(config, limit=5)]
    assert first == every[:5]
    after = [t.config["configurable"]["checkpoint_id"] for t in saver.list(
        config, before={"configurable": {"checkpoint_id": first[-1]}}, limit=5)]
    assert after == every[5:10]
