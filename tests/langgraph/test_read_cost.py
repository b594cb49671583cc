"""What a get_state costs on PostgreSQL beyond its one round trip (issue 24,
2026-12-07: get_state p50 <= 1 ms). Each point here was measured: the parse
of a statement longer than psycopg caches (~40 us of the client's CPU a
read), a SQL function the planner cannot inline (each call site planned its
body at every execution: ~0.1 ms of the server's CPU), a hash table sized
for the 40,000 digests ``generate_series``' default estimate made (1.5 MB a
read), the caller's lists as two arrays, which psycopg dumps in Python
(~40 us a read). Each test fails when its point comes back."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg import _queries as psycopg_queries

import cairn
from cairn.store.checkpointsql import NAME_SEPARATOR, ThreadKey, held_lists, pack_refs, unpack_refs
from cairn.store.sqlfiles import load_queries
from tests.engine.conftest import postgres_url


@pytest.fixture
def pg_app(pg_url: str) -> Any:
    application = cairn.App(db=postgres_url(pg_url), lease_seconds=5.0)
    yield application
    application.close()


def _run(saver: Any, steps: int) -> None:
    from tests.langgraph.graphs import counting_loop

    graph = counting_loop(steps, "a").compile(checkpointer=saver)
    graph.invoke({"log": []}, {"configurable": {"thread_id": "t"}})


def test_the_read_statements_are_short_enough_for_psycopg_to_cache_their_parse() -> None:
    # psycopg parses a statement's %(name)s placeholders at every execution
    # unless it is at most this long (it caches the parse of those only)
    limit = psycopg_queries.MAX_CACHED_STATEMENT_LENGTH
    queries = load_queries("postgres")
    for name in ("lg_read_one", "lg_read_page"):
        assert len(queries[name].encode()) <= limit, name


def test_held_lists_are_two_scalars() -> None:
    one, two = pack_refs([1, 2, 3]), pack_refs([-4])
    assert held_lists({}) == ("", b"")
    known, refs = held_lists({"log": one, "other": two, f"odd{NAME_SEPARATOR}name": pack_refs([9])})
    assert refs == one + two  # the channel whose name holds the separator is left out
    assert known.split(NAME_SEPARATOR) == ["log", "0", str(len(one)), "other", str(len(one)), str(len(two))]


def test_a_read_calls_no_function_the_planner_cannot_inline(pg_app: cairn.App, pg_url: str) -> None:
    """``lg_read_one``'s plan, generic (as the driver's prepared statement
    runs it) and for the values it is given: no call of a SQL function (a
    ``Function Scan`` of ``lg_names`` or ``lg_digests``, declared STRICT:
    never inlined), no node expecting more than 1,000 rows (the digests'
    hash table is sized by the estimate), a cost JIT leaves alone."""
    from cairn.langgraph import CairnSaver

    saver = CairnSaver(pg_app, tenant="acme")
    _run(saver, 12)
    key = ThreadKey("acme", "t", "")
    latest = saver._rows.lg_read(key, None, saver._versions)
    assert latest is not None
    known, refs = held_lists({"log": b"".join(r for _, r in latest.chains["log"])})
    sql = load_queries("postgres")["lg_read_one"]
    params = {"tenant": "acme", "thread_id": "t", "ns": "", "checkpoint_id": None, "known": known,
              "known_refs": refs}
    with psycopg.connect(postgres_url(pg_url)) as conn:
        conn.execute("SET search_path = cairn")
        plans = []
        for mode in ("force_generic_plan", "force_custom_plan"):
            conn.execute(f"SET plan_cache_mode = {mode}")
            for _ in range(2):  # the statement prepared (psycopg prepares on demand)
                conn.execute(sql, params, prepare=True).fetchall()
            plans.append(conn.execute("EXPLAIN (FORMAT JSON) " + sql, params).fetchone())
        conn.rollback()
    nodes = []

    def walk(node: dict[str, Any]) -> None:
        nodes.append(node)
        for child in node.get("Plans", []):
            walk(child)

    for found in plans:
        assert found is not None
        doc = found[0] if isinstance(found[0], list) else json.loads(found[0])
        walk(doc[0]["Plan"])
        # under jit_above_cost's default: a connection with JIT on would otherwise
        # compile the statement (1.4 s, when generate_series' estimates costed it at 4e8)
        assert doc[0]["Plan"]["Total Cost"] < 100_000
    scanned = {n.get("Function Name") for n in nodes if n["Node Type"] == "Function Scan"}
    assert not {"lg_names", "lg_digests"} & scanned, scanned
    hashed = [n["Plan Rows"] for n in nodes if n["Node Type"] in ("Aggregate", "Hash", "SetOp")]
    assert hashed
    assert max(hashed) <= 1000


def test_the_server_finds_each_held_list_at_its_offset(pg_app: cairn.App) -> None:
    """Several lists held: each is compared with its own digests (the
    second starts where the first ends), so each is left out."""
    from cairn.langgraph import CairnSaver

    saver = CairnSaver(pg_app, tenant="acme")
    _run(saver, 20)
    key = ThreadKey("acme", "t", "")
    latest = saver._rows.lg_read(key, None, saver._versions)
    assert latest is not None
    log = b"".join(r for _, r in latest.chains["log"])
    items = set(unpack_refs(log))
    assert len(items) == 20
    assert items <= set(latest.values)
    for lists in ({"before": pack_refs([7, 8, 9]), "log": log + pack_refs([5])},
                  {"log": log, "after": pack_refs([7])}):
        held = saver._rows.lg_read(key, None, saver._versions, lambda channel, refs: True, lists=lists)
        assert held is not None
        assert not items & set(held.values), ("the held list's items were sent", list(lists))
        assert b"".join(r for _, r in held.chains["log"]) == log
    # a copy that does not start with the list's digests (one digest short) is not held
    other = saver._rows.lg_read(key, None, saver._versions, lambda channel, refs: False,
                                lists={"before": log, "log": log[:-8]})
    assert other is not None
    assert items <= set(other.values)
