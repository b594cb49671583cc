"""LangGraph checkpointers side by side, in one run: LangGraph's ``SqliteSaver``
and ``PostgresSaver`` against ``cairn.langgraph.CairnSaver`` on SQLite and on
PostgreSQL (issue 24's performance targets).

    python -m bench.langgraph_saver                       # 300 and 3,000 super-steps, all four
    python -m bench.langgraph_saver --steps 300 --only sqlite,cairn-sqlite
    python -m bench.langgraph_saver --json                # the figures as JSON on stdout
    python -m bench.langgraph_saver --breakdown           # and where the Cairn savers' bytes are
    python -m bench.langgraph_saver --floor-runs 0        # without the graph's floors
    python -m bench.langgraph_saver --steps 300 --rounds 9 --only sqlite,cairn-sqlite   # 9 paired rounds
    python -m bench.langgraph_saver --rounds 0            # the single runs alone

The workload is ``bench.graph``'s LangGraph graph, unchanged: one node,
``talk``, looping to itself until ``n`` reaches the step count, each
super-step appending one distinct 1 KB message (made-up words, about as
compressible as prose) to an ``operator.add`` list and setting ``n``.
"Logical bytes" is ``steps * 1024``. Every system runs the graph with
LangGraph's defaults (durability ``"async"``) on a fresh database: SQLite
files in a fresh temporary directory, PostgreSQL databases created on
``$CAIRN_BENCH_PG`` (``bench.pgdb``) and dropped after, after a short warm-up
run on another one. The table is one run per size of each system (the
first full-length run of that saver in the process), garbage collected and
file systems synced before it (``bench.common.settle``, as every timed run
here): until 2026-12-07 the run after SqliteSaver's paid for the kernel
writing back SqliteSaver's ~47 MB (CairnSaver on SQLite 1,061 µs a
super-step in the table against 782-933 in the paired rounds of the same
process; synced first, 849-868).

**Paired rounds** (``--rounds K``, 7 by default; 0: none, the output as
without them): one run is not a measurement on this machine (2 vCPUs,
shared: one 300-step run of CairnSaver on SQLite moved 800-1,600 µs a
super-step from run to run in one process, 2026-12-07). So after the table,
for each size and each pair ``--only`` selects (``sqlite`` with
``cairn-sqlite``, ``postgres`` with ``cairn-postgres``): each of the two
savers first runs the graph once at full length, uncounted (warm-up), then K
rounds each run LangGraph's saver and Cairn's once (``run``), each on a fresh
database (file), garbage collected and file systems synced before each run
(``bench.common.settle``), the order alternated round by round so that drift
hits both alike. Each round gives the two savers' µs per super-step (wall and
CPU) and their ratio (LangGraph's / Cairn's: the two ran next to each
other); reported are the median ratio, a distribution-free 95 % interval of
that median (``bench.audit.median_interval``: it needs 6 rounds or more,
fewer give an unbounded interval), the per-round differences
(``bench.audit.paired``), and the target judged on the interval
(``judge``): "shown" only when its lower end is >= 2, "missed" when its
upper end is under 2, else "not shown" (the noise spans 2). Rounds run at
sizes up to ``ROUNDS_UP_TO`` (1,000) super-steps: at 3,000 each LangGraph
run writes ~4.6 GB and the savers' single runs are 10x apart or more.

Figures:

* **µs per super-step**: the ``invoke``'s wall time / steps; **CPU µs per
  super-step**: the process CPU time (all threads) of the same invoke / steps
  (the database server's is not in it);
* **on disk / logical**: SQLite, the file after ``PRAGMA wal_checkpoint(TRUNCATE)``
  and ``VACUUM`` minus the same for the database before the run (tables
  made); PostgreSQL, ``pg_total_relation_size`` (heap, TOAST, indexes) of the
  saver's tables after ``VACUUM``, minus the same before the run;
* **get_state p50 / p99**: ms of ``graph.get_state`` at ``--samples`` random
  checkpoints (by ``checkpoint_id``), and p50 of the latest state (100 reads
  after 10 uncounted: ``LATEST_WARMUP``);
* **history page**: median ms of 20 reads of ``get_state_history(limit=10)``
  (states included), and the same read once by a new saver (cold);
* **CPU**: the process CPU time (``time.process_time``) of the same
  get_state reads (p50) and history pages (median): on a shared machine
  under load, wall times mostly measure the wait for a core.

**Floors** (``--floor-runs``, 3 by default; 0: none): the same graph in the
same process, run without a checkpointer, with a saver that stores nothing
(``NoopSaver``) and with LangGraph's ``InMemorySaver``, wall and CPU µs per
super-step, each the median of its runs (after one warm-up run). What is
above the no-op saver's floor is the saver's own work (and its threads'
waits); below each size the report puts every saver's share beside the
floor, and the ratio the target asks for in context: the most a saver that
cost nothing could reach against LangGraph's saver (its time / the floor),
and the CPU a super-step of a Cairn saver may take for 2x.

Ratios are against LangGraph's saver on the same database in the same run
(``cairn-sqlite`` / ``sqlite``, ``cairn-postgres`` / ``postgres``). Below each
size the issue's targets are judged: per super-step >= 2x faster than
LangGraph's saver on the same database, on disk <= 1.3x the logical bytes,
get_state p50 <= 1 ms (and flat in N: compare the sizes), history page
<= 10 ms.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.audit import median_interval, paired
from bench.common import environment, fresh_dir, settle, stopwatch
from bench.graph import MESSAGE_BYTES, file_bytes, langgraph_builder, percentile, timed_ms

SYSTEMS = ("sqlite", "cairn-sqlite", "postgres", "cairn-postgres")
BASELINE = {"cairn-sqlite": "sqlite", "cairn-postgres": "postgres"}
HISTORY_PAGE = 10
HISTORY_READS = 20
#: latest-state reads: ``LATEST_WARMUP`` uncounted, then the median of ``LATEST_READS``. The first
#: reads right after a run wait for the driver to prepare the statement on each pooled connection
#: (PostgreSQL: the median of the first 20 measured 1.7-3.0 ms, of the next 100 0.9-1.3 ms, on
#: main and on the packed ids alike, 2026-12-06); a service reads the latest state all day.
LATEST_WARMUP = 10
LATEST_READS = 100
#: the graph's floors: label -> how it is compiled (``floor``)
FLOORS = ("no checkpointer", "no-op saver", "InMemorySaver")
LG_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes", "checkpoint_migrations")
#: the issue's target: LangGraph's saver's µs per super-step / the Cairn saver's, at least
TARGET_SPEEDUP = 2.0
CAIRN_TABLES = ("cairn.lg_checkpoints", "cairn.lg_blobs", "cairn.lg_writes", "cairn.lg_values",
                "cairn.lg_threads")


@dataclass
class Figures:
    system: str
    steps: int
    step_us: float | None = None
    #: the same invoke's process CPU time (all threads; the database server's not counted)
    step_cpu_us: float | None = None
    disk_bytes: int | None = None
    state_p50_ms: float | None = None
    state_p99_ms: float | None = None
    latest_ms: float | None = None
    history_ms: float | None = None
    cold_history_ms: float | None = None
    #: the same reads' process CPU time (what a loaded shared machine inflates least)
    state_cpu_p50_ms: float | None = None
    history_cpu_ms: float | None = None
    checkpoints: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def disk_ratio(self) -> float | None:
        return None if self.disk_bytes is None else self.disk_bytes / (self.steps * MESSAGE_BYTES)

    def as_json(self) -> dict[str, Any]:
        return {**vars(self), "disk_ratio": self.disk_ratio}


# -- databases -----------------------------------------------------------------------


class Database:
    """Where one system runs: how to open its saver, and its bytes on disk."""

    def saver(self) -> tuple[Any, Callable[[], None]]:
        raise NotImplementedError

    def disk_bytes(self) -> int:
        raise NotImplementedError

    def checkpoint_ids(self) -> list[str]:
        """The thread's checkpoint ids, read from the table (listing them
        through LangGraph's savers would read every checkpoint's whole state:
        4.6 GB at 3,000 super-steps)."""
        raise NotImplementedError


class SqliteFile(Database):
    def __init__(self, path: Path, cairn: bool) -> None:
        self.path, self.cairn = path, cairn

    def saver(self) -> tuple[Any, Callable[[], None]]:
        if self.cairn:
            from cairn.langgraph import CairnSaver

            saver = CairnSaver(f"sqlite:///{self.path}", tenant="bench")
            return saver, saver.close
        from langgraph.checkpoint.sqlite import SqliteSaver

        context = SqliteSaver.from_conn_string(str(self.path))
        lg = context.__enter__()
        lg.setup()
        return lg, lambda: context.__exit__(None, None, None)

    def disk_bytes(self) -> int:
        return file_bytes(self.path, vacuum=True)

    def breakdown(self, steps: int) -> list[str]:
        """Where the file's bytes are, after ``VACUUM``: the pages of each
        ``lg_*`` table and index (``dbstat``) and the bytes of those pages
        not in use, per super-step (``--breakdown``)."""
        file_bytes(self.path, vacuum=True)
        lines = []
        with sqlite3.connect(self.path) as conn:
            rows = conn.execute(
                "SELECT name, sum(pgsize), sum(unused), sum(ncell) FROM dbstat WHERE name LIKE 'lg%'"
                " OR name LIKE 'sqlite_autoindex_lg%' GROUP BY name ORDER BY name").fetchall()
        for name, size, unused, cells in rows:
            if size:
                lines.append(f"{name}: {size / steps:,.0f} B/step (unused {unused / steps:,.0f});"
                             f" {cells / steps:.2f} cells/step")
        return lines

    def checkpoint_ids(self) -> list[str]:
        table, where = ("lg_checkpoints", "tenant = 'bench' AND ") if self.cairn else ("checkpoints", "")
        with sqlite3.connect(self.path) as conn:
            return [str(r[0]) for r in conn.execute(
                f"SELECT checkpoint_id FROM {table} WHERE {where}thread_id = 'chat'")]


class PostgresDatabase(Database):
    def __init__(self, url: str, cairn: bool) -> None:
        self.url, self.cairn = url, cairn

    def saver(self) -> tuple[Any, Callable[[], None]]:
        if self.cairn:
            from cairn.langgraph import CairnSaver

            saver = CairnSaver(self.url, tenant="bench")
            return saver, saver.close
        from langgraph.checkpoint.postgres import PostgresSaver

        context = PostgresSaver.from_conn_string(self.url)
        lg = context.__enter__()
        lg.setup()
        return lg, lambda: context.__exit__(None, None, None)

    def disk_bytes(self) -> int:
        import psycopg

        tables = CAIRN_TABLES if self.cairn else LG_TABLES
        with psycopg.connect(self.url, autocommit=True) as conn:
            total = 0
            for table in tables:
                conn.execute(f"VACUUM {table}")
                row = conn.execute("SELECT pg_total_relation_size(%s::regclass)", (table,)).fetchone()
                total += int(row[0]) if row else 0
        return total

    def breakdown(self, steps: int) -> list[str]:
        """Where the saver's bytes are, after ``VACUUM``: per table, its heap
        (its free space and visibility maps apart), TOAST and each index, and
        its rows per super-step (``--breakdown``)."""
        import psycopg

        tables = CAIRN_TABLES if self.cairn else LG_TABLES
        lines = []
        with psycopg.connect(self.url, autocommit=True) as conn:
            try:  # the heap's live tuple bytes and free space (a contrib module: absent, no figure)
                conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
                stattuple = True
            except psycopg.Error:
                stattuple = False
            for table in tables:
                conn.execute(f"VACUUM {table}")
                heap, maps, toast, total, rows = conn.execute(
                    "SELECT pg_relation_size(c.oid),"
                    " pg_relation_size(c.oid, 'fsm') + pg_relation_size(c.oid, 'vm'),"
                    " coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0),"
                    f" pg_total_relation_size(c.oid), (SELECT count(*) FROM {table})"
                    " FROM pg_class AS c WHERE c.oid = %s::regclass", (table,)).fetchone() or (0, 0, 0, 0, 0)
                indexes = conn.execute(
                    "SELECT i.indexrelid::regclass::text, pg_relation_size(i.indexrelid) FROM pg_index AS i"
                    " WHERE i.indrelid = %s::regclass ORDER BY 1", (table,)).fetchall()
                live = ""
                if stattuple:
                    tuple_len, free = conn.execute(
                        "SELECT tuple_len, free_space FROM pgstattuple(%s::regclass)", (table,)
                    ).fetchone() or (0, 0)
                    live = f" (tuples {tuple_len / steps:,.0f}, free {free / steps:,.0f})"
                lines.append(f"{table}: {total / steps:,.0f} B/step = heap {heap / steps:,.0f}{live} + maps "
                             f"{maps / steps:,.0f} + TOAST {toast / steps:,.0f} + "
                             + " + ".join(f"{name} {size / steps:,.0f}" for name, size in indexes)
                             + f"; {rows / steps:.2f} rows/step")
        return lines

    def checkpoint_ids(self) -> list[str]:
        import psycopg

        table = "cairn.lg_checkpoints" if self.cairn else "checkpoints"
        where = "tenant = 'bench' AND " if self.cairn else ""
        column = "cairn.lg_id_text(checkpoint_id)" if self.cairn else "checkpoint_id"  # packed (0050)
        with psycopg.connect(self.url, autocommit=True) as conn:
            return [str(r[0]) for r in conn.execute(
                f"SELECT {column} FROM {table} WHERE {where}thread_id = 'chat'")]


@contextmanager
def database(system: str, label: str) -> Iterator[Database]:
    cairn = system.startswith("cairn")
    if system.endswith("sqlite"):
        with fresh_dir(f"lgsaver-{label}") as d:
            yield SqliteFile(d / "db.sqlite", cairn)
        return
    from bench import pgdb

    with pgdb.fresh_database(f"lgsaver_{label}") as url:
        yield PostgresDatabase(url, cairn)


# -- one system at one size ------------------------------------------------------------


def config(**conf: str) -> Any:
    return {"configurable": {"thread_id": "chat", **conf}}


def run(saver: Any, steps: int) -> tuple[float, float]:
    """The invoke's wall seconds and the process's CPU seconds (every thread) in it."""
    graph = langgraph_builder(steps, {}).compile(checkpointer=saver)
    cpu = time.process_time()
    with stopwatch() as elapsed:
        final = graph.invoke({"messages": [], "n": 0}, {**config(), "recursion_limit": steps + 10})
    cpu = time.process_time() - cpu
    if final["n"] != steps or len(final["messages"]) != steps:
        raise RuntimeError(f"ended at n={final['n']} with {len(final['messages'])} messages")
    return elapsed(), cpu


def noop_saver() -> Any:
    """A checkpointer that stores nothing (a floor): LangGraph's loop still
    builds and hands over every checkpoint and pending write, so its floor is
    the graph's cost with a checkpointer, before any saver's own work."""
    from langgraph.checkpoint.base import BaseCheckpointSaver

    class NoopSaver(BaseCheckpointSaver[str]):
        def get_tuple(self, config: Any) -> None:
            return None

        def list(self, config: Any, **kw: Any) -> Iterator[Any]:
            return iter(())

        def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            conf = config["configurable"]
            return {"configurable": {"thread_id": conf["thread_id"],
                                     "checkpoint_ns": conf.get("checkpoint_ns", ""),
                                     "checkpoint_id": checkpoint["id"]}}

        def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
            return None

    return NoopSaver()


def floor_saver(label: str) -> Any:
    """The checkpointer of floor ``label`` (``FLOORS``): ``None`` for none."""
    if label == "no checkpointer":
        return None
    if label == "no-op saver":
        return noop_saver()
    from langgraph.checkpoint.memory import InMemorySaver

    return InMemorySaver()


def floor(label: str, steps: int, runs: int) -> tuple[float, float]:
    """Floor ``label``'s median wall and CPU µs per super-step over ``runs``
    runs of the graph (each with a fresh checkpointer), after one warm-up run."""
    walls, cpus = [], []
    for i in range(runs + 1):
        saver = floor_saver(label)
        graph = langgraph_builder(steps, {}).compile(checkpointer=saver)
        settle()
        cpu = time.process_time()
        with stopwatch() as elapsed:
            final = graph.invoke({"messages": [], "n": 0}, {**config(), "recursion_limit": steps + 10})
        cpu = time.process_time() - cpu
        if final["n"] != steps:
            raise RuntimeError(f"floor {label}: ended at n={final['n']}")
        if i:  # the first run warms imports and code paths
            walls.append(elapsed() / steps * 1e6)
            cpus.append(cpu / steps * 1e6)
    return statistics.median(walls), statistics.median(cpus)


def measure(system: str, steps: int, samples: int, seed: int, breakdown: bool = False) -> Figures:
    figures = Figures(system, steps)
    with database(system, "warm") as db:  # imports, code paths, connections: outside the figures
        saver, close = db.saver()
        try:
            run(saver, 3)
        finally:
            close()
    with database(system, system.replace("-", "_")) as db:
        saver, close = db.saver()
        try:
            empty = db.disk_bytes()
            settle()  # the previous system's dirty pages written back before, not during, this run
            wall, cpu = run(saver, steps)
            figures.step_us, figures.step_cpu_us = wall / steps * 1e6, cpu / steps * 1e6
            graph = langgraph_builder(2, {}).compile(checkpointer=saver)
            ids = db.checkpoint_ids()
            figures.checkpoints = len(ids)
            pick = random.Random(seed)
            reads, cpu = [], []
            for c in (pick.choice(ids) for _ in range(samples)):
                at = time.process_time()
                reads.append(timed_ms(lambda c=c: graph.get_state(config(checkpoint_id=c))))  # type: ignore[misc]
                cpu.append((time.process_time() - at) * 1e3)
            figures.state_p50_ms, figures.state_p99_ms = percentile(reads, 50), percentile(reads, 99)
            figures.state_cpu_p50_ms = percentile(cpu, 50)
            for _ in range(LATEST_WARMUP):
                graph.get_state(config())
            figures.latest_ms = statistics.median(timed_ms(lambda: graph.get_state(config()))
                                                  for _ in range(LATEST_READS))
            page = list(graph.get_state_history(config(), limit=HISTORY_PAGE))
            if len(page) != HISTORY_PAGE or len(page[0].values["messages"]) != steps:
                raise RuntimeError(f"{system}: the history page is not the last {HISTORY_PAGE} checkpoints")
            pages, cpu = [], []
            for _ in range(HISTORY_READS):
                at = time.process_time()
                pages.append(timed_ms(lambda: list(graph.get_state_history(config(), limit=HISTORY_PAGE))))
                cpu.append((time.process_time() - at) * 1e3)
            figures.history_ms, figures.history_cpu_ms = statistics.median(pages), statistics.median(cpu)
        finally:
            close()
        cold, close = db.saver()
        try:
            fresh = langgraph_builder(2, {}).compile(checkpointer=cold)
            figures.cold_history_ms = timed_ms(lambda: list(fresh.get_state_history(config(),
                                                                                    limit=HISTORY_PAGE)))
        finally:
            close()
        figures.disk_bytes = db.disk_bytes() - empty
        if breakdown and isinstance(db, PostgresDatabase | SqliteFile) and (
                db.cairn or isinstance(db, PostgresDatabase)):
            figures.notes += db.breakdown(steps)
    return figures


# -- report --------------------------------------------------------------------------


ROWS = (
    ("µs per super-step", "step_us"),
    ("CPU µs per super-step", "step_cpu_us"),
    ("on disk, bytes", "disk_bytes"),
    ("on disk / logical", "disk_ratio"),
    ("get_state p50, ms", "state_p50_ms"),
    ("get_state p99, ms", "state_p99_ms"),
    ("get_state CPU p50, ms", "state_cpu_p50_ms"),
    ("latest state p50, ms", "latest_ms"),
    ("history page (10), ms", "history_ms"),
    ("history page CPU, ms", "history_cpu_ms"),
    ("cold history page, ms", "cold_history_ms"),
    ("checkpoints", "checkpoints"),
)


def fmt(value: float | None) -> str:
    if value is None:
        return "—"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.3f}" if value < 1 else f"{value:,.2f}" if value < 100 else f"{value:,.0f}"


def targets(by: dict[str, Figures]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for system, base in BASELINE.items():
        c, b = by.get(system), by.get(base)
        if c is None:
            continue
        speedup = b.step_us / c.step_us if b is not None and b.step_us and c.step_us else None
        for what, value, met in (
            (f"{base} / {system} per super-step >= 2", speedup, None if speedup is None else speedup >= 2),
            (f"{system} on disk / logical <= 1.3", c.disk_ratio,
             None if c.disk_ratio is None else c.disk_ratio <= 1.3),
            (f"{system} get_state p50 <= 1 ms", c.state_p50_ms,
             None if c.state_p50_ms is None else c.state_p50_ms <= 1),
            (f"{system} history page <= 10 ms", c.history_ms,
             None if c.history_ms is None else c.history_ms <= 10),
        ):
            out.append({"target": what, "measured": value, "met": met})
    return out


def floor_lines(floors: dict[str, tuple[float, float]], measured: Sequence[Figures]) -> list[str]:
    """The floors, each saver's work above the no-op saver's, and the target's ratio in context."""
    lines = [f"floor {label}: {fmt(wall)} µs wall, {fmt(cpu)} CPU µs per super-step"
             for label, (wall, cpu) in floors.items()]
    noop = floors.get("no-op saver")
    if noop is None:
        return lines
    for f in measured:
        if f.step_us is not None and f.step_cpu_us is not None:
            lines.append(f"saver's own work, {f.system} (above the no-op saver): {f.step_us - noop[0]:,.0f}"
                         f" µs wall, {f.step_cpu_us - noop[1]:,.0f} CPU µs per super-step")
    by = {f.system: f for f in measured}
    for system, base in BASELINE.items():
        b = by.get(base)
        if b is None or b.step_us is None or b.step_cpu_us is None:
            continue
        half = b.step_us / 2
        lines.append(f"context {base} / {system} >= 2: a saver costing nothing would reach "
                     f"{b.step_us / noop[0]:.2f}x wall ({b.step_cpu_us / noop[1]:.2f}x CPU); 2x needs "
                     f"{system} <= {half:,.0f} µs wall, its own work <= {half - noop[0]:,.0f} µs"
                     " above the floor")
    return lines


def report(steps: int, measured: Sequence[Figures],
           floors: dict[str, tuple[float, float]] | None = None) -> None:
    print(f"\n== {steps:,} super-steps, 1 KB appended per step: {steps * MESSAGE_BYTES:,} logical bytes")
    by = {f.system: f for f in measured}
    pairs = [(c, b) for c, b in BASELINE.items() if c in by and b in by]
    header = f"{'figure':<26}" + "".join(f"{f.system:>16}" for f in measured)
    header += "".join(f"{c + '/' + b:>24}" for c, b in pairs)
    print(header)
    print("-" * len(header))
    for label, attr in ROWS:
        line = f"{label:<26}" + "".join(f"{fmt(getattr(f, attr)):>16}" for f in measured)
        for c, b in pairs:
            x, y = getattr(by[c], attr), getattr(by[b], attr)
            line += f"{f'{x / y:,.3f}x' if x is not None and y else '':>24}"
        print(line.rstrip())
    for f in measured:
        for note in f.notes:
            print(f"{f.system}: {note}")
    for line in floor_lines(floors or {}, measured):
        print(line)
    for t in targets(by):
        verdict = "—" if t["met"] is None else "met" if t["met"] else "MISSED"
        print(f"target {t['target']}: {fmt(t['measured'])} {verdict}")


# -- paired rounds ---------------------------------------------------------------------


def judge(ratios: Sequence[float], bound: float = TARGET_SPEEDUP) -> tuple[float, float, float, str]:
    """The median of per-round ratios (higher is better), the 95 % interval
    of that median (``bench.audit.median_interval``) and the target judged on
    it, as ``bench.audit.verdict`` judges a bound the other way round:
    "shown" when the interval's lower end is at or over ``bound``, "missed"
    when its upper end is under it, else "not shown" (the interval spans it)."""
    low, high = median_interval(list(ratios))
    word = "shown" if low >= bound else "missed" if high < bound else "not shown"
    return statistics.median(ratios), low, high, word


def step_run(system: str, steps: int, label: str) -> tuple[float, float]:
    """One run of ``steps`` super-steps by ``system``'s saver on a fresh
    database: wall and CPU µs per super-step."""
    with database(system, label) as db:
        saver, close = db.saver()
        try:
            settle()
            wall, cpu = run(saver, steps)
        finally:
            close()
    return wall / steps * 1e6, cpu / steps * 1e6


def finite(value: float) -> float | None:
    """``value``, or ``None`` for an unbounded end of an interval (JSON has no infinity)."""
    return value if abs(value) != float("inf") else None


#: paired rounds run at sizes up to this many super-steps: at 3,000 LangGraph's savers write ~4.6 GB a
#: run (16 more runs a pair would take most of an hour) and the single runs are 10x apart or more
ROUNDS_UP_TO = 1_000


def paired_rounds(base: str, system: str, steps: int, rounds: int,
                  echo: Callable[[str], None] | None = None) -> dict[str, Any]:
    """``rounds`` paired runs of LangGraph's saver ``base`` and Cairn's
    ``system`` at ``steps`` super-steps, after one uncounted full-length run
    of each; the order alternates round by round. Each round's line is passed
    to ``echo`` as it ends (a long run shows progress)."""
    for s in (base, system):  # the first full-length run of a saver in a process is its slowest
        step_run(s, steps, f"warm_{s}")
    out: list[dict[str, Any]] = []
    for i in range(rounds):
        order = (base, system) if i % 2 == 0 else (system, base)
        got = {s: step_run(s, steps, f"r{i}_{s}") for s in order}
        one = {"round": i + 1, "first": order[0],
               "baseline_us": got[base][0], "system_us": got[system][0],
               "baseline_cpu_us": got[base][1], "system_cpu_us": got[system][1],
               "ratio": got[base][0] / got[system][0],
               "cpu_ratio": got[base][1] / got[system][1] if got[system][1] else None}
        out.append(one)
        if echo is not None:
            echo(round_line(base, system, one))
    return paired_figures(base, system, steps, out)


def paired_figures(base: str, system: str, steps: int, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The paired section's figures (JSON-ready) from its rounds."""
    ratio, low, high, word = judge([r["ratio"] for r in rounds])
    cpus = [r["cpu_ratio"] for r in rounds if r["cpu_ratio"] is not None]
    cpu_ratio, cpu_low, cpu_high, _ = judge(cpus) if cpus else (None, None, None, None)
    return {"baseline": base, "system": system, "steps": steps, "rounds": rounds,
            "ratio_median": ratio, "ratio_low": finite(low), "ratio_high": finite(high),
            "cpu_ratio_median": cpu_ratio,
            "cpu_ratio_low": None if cpu_low is None else finite(cpu_low),
            "cpu_ratio_high": None if cpu_high is None else finite(cpu_high),
            "target": f"{base} / {system} per super-step >= {TARGET_SPEEDUP:g}"
                      f" (paired, {len(rounds)} rounds)",
            "verdict": word}


def round_line(base: str, system: str, r: dict[str, Any]) -> str:
    cpu = f"{r['cpu_ratio']:.2f}x" if r["cpu_ratio"] is not None else "—"
    return (f"round {r['round']} ({r['first']} first): {base} {r['baseline_us']:,.0f} µs, {system} "
            f"{r['system_us']:,.0f} µs per super-step, ratio {r['ratio']:.2f}x; CPU "
            f"{r['baseline_cpu_us']:,.0f} / {r['system_cpu_us']:,.0f} µs, {cpu}")


def interval(low: float | None, high: float | None) -> str:
    return f"[{'-inf' if low is None else f'{low:.2f}'}, {'inf' if high is None else f'{high:.2f}'}]"


def paired_lines(p: dict[str, Any]) -> list[str]:
    """The paired section's summary and its target line (the rounds' lines come first, as they end)."""
    base, system, rounds = p["baseline"], p["system"], p["rounds"]
    lines = [f"paired {base} / {system} per super-step: median {p['ratio_median']:.2f}x, 95 % interval "
             f"of the median {interval(p['ratio_low'], p['ratio_high'])} ({len(rounds)} rounds)"]
    if p["cpu_ratio_median"] is not None:
        lines.append(f"paired {base} / {system} CPU per super-step: median {p['cpu_ratio_median']:.2f}x, "
                     f"95 % interval of the median {interval(p['cpu_ratio_low'], p['cpu_ratio_high'])}")
    if len(rounds) >= 2:
        diffs = [r["baseline_us"] - r["system_us"] for r in rounds]
        lines.append(f"{base} minus {system} µs per super-step: {paired(diffs)}")
    lines.append(f"target {p['target']}: {p['ratio_median']:.2f} "
                 f"{interval(p['ratio_low'], p['ratio_high'])} {p['verdict']}")
    return lines


def pairs_of(only: Sequence[str]) -> list[tuple[str, str]]:
    """The (LangGraph's saver, Cairn's) pairs ``--only`` selects both of."""
    return [(base, system) for system, base in BASELINE.items() if system in only and base in only]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, nargs="+", default=[300, 3000])
    parser.add_argument("--only", default=",".join(SYSTEMS),
                        help=f"comma-separated systems, of: {', '.join(SYSTEMS)}")
    parser.add_argument("--samples", type=int, default=100, help="random checkpoints read per size")
    parser.add_argument("--seed", type=int, default=24)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of tables")
    parser.add_argument("--floor-runs", type=int, default=3,
                        help="runs of each floor of the graph (no checkpointer, a no-op saver, "
                             "InMemorySaver) per size, their median reported; 0: no floors")
    parser.add_argument("--breakdown", action="store_true",
                        help="PostgreSQL: bytes per super-step of each table's heap, maps, TOAST and indexes")
    parser.add_argument("--rounds", type=int, default=7,
                        help="after the single runs, paired rounds of each pair --only selects (LangGraph's "
                             "saver and Cairn's, alternated, after one full-length warm-up run of each): "
                             "the median ratio, its 95 %% interval and the 2x target on it; 0: none")
    args = parser.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(SYSTEMS))
    if unknown:
        parser.error(f"--only: unknown system {', '.join(unknown)} (known: {', '.join(SYSTEMS)})")
    if any(n < HISTORY_PAGE for n in args.steps) or args.samples < 2 or min(args.floor_runs, args.rounds) < 0:
        parser.error(f"--steps must be at least {HISTORY_PAGE}, --samples at least 2, "
                     "--floor-runs and --rounds at least 0")
    sizes = []
    for steps in args.steps:
        measured = [measure(system, steps, args.samples, args.seed, args.breakdown)
                    for system in SYSTEMS if system in only]
        floors = {label: floor(label, steps, args.floor_runs) for label in FLOORS} if args.floor_runs else {}
        by = {f.system: f for f in measured}
        sizes.append({"steps": steps, "logical_bytes": steps * MESSAGE_BYTES,
                      **{f.system: f.as_json() for f in measured}, "targets": targets(by),
                      "floors": {label: {"step_us": wall, "step_cpu_us": cpu}
                                 for label, (wall, cpu) in floors.items()}})
        if not args.json:
            report(steps, measured, floors)
        if args.rounds and steps <= ROUNDS_UP_TO:
            sizes[-1]["paired"] = []
            for base, system in pairs_of(only):
                if not args.json:
                    print(f"\n-- paired rounds, {steps:,} super-steps: {base} and {system}, {args.rounds}"
                          " rounds (each saver warmed by one uncounted full-length run; every run on a fresh"
                          " database; the order alternated round by round)", flush=True)
                p = paired_rounds(base, system, steps, args.rounds,
                                  None if args.json else lambda line: print(line, flush=True))
                sizes[-1]["paired"].append(p)
                if not args.json:
                    for line in paired_lines(p):
                        print(line, flush=True)
    if args.json:
        json.dump({**environment(), "sizes": sizes}, sys.stdout, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
