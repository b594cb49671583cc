"""PostgreSQL floors and competitors: bare psycopg, LangGraph + PostgresSaver, DBOS on PostgreSQL.

Each function creates a fresh database (``bench.pgdb.fresh_database``), runs
one measurement and returns one float; setup, a tiny warm-up call and
teardown stay outside the timed region, exactly as in ``bench.baselines``.
Every connection uses the server's ``synchronous_commit`` (``on``: checked by
``bench.postgres``); none of these libraries changes it.

LangGraph and DBOS are imported lazily, so this module imports without them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg

from bench.baselines import CountState, _increment
from bench.common import stopwatch
from bench.pgdb import fresh_database

if TYPE_CHECKING:
    from dbos import DBOS
    from langgraph.graph import StateGraph

#: Name of the DBOS queue the worker-process benchmark uses.
DBOS_QUEUE = "bench_three"
#: DBOS application name: workers and the enqueuing process must agree on it.
DBOS_APP = "cairn-bench"


# -- floors --------------------------------------------------------------------


def _floor(iterations: int, setup: Sequence[str], statements: Callable[[psycopg.Connection[Any], int], None],
           label: str) -> float:
    with fresh_database(label) as url, psycopg.connect(url, autocommit=True) as conn:
        for statement in setup:
            conn.execute(statement)
        warm = 20
        for i in range(warm):
            statements(conn, i)
        with stopwatch() as elapsed:
            for i in range(warm, warm + iterations):
                statements(conn, i)
    return elapsed() / iterations * 1e6


def pg_round_trip_us(iterations: int = 2000) -> float:
    """``SELECT 1`` on one connection: one network round trip, no commit; µs each."""
    return _floor(iterations, (), lambda conn, _: conn.execute("SELECT 1").fetchone(), "rt")


_EVENTS = (
    "CREATE TABLE runs (id TEXT PRIMARY KEY, last_seq INTEGER NOT NULL, updated_at FLOAT8 NOT NULL)",
    "CREATE TABLE events (run_id TEXT NOT NULL, seq INTEGER NOT NULL, payload BYTEA,"
    " PRIMARY KEY (run_id, seq))",
    "INSERT INTO runs VALUES ('run-1', 0, 0)",
)
_PAYLOAD = b'{"result": 12345}'


def pg_commit_us(iterations: int = 1000) -> float:
    """One autocommit ``INSERT`` of a small journal row: one round trip and one
    WAL flush (``synchronous_commit=on``); µs each. The floor of a journaled step."""

    def insert(conn: psycopg.Connection[Any], i: int) -> None:
        conn.execute("INSERT INTO events VALUES ('run-1', %s, %s)", (i, _PAYLOAD))

    return _floor(iterations, _EVENTS, insert, "commit")


def pg_tx_step_us(iterations: int = 1000) -> float:
    """``BEGIN; INSERT`` a journal row; ``UPDATE`` the run row; ``COMMIT``: four
    round trips, one WAL flush; µs each (the SQLite floor's shape, on PostgreSQL)."""

    def step(conn: psycopg.Connection[Any], i: int) -> None:
        with conn.transaction():
            conn.execute("INSERT INTO events VALUES ('run-1', %s, %s)", (i, _PAYLOAD))
            conn.execute("UPDATE runs SET last_seq = %s, updated_at = %s WHERE id = 'run-1'",
                         (i, time.time()))

    return _floor(iterations, _EVENTS, step, "tx")


# -- LangGraph + PostgresSaver ----------------------------------------------------


def _chain_graph(steps: int) -> StateGraph[Any]:
    from langgraph.graph import END, START, StateGraph

    def route(state: CountState) -> str:
        return END if state["count"] >= steps else "inc"

    builder: StateGraph[Any] = StateGraph(CountState)
    builder.add_node("inc", _increment)
    builder.add_edge(START, "inc")
    builder.add_conditional_edges("inc", route, ["inc", END])
    return builder


def _three_graph() -> StateGraph[Any]:
    from langgraph.graph import END, START, StateGraph

    builder: StateGraph[Any] = StateGraph(CountState)
    builder.add_node("a", _increment)
    builder.add_node("b", _increment)
    builder.add_node("c", _increment)
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("b", "c")
    builder.add_edge("c", END)
    return builder


def langgraph_step_us(steps: int = 300) -> float:
    """One invoke of the self-looping one-node graph (``steps`` node executions)
    with ``PostgresSaver.from_conn_string`` (its defaults: one autocommit
    connection, no pipeline) and LangGraph's default durability; µs per step."""
    from langgraph.checkpoint.postgres import PostgresSaver

    builder = _chain_graph(steps)
    with fresh_database("langgraph") as url, PostgresSaver.from_conn_string(url) as saver:
        saver.setup()
        graph = builder.compile(checkpointer=saver)
        graph.invoke({"count": steps - 1}, {"configurable": {"thread_id": "warm-up"}})
        config: Any = {"configurable": {"thread_id": "chain"}, "recursion_limit": steps + 10}
        with stopwatch() as elapsed:
            final = graph.invoke({"count": 0}, config)
    if final["count"] != steps:
        raise RuntimeError(f"langgraph chain ended at {final['count']}, expected {steps}")
    return elapsed() / steps * 1e6


def langgraph_runs_per_s(n: int = 300) -> float:
    """``n`` invokes, each on a new thread_id, of a 3-node linear graph with PostgresSaver; runs/s."""
    from langgraph.checkpoint.postgres import PostgresSaver

    builder = _three_graph()
    with fresh_database("langgraph") as url, PostgresSaver.from_conn_string(url) as saver:
        saver.setup()
        graph = builder.compile(checkpointer=saver)
        graph.invoke({"count": 0}, {"configurable": {"thread_id": "warm-up"}})
        with stopwatch() as elapsed:
            for i in range(n):
                final = graph.invoke({"count": 0}, {"configurable": {"thread_id": f"run-{i}"}})
    if final["count"] != 3:
        raise RuntimeError(f"langgraph 3-node run ended at {final['count']}, expected 3")
    return n / elapsed()


# -- DBOS on PostgreSQL ---------------------------------------------------------------


@dataclass
class DBOSWorkloads:
    """The DBOS workflows of the benchmark, registered on the current DBOS instance."""

    chain: Callable[[int], int]  # n trivial steps
    three: Callable[[], int]  # three trivial steps


def register_dbos_workloads(dbos: type[DBOS]) -> DBOSWorkloads:
    """Register the benchmark's workflows. Worker processes and the process that
    enqueues call this same function, so DBOS computes the same application
    version (a hash of the workflows' source) everywhere."""

    @dbos.step()
    def inc(x: int) -> int:
        return x + 1

    @dbos.workflow()
    def chain(n: int) -> int:
        x = 0
        for _ in range(n):
            x = inc(x)
        return x

    @dbos.workflow()
    def three() -> int:
        return inc(inc(inc(0)))

    return DBOSWorkloads(chain=chain, three=three)


@contextmanager
def dbos_session(
    url: str,
    *,
    executor_id: str | None = None,
    pool_size: int | None = None,
    listen: Sequence[str] | None = None,
) -> Iterator[type[DBOS]]:
    """A fresh DBOS instance whose system database is the PostgreSQL database ``url``.

    Register workflows inside the block, then ``launch()``. ``listen`` limits
    the queues this process dequeues from (``[]``: none of the user's).
    ``destroy(destroy_registry=True)`` on exit, so the next sample can register
    its functions again in this process.
    """
    from dbos import DBOS, DBOSConfig

    config: DBOSConfig = {"name": DBOS_APP, "system_database_url": url, "log_level": "WARNING"}
    if executor_id is not None:
        config["executor_id"] = executor_id
    if pool_size is not None:
        config["sys_db_pool_size"] = pool_size
    DBOS.destroy(destroy_registry=True)  # in case an earlier measurement failed half-way
    DBOS(config=config)
    try:
        if listen is not None:
            DBOS.listen_queues(listen)
        yield DBOS
    finally:
        DBOS.destroy(destroy_registry=True)


def dbos_step_us(steps: int = 300) -> float:
    """One DBOS workflow calling a trivial step ``steps`` times, inline, system
    database on PostgreSQL; µs per step."""
    with fresh_database("dbos") as url, dbos_session(url) as dbos:
        w = register_dbos_workloads(dbos)
        dbos.launch()
        w.chain(1)  # warm-up
        with stopwatch() as elapsed:
            result = w.chain(steps)
    if result != steps:
        raise RuntimeError(f"dbos chain returned {result}, expected {steps}")
    return elapsed() / steps * 1e6


def dbos_runs_per_s(n: int = 300) -> float:
    """``n`` DBOS workflows of 3 trivial steps, each called directly (inline); runs/s."""
    with fresh_database("dbos") as url, dbos_session(url) as dbos:
        w = register_dbos_workloads(dbos)
        dbos.launch()
        w.three()  # warm-up
        with stopwatch() as elapsed:
            for _ in range(n):
                result = w.three()
    if result != 3:
        raise RuntimeError(f"dbos 3-step workflow returned {result}, expected 3")
    return n / elapsed()
