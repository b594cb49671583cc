"""Competitor and floor baselines: fsync, bare sqlite3, LangGraph + SqliteSaver, DBOS on SQLite.

Each function sets up its own fresh temporary database, runs one measurement
and returns one float; setup, a tiny warm-up call and teardown stay outside
the timed region. Repetition and medians are the caller's business (see
``bench.common.median_of`` and ``bench.engine``), except :func:`fsync_cost_us`,
which is itself a median over many single fsyncs.

LangGraph and DBOS are imported lazily so that this module imports without
them; a missing package surfaces as ``ImportError`` from the function.

Run directly for a quick look: ``python -m bench.baselines [name ...] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from bench.common import fresh_dir, median_of, stopwatch

if TYPE_CHECKING:
    from dbos import DBOS

SYNCHRONOUS_LEVELS = ("OFF", "NORMAL", "FULL", "EXTRA")


# -- floors ------------------------------------------------------------------


def fsync_cost_us(samples: int = 200, write_size: int = 64) -> float:
    """Median cost, in µs, of one ``os.fsync`` after a small append to a file."""
    payload = b"x" * write_size
    with fresh_dir("fsync") as d:
        fd = os.open(d / "fsync.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, payload)
            os.fsync(fd)  # first fsync also persists the new inode; not representative
            timings: list[float] = []
            for _ in range(samples):
                os.write(fd, payload)
                start = time.perf_counter()
                os.fsync(fd)
                timings.append(time.perf_counter() - start)
        finally:
            os.close(fd)
    return statistics.median(timings) * 1e6


def fdatasync_overwrite_us(samples: int = 200, write_size: int = 64, blocks: int = 64) -> float:
    """Median cost, in µs, of one ``os.fdatasync`` after overwriting a small
    part of a file that already has its size: what the write tool's barrier
    syncs once the WAL has grown (data blocks, no new file size)."""
    payload = b"x" * write_size
    with fresh_dir("fdatasync") as d:
        fd = os.open(d / "fdatasync.bin", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"\0" * 4096 * blocks)
            os.fsync(fd)  # the file's size and blocks are on disk before the timed syncs
            timings: list[float] = []
            for i in range(samples):
                os.pwrite(fd, payload, (i % blocks) * 4096)
                start = time.perf_counter()
                os.fdatasync(fd)
                timings.append(time.perf_counter() - start)
        finally:
            os.close(fd)
    return statistics.median(timings) * 1e6


def bare_sqlite_step_us(iterations: int = 2000, synchronous: str = "NORMAL") -> float:
    """Bare ``sqlite3`` (WAL): INSERT a small journal row + UPDATE the run row + COMMIT; µs each.

    This is roughly the least a journaled step can write. With
    ``synchronous=NORMAL`` (the default here) WAL commits do not fsync; pass
    ``"FULL"`` for an fsync per commit.
    """
    level = synchronous.upper()
    if level not in SYNCHRONOUS_LEVELS:
        raise ValueError(f"synchronous must be one of {SYNCHRONOUS_LEVELS}, not {synchronous!r}")
    with fresh_dir("sqlite") as d:
        conn = sqlite3.connect(d / "bare.sqlite", isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={level}")
            conn.execute(
                "CREATE TABLE runs (id TEXT PRIMARY KEY, status TEXT NOT NULL,"
                " last_seq INTEGER NOT NULL, updated_at REAL NOT NULL)"
            )
            conn.execute(
                "CREATE TABLE events (run_id TEXT NOT NULL, seq INTEGER NOT NULL,"
                " kind TEXT NOT NULL, payload BLOB, PRIMARY KEY (run_id, seq))"
            )
            conn.execute("INSERT INTO runs VALUES ('run-1', 'running', 0, 0.0)")
            payload = b'{"result": 12345}'

            def step(seq: int) -> None:
                conn.execute("BEGIN")
                conn.execute(
                    "INSERT INTO events (run_id, seq, kind, payload) VALUES ('run-1', ?, 'step', ?)",
                    (seq, payload),
                )
                conn.execute(
                    "UPDATE runs SET last_seq = ?, updated_at = ? WHERE id = 'run-1'",
                    (seq, time.time()),
                )
                conn.execute("COMMIT")

            warm = 20
            for seq in range(1, warm + 1):
                step(seq)
            with stopwatch() as elapsed:
                for seq in range(warm + 1, warm + iterations + 1):
                    step(seq)
        finally:
            conn.close()
    return elapsed() / iterations * 1e6


# -- LangGraph -----------------------------------------------------------------


class CountState(TypedDict):
    count: int


def _increment(state: CountState) -> CountState:
    return {"count": state["count"] + 1}


def langgraph_step_us(steps: int = 300) -> float:
    """One invoke of a self-looping one-node StateGraph doing ``steps`` node executions; µs per step.

    Checkpointer: ``SqliteSaver`` on a file (its own defaults: WAL,
    ``synchronous`` left at SQLite's default FULL); graph durability left at
    LangGraph's default (``"async"``).
    """
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph

    def route(state: CountState) -> str:
        return END if state["count"] >= steps else "inc"

    builder = StateGraph(CountState)
    builder.add_node("inc", _increment)
    builder.add_edge(START, "inc")
    builder.add_conditional_edges("inc", route, ["inc", END])

    with fresh_dir("langgraph") as d, SqliteSaver.from_conn_string(str(d / "lg.sqlite")) as saver:
        graph = builder.compile(checkpointer=saver)
        # Warm-up: one node execution on another thread (starts one short of the goal).
        graph.invoke({"count": steps - 1}, {"configurable": {"thread_id": "warm-up"}})
        config: Any = {"configurable": {"thread_id": "chain"}, "recursion_limit": steps + 10}
        with stopwatch() as elapsed:
            final = graph.invoke({"count": 0}, config)
    if final["count"] != steps:
        raise RuntimeError(f"langgraph chain ended at {final['count']}, expected {steps}")
    return elapsed() / steps * 1e6


def langgraph_runs_per_s(n: int = 300) -> float:
    """``n`` invokes, each on a new thread_id, of a 3-node linear graph with SqliteSaver; runs/s."""
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph

    builder = StateGraph(CountState)
    builder.add_node("a", _increment)
    builder.add_node("b", _increment)
    builder.add_node("c", _increment)
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("b", "c")
    builder.add_edge("c", END)

    with fresh_dir("langgraph") as d, SqliteSaver.from_conn_string(str(d / "lg.sqlite")) as saver:
        graph = builder.compile(checkpointer=saver)
        graph.invoke({"count": 0}, {"configurable": {"thread_id": "warm-up"}})
        with stopwatch() as elapsed:
            for i in range(n):
                final = graph.invoke({"count": 0}, {"configurable": {"thread_id": f"run-{i}"}})
    if final["count"] != 3:
        raise RuntimeError(f"langgraph 3-node run ended at {final['count']}, expected 3")
    return n / elapsed()


# -- DBOS ----------------------------------------------------------------------


@contextmanager
def _dbos_configured(directory: Path) -> Iterator[type[DBOS]]:
    """A fresh DBOS instance on a SQLite system database in ``directory``; destroyed on exit.

    Register workflows and steps inside the block, then call ``DBOS.launch()``.
    ``destroy(destroy_registry=True)`` drops the registrations too, so the next
    measurement can register its functions again in this process.
    """
    from dbos import DBOS, DBOSConfig

    config: DBOSConfig = {
        "name": "cairn-bench",
        "system_database_url": f"sqlite:///{directory / 'dbos.sqlite'}",
        "log_level": "WARNING",
    }
    DBOS.destroy(destroy_registry=True)  # in case an earlier measurement failed half-way
    DBOS(config=config)
    try:
        yield DBOS
    finally:
        DBOS.destroy(destroy_registry=True)


def dbos_step_us(steps: int = 300) -> float:
    """One DBOS workflow calling a trivial ``@DBOS.step()`` ``steps`` times, inline; µs per step."""
    with fresh_dir("dbos") as d, _dbos_configured(d) as dbos:

        @dbos.step()
        def inc(x: int) -> int:
            return x + 1

        @dbos.workflow()
        def chain(n: int) -> int:
            x = 0
            for _ in range(n):
                x = inc(x)
            return x

        dbos.launch()
        chain(1)  # warm-up
        with stopwatch() as elapsed:
            result = chain(steps)
    if result != steps:
        raise RuntimeError(f"dbos chain returned {result}, expected {steps}")
    return elapsed() / steps * 1e6


def dbos_runs_per_s(n: int = 300) -> float:
    """``n`` DBOS workflows of 3 trivial steps, each called directly (runs inline); runs/s."""
    with fresh_dir("dbos") as d, _dbos_configured(d) as dbos:

        @dbos.step()
        def inc(x: int) -> int:
            return x + 1

        @dbos.workflow()
        def three() -> int:
            return inc(inc(inc(0)))

        dbos.launch()
        three()  # warm-up
        with stopwatch() as elapsed:
            for _ in range(n):
                result = three()
    if result != 3:
        raise RuntimeError(f"dbos 3-step workflow returned {result}, expected 3")
    return n / elapsed()


# -- command line ----------------------------------------------------------------

#: name -> (unit, full-size call, quick call)
BASELINES: dict[str, tuple[str, Callable[[], float], Callable[[], float]]] = {
    "fsync": ("µs", fsync_cost_us, lambda: fsync_cost_us(samples=50)),
    "sqlite": ("µs/step", bare_sqlite_step_us, lambda: bare_sqlite_step_us(iterations=300)),
    "sqlite_full": (
        "µs/step",
        lambda: bare_sqlite_step_us(iterations=500, synchronous="FULL"),
        lambda: bare_sqlite_step_us(iterations=100, synchronous="FULL"),
    ),
    "langgraph_step": ("µs/step", langgraph_step_us, lambda: langgraph_step_us(steps=50)),
    "langgraph_runs": ("runs/s", langgraph_runs_per_s, lambda: langgraph_runs_per_s(n=50)),
    "dbos_step": ("µs/step", dbos_step_us, lambda: dbos_step_us(steps=50)),
    "dbos_runs": ("runs/s", dbos_runs_per_s, lambda: dbos_runs_per_s(n=50)),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.baselines", description="Measure the competitor and floor baselines."
    )
    choices = ", ".join(BASELINES)
    parser.add_argument("names", nargs="*", metavar="name", help=f"one of {choices} (default: all)")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--repeats", type=int, default=3, help="samples per figure; the median is printed")
    parser.add_argument("--json", action="store_true", help="one JSON object per line instead of text")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in BASELINES]
    if unknown:
        parser.error(f"unknown baseline(s): {', '.join(unknown)}; choose from {', '.join(BASELINES)}")
    status = 0
    for name in args.names or list(BASELINES):
        unit, full, quick = BASELINES[name]
        try:
            sample = median_of(quick if args.quick else full, repeats=args.repeats)
        except ImportError as exc:
            print(f"{name}: skipped ({type(exc).__name__}: {exc})", file=sys.stderr)
            status = 1
            continue
        if args.json:
            print(json.dumps({"name": name, "unit": unit, "median": sample.median, "samples": sample.values}))
        else:
            shown = ", ".join(f"{v:.1f}" for v in sample.values)
            print(f"{name}: {sample.median:.1f} {unit} (median of {len(sample.values)}: {shown})")
        sys.stdout.flush()
    return status


if __name__ == "__main__":
    sys.exit(main())
