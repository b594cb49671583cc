"""Graph workflows (issue 23), side by side with LangGraph 1.2 + ``SqliteSaver``, in one run.

    python -m bench.graph                          # 300 and 3,000 super-steps, both systems
    python -m bench.graph --steps 300 --only langgraph
    python -m bench.graph --steps 300 3000 --json  # the figures as JSON on stdout

The workload, on each system: a graph of one node, ``talk``, that loops to
itself through a conditional route until ``n`` reaches the step count; each
super-step appends one 1 KB message (distinct per step: words drawn from a
made-up vocabulary, which compresses about as little as prose; all of them drawn
before the run, outside the timed region) to a list field
reduced by appending (LangGraph ``Annotated[list[str], operator.add]``, Cairn
``cairn.append``) and sets ``n``. "Logical bytes" is the sum of the appended
messages' bytes: ``steps * 1024``; every storage ratio is over it.

Figures (each system on a fresh SQLite file in a fresh temporary directory,
after a short warm-up run in another one, in a fresh interpreter of its own
(the systems run one after the other, never at once); one run per size, no
repeats):

* **on disk**: the database file after ``PRAGMA wal_checkpoint(TRUNCATE)``
  (Cairn: plus its artifact directory) minus the same for the empty database
  (tables created, nothing run); and the same after ``VACUUM`` on both sides;
* **µs per super-step**: the run's wall time / steps, and its CPU time
  (``time.process_time``: every thread of the process) / steps, which the
  load of a shared machine inflates less; and, from the time at
  which each super-step's node starts, the median interval of the first 10
  and of the last 10 super-steps (median, not mean: one stall of a shared
  machine would otherwise decide the figure) and their ratio;
* **state at a checkpoint**: p50 / p99 ms of reading the state at ``--samples``
  random checkpoints (LangGraph ``get_state`` with a ``checkpoint_id``; Cairn
  ``app.graph_state(run_id, step)``); and, Cairn only, the same read as plain
  JSON without the graph's code (``app.graph_state_json``: the CLI's and the
  HTTP API's reader);
* **first page of history**: median ms of 20 reads of the newest 10
  checkpoints (LangGraph ``get_state_history(limit=10)``, which returns the
  states too; Cairn ``app.checkpoints(run_id, limit=10)``); and the *cold*
  first read: the same page read once by a reader that has read nothing of
  the run yet (a new ``SqliteSaver`` / a new ``App`` on the same file), the
  median of 5 such readers;
* **diff of two checkpoints**: Cairn only, p50 / p99 ms of
  ``cairn.graph.diff.diff`` of the states at two random checkpoints (read
  first, outside the timed region), and of reading both and diffing them.
  LangGraph has no diff of states.

LangGraph runs with its defaults, as in ``bench.baselines``: ``SqliteSaver``
from a file (WAL, SQLite's default ``synchronous=FULL``), durability
``"async"`` (a checkpoint is written in the background while the next step
runs). Below each size's table the issue's targets are judged: storage
<= 1.3x the logical bytes; per super-step >= 10x faster than LangGraph and
last 10 / first 10 <= 1.2; state p50 <= 1 ms and p99 <= 5 ms; history page
<= 10 ms; diff <= 5 ms. Without ``cairn.Graph`` (a checkout before the graph
core) the Cairn side is skipped with one line saying so.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import operator
import random
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypedDict

import cairn
from bench.common import environment, fresh_dir, stopwatch
from bench.model_journal import text, tree_bytes

MESSAGE_BYTES = 1024
HISTORY_PAGE = 10
HISTORY_READS = 20
#: cold first pages measured, each by a new reader (the median is reported: one
#: read of a shared machine is as likely to time a stall as the read)
COLD_READS = 5
SYSTEMS = ("langgraph", "langgraph-sync", "cairn")
DURABILITY = {"langgraph": "async", "langgraph-sync": "sync"}
NO_GRAPH = "cairn.Graph not available on this checkout"


def message(step: int) -> str:
    """The 1 KB appended at super-step ``step`` (ASCII, so characters are bytes)."""
    return text("message", step, MESSAGE_BYTES, "words")


def messages(steps: int) -> list[str]:
    """Every message of a run of ``steps`` super-steps, made before the run
    starts: drawing 1 KB of words costs about 300 µs, as much as a Cairn
    super-step, and is no part of either system's cost."""
    return [message(n) for n in range(steps)]


@dataclass
class Figures:
    """One system's figures at one size; ``None`` where not measured (``notes`` says why)."""

    system: str
    steps: int
    disk_bytes: int | None = None
    vacuumed_bytes: int | None = None
    step_us: float | None = None
    #: the process's CPU time (all its threads) over the run / steps: what a
    #: shared machine's load inflates least (wall time waits for a core too)
    step_cpu_us: float | None = None
    first10_us: float | None = None
    last10_us: float | None = None
    state_p50_ms: float | None = None
    state_p99_ms: float | None = None
    history_ms: float | None = None
    cold_history_ms: float | None = None
    json_p50_ms: float | None = None
    json_p99_ms: float | None = None
    diff_p50_ms: float | None = None
    diff_p99_ms: float | None = None
    read_diff_p50_ms: float | None = None
    read_diff_p99_ms: float | None = None
    checkpoints: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def logical_bytes(self) -> int:
        return self.steps * MESSAGE_BYTES

    @property
    def disk_ratio(self) -> float | None:
        return None if self.disk_bytes is None else self.disk_bytes / self.logical_bytes

    @property
    def vacuumed_ratio(self) -> float | None:
        return None if self.vacuumed_bytes is None else self.vacuumed_bytes / self.logical_bytes

    @property
    def flat_ratio(self) -> float | None:
        if self.first10_us is None or self.last10_us is None or self.first10_us == 0:
            return None
        return self.last10_us / self.first10_us

    def as_json(self) -> dict[str, Any]:
        doc = {k: v for k, v in vars(self).items()}
        doc.update(logical_bytes=self.logical_bytes, disk_ratio=self.disk_ratio,
                   vacuumed_ratio=self.vacuumed_ratio, flat_ratio=self.flat_ratio)
        return doc


# -- measuring helpers -----------------------------------------------------------


def file_bytes(path: Path, *, vacuum: bool = False) -> int:
    """The SQLite file at ``path`` once its WAL is checkpointed into it (after ``VACUUM`` if asked)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        if vacuum:
            conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    finally:
        conn.close()
    return path.stat().st_size


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (p99 of 100 samples is the second largest)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(pct / 100 * len(ordered))))
    return ordered[rank - 1]


def step_intervals(started: dict[int, float], figures: Figures) -> None:
    """Fill the per-step figures from the time each super-step's node started (keyed by ``n``)."""
    times = [started[n] for n in sorted(started)]
    gaps = [(b - a) * 1e6 for a, b in itertools.pairwise(times)]
    if len(gaps) >= 20:
        figures.first10_us = statistics.median(gaps[:10])
        figures.last10_us = statistics.median(gaps[-10:])
    else:
        figures.notes.append("first/last 10: fewer than 21 super-steps")


def timed_ms(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


# -- LangGraph -----------------------------------------------------------------


class LangGraphState(TypedDict):
    messages: Annotated[list[str], operator.add]
    n: int


def langgraph_builder(steps: int, started: dict[int, float]) -> Any:
    from langgraph.graph import END, START, StateGraph

    texts = messages(steps)

    def talk(state: LangGraphState) -> dict[str, Any]:
        started[state["n"]] = time.perf_counter()
        return {"messages": [texts[state["n"]]], "n": state["n"] + 1}

    def route(state: LangGraphState) -> str:
        return END if state["n"] >= steps else "talk"

    builder = StateGraph(LangGraphState)
    builder.add_node("talk", talk)
    builder.add_edge(START, "talk")
    builder.add_conditional_edges("talk", route, ["talk", END])
    return builder


def langgraph_run(directory: Path, steps: int, started: dict[int, float],
                  durability: str = "async") -> tuple[Any, Any, Path, float]:
    """Run the graph on a fresh ``SqliteSaver`` file; returns (graph, saver's context, file, seconds)."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    path = directory / "langgraph.sqlite"
    context = SqliteSaver.from_conn_string(str(path))
    saver = context.__enter__()
    saver.setup()
    graph = langgraph_builder(steps, started).compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": "chat"}, "recursion_limit": steps + 10}
    empty, empty_vacuumed = file_bytes(path), file_bytes(path, vacuum=True)
    cpu = time.process_time()
    with stopwatch() as elapsed:
        final = graph.invoke({"messages": [], "n": 0}, config, durability=durability)
    graph.cpu_seconds = time.process_time() - cpu  # type: ignore[attr-defined]
    if final["n"] != steps or len(final["messages"]) != steps:
        raise RuntimeError(f"langgraph ended at n={final['n']} with {len(final['messages'])} messages")
    seconds = elapsed()
    graph.empties = (empty, empty_vacuumed)  # type: ignore[attr-defined]
    return graph, context, path, seconds


def langgraph_cold_page(path: Path, steps: int) -> float:
    """The first history page read by a new ``SqliteSaver`` on ``path`` (its
    graph compiled first): the median of ``COLD_READS`` such readers."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    times = []
    for _ in range(COLD_READS):
        with SqliteSaver.from_conn_string(str(path)) as saver:
            graph = langgraph_builder(2, {}).compile(checkpointer=saver)
            latest: Any = {"configurable": {"thread_id": "chat"}}
            times.append(timed_ms(lambda graph=graph, latest=latest: list(  # type: ignore[misc]
                graph.get_state_history(latest, limit=HISTORY_PAGE))))
    return statistics.median(times)


def measure_langgraph(steps: int, samples: int, seed: int, system: str = "langgraph") -> Figures:
    figures = Figures(system, steps)
    durability = DURABILITY[system]
    with fresh_dir("graph-langgraph-warm") as d:  # warm-up: imports, code paths, in another file
        graph, context, _, _ = langgraph_run(d, 3, {}, durability)
        context.__exit__(None, None, None)
    with fresh_dir("graph-langgraph") as d:
        started: dict[int, float] = {}
        graph, context, path, seconds = langgraph_run(d, steps, started, durability)
        try:
            figures.step_us = seconds / steps * 1e6
            figures.step_cpu_us = graph.cpu_seconds / steps * 1e6
            step_intervals(started, figures)
            empty, empty_vacuumed = graph.empties
            figures.disk_bytes = file_bytes(path) - empty
            with sqlite3.connect(path) as conn:
                ids = [row[0] for row in conn.execute(
                    "SELECT checkpoint_id FROM checkpoints WHERE thread_id = 'chat' ORDER BY checkpoint_id")]
            figures.checkpoints = len(ids)
            pick = random.Random(seed)
            reads = []
            for checkpoint_id in (pick.choice(ids) for _ in range(samples)):
                config = {"configurable": {"thread_id": "chat", "checkpoint_id": checkpoint_id}}
                reads.append(timed_ms(lambda config=config: graph.get_state(config)))  # type: ignore[misc]
            figures.state_p50_ms, figures.state_p99_ms = percentile(reads, 50), percentile(reads, 99)
            latest: Any = {"configurable": {"thread_id": "chat"}}
            page = list(graph.get_state_history(latest, limit=HISTORY_PAGE))
            if len(page) != HISTORY_PAGE:
                raise RuntimeError(f"langgraph history page held {len(page)} checkpoints")
            figures.history_ms = statistics.median(
                timed_ms(lambda: list(graph.get_state_history(latest, limit=HISTORY_PAGE)))
                for _ in range(HISTORY_READS))
            figures.cold_history_ms = langgraph_cold_page(path, steps)
            figures.notes.append("diff: LangGraph has none")
        finally:
            context.__exit__(None, None, None)
        figures.vacuumed_bytes = file_bytes(path, vacuum=True) - empty_vacuumed
    return figures


# -- Cairn -----------------------------------------------------------------------


class CairnState(TypedDict):
    """At module level: the graph reads its annotations (strings here) in this module's namespace."""

    messages: Annotated[list[str], cairn.append]  # type: ignore[attr-defined]
    n: int


def graph_available() -> bool:
    return hasattr(cairn, "Graph")


def cairn_workflow(app: Any, steps: int, started: dict[int, float]) -> Any:
    """The same graph through Cairn's graph API (issue 23)."""
    g = cairn.Graph(CairnState)  # type: ignore[attr-defined]
    texts = messages(steps)

    @g.node  # type: ignore[misc]
    def talk(state: CairnState) -> dict[str, Any]:
        started[state["n"]] = time.perf_counter()
        return {"messages": [texts[state["n"]]], "n": state["n"] + 1}

    g.edge(cairn.START, "talk")  # type: ignore[attr-defined]
    g.route("talk", lambda s: cairn.END if s["n"] >= steps else "talk")  # type: ignore[attr-defined]
    return app.graph("chat", g, max_steps=max(10_000, steps + 10))


def cairn_app(directory: Path) -> Any:
    return cairn.App(db=f"sqlite:///{directory / 'cairn.sqlite'}")


def cairn_bytes(app: Any, *, vacuum: bool = False) -> int:
    store = app.store
    return file_bytes(store.path, vacuum=vacuum) + tree_bytes(store.artifact_dir)


def all_steps(app: Any, run_id: str) -> list[int]:
    """Every checkpoint's super-step, newest first, read page by page."""
    out: list[int] = []
    before = None
    while True:
        page = app.checkpoints(run_id, before=before, limit=50)
        out += [c.step for c in page]
        if len(page) < 50:
            return out
        before = page[-1].step


def measure_cairn(steps: int, samples: int, seed: int) -> Figures:
    from cairn.graph.diff import diff

    figures = Figures("cairn", steps)
    with fresh_dir("graph-cairn-warm") as d:
        app = cairn_app(d)
        try:
            app.run(cairn_workflow(app, 3, {}), {"messages": [], "n": 0}, run_id="warm-up")
        finally:
            app.close()
    with fresh_dir("graph-cairn") as d:
        app = cairn_app(d)
        try:
            started: dict[int, float] = {}
            chat = cairn_workflow(app, steps, started)
            empty, empty_vacuumed = cairn_bytes(app), cairn_bytes(app, vacuum=True)
            cpu = time.process_time()
            with stopwatch() as elapsed:
                app.run(chat, {"messages": [], "n": 0}, run_id="chat")
            figures.step_cpu_us = (time.process_time() - cpu) / steps * 1e6
            figures.step_us = elapsed() / steps * 1e6
            step_intervals(started, figures)
            figures.disk_bytes = cairn_bytes(app) - empty
            final = app.graph_state("chat")
            if final["n"] != steps or len(final["messages"]) != steps:
                raise RuntimeError(f"cairn ended at n={final['n']} with {len(final['messages'])} messages")
            known = all_steps(app, "chat")
            figures.checkpoints = len(known)
            pick = random.Random(seed)
            reads = [timed_ms(lambda k=k: app.graph_state("chat", step=k))  # type: ignore[misc]
                     for k in (pick.choice(known) for _ in range(samples))]
            figures.state_p50_ms, figures.state_p99_ms = percentile(reads, 50), percentile(reads, 99)
            page = app.checkpoints("chat", limit=HISTORY_PAGE)
            if len(page) != HISTORY_PAGE:
                raise RuntimeError(f"cairn history page held {len(page)} checkpoints")
            figures.history_ms = statistics.median(
                timed_ms(lambda: app.checkpoints("chat", limit=HISTORY_PAGE)) for _ in range(HISTORY_READS))
            colds = []
            for _ in range(COLD_READS - 1):
                with cairn_app(d) as fresh:
                    colds.append(timed_ms(lambda fresh=fresh: fresh.checkpoints(  # type: ignore[misc]
                        "chat", limit=HISTORY_PAGE)))
            cold = cairn_app(d)
            try:
                colds.append(timed_ms(lambda: cold.checkpoints("chat", limit=HISTORY_PAGE)))
                figures.cold_history_ms = statistics.median(colds)
                plain = [timed_ms(lambda k=k: cold.graph_state_json("chat", k))  # type: ignore[misc]
                         for k in (pick.choice(known) for _ in range(samples))]
            finally:
                cold.close()
            figures.json_p50_ms, figures.json_p99_ms = percentile(plain, 50), percentile(plain, 99)
            diffs, read_diffs = [], []
            for _ in range(samples):
                i, j = sorted(pick.sample(known, 2))
                a, b = app.graph_state("chat", step=i), app.graph_state("chat", step=j)
                diffs.append(timed_ms(lambda a=a, b=b: diff(a, b)))  # type: ignore[misc]
                read_diffs.append(timed_ms(lambda i=i, j=j: diff(app.graph_state("chat", step=i),  # type: ignore[misc]
                                                                 app.graph_state("chat", step=j))))
            figures.diff_p50_ms, figures.diff_p99_ms = percentile(diffs, 50), percentile(diffs, 99)
            figures.read_diff_p50_ms = percentile(read_diffs, 50)
            figures.read_diff_p99_ms = percentile(read_diffs, 99)
        finally:
            app.close()
        figures.vacuumed_bytes = cairn_bytes(app, vacuum=True) - empty_vacuumed
    return figures


# -- report ------------------------------------------------------------------------


ROWS: tuple[tuple[str, str, str], ...] = (
    # (label, attribute, format)
    ("on disk, bytes", "disk_bytes", "int"),
    ("on disk / logical", "disk_ratio", "x"),
    ("after VACUUM, bytes", "vacuumed_bytes", "int"),
    ("after VACUUM / logical", "vacuumed_ratio", "x"),
    ("µs per super-step", "step_us", "f"),
    ("CPU µs per super-step", "step_cpu_us", "f"),
    ("first 10, µs (median)", "first10_us", "f"),
    ("last 10, µs (median)", "last10_us", "f"),
    ("last 10 / first 10", "flat_ratio", "x"),
    ("state at a checkpoint p50, ms", "state_p50_ms", "f"),
    ("state at a checkpoint p99, ms", "state_p99_ms", "f"),
    ("state as JSON p50, ms", "json_p50_ms", "f"),
    ("state as JSON p99, ms", "json_p99_ms", "f"),
    ("history page (10), ms", "history_ms", "f"),
    ("cold history page (10), ms", "cold_history_ms", "f"),
    ("diff p50, ms", "diff_p50_ms", "f"),
    ("diff p99, ms", "diff_p99_ms", "f"),
    ("read 2 + diff p50, ms", "read_diff_p50_ms", "f"),
    ("read 2 + diff p99, ms", "read_diff_p99_ms", "f"),
    ("checkpoints", "checkpoints", "int"),
)


def fmt(value: float | None, style: str) -> str:
    if value is None:
        return "—"
    if style == "int":
        return f"{value:,.0f}"
    if style == "x":
        return f"{value:,.2f}x" if value < 100 else f"{value:,.0f}x"
    return f"{value:,.3f}" if value < 1 else f"{value:,.1f}" if value < 1000 else f"{value:,.0f}"


def value_of(f: Figures | None, attr: str) -> float | None:
    return None if f is None else getattr(f, attr)


def targets(lg: Figures | None, cairn: Figures | None) -> list[tuple[str, float | None, str, bool | None]]:
    """The issue's targets: (what, measured, bound, met); measured None when a side is missing."""
    def check(value: float | None, bound: float, higher: bool = False) -> bool | None:
        return None if value is None else (value >= bound if higher else value <= bound)

    speedup = None
    if lg is not None and cairn is not None and lg.step_us and cairn.step_us:
        speedup = lg.step_us / cairn.step_us
    cpu_speedup = None
    if lg is not None and cairn is not None and lg.step_cpu_us and cairn.step_cpu_us:
        cpu_speedup = lg.step_cpu_us / cairn.step_cpu_us
    c = cairn
    return [
        ("on disk / logical <= 1.3", value_of(c, "disk_ratio"), "1.3x",
         check(value_of(c, "disk_ratio"), 1.3)),
        ("LangGraph / Cairn per super-step >= 10", speedup, "10x", check(speedup, 10, higher=True)),
        ("LangGraph / Cairn CPU per super-step >= 10", cpu_speedup, "10x",
         check(cpu_speedup, 10, higher=True)),
        ("last 10 / first 10 <= 1.2", value_of(c, "flat_ratio"), "1.2x",
         check(value_of(c, "flat_ratio"), 1.2)),
        ("state p50 <= 1 ms", value_of(c, "state_p50_ms"), "1 ms", check(value_of(c, "state_p50_ms"), 1)),
        ("state p99 <= 5 ms", value_of(c, "state_p99_ms"), "5 ms", check(value_of(c, "state_p99_ms"), 5)),
        ("state as JSON p50 <= 1 ms", value_of(c, "json_p50_ms"), "1 ms",
         check(value_of(c, "json_p50_ms"), 1)),
        ("state as JSON p99 <= 5 ms", value_of(c, "json_p99_ms"), "5 ms",
         check(value_of(c, "json_p99_ms"), 5)),
        ("history page <= 10 ms", value_of(c, "history_ms"), "10 ms", check(value_of(c, "history_ms"), 10)),
        ("cold history page <= 10 ms", value_of(c, "cold_history_ms"), "10 ms",
         check(value_of(c, "cold_history_ms"), 10)),
        ("diff p99 <= 5 ms", value_of(c, "diff_p99_ms"), "5 ms", check(value_of(c, "diff_p99_ms"), 5)),
    ]


def report(steps: int, measured: Sequence[Figures]) -> None:
    print(f"\n== {steps:,} super-steps, 1 KB appended per step: {steps * MESSAGE_BYTES:,} logical bytes")
    by = {f.system: f for f in measured}
    cairn = by.get("cairn")
    bases = [f for f in measured if f.system != "cairn"]
    names = [f.system for f in measured]
    header = f"{'figure':<31}" + "".join(f"{n:>16}" for n in names)
    if cairn is not None:
        header += "".join(f"{'cairn/' + b.system:>22}" for b in bases)
    print(header)
    print("-" * len(header))
    for label, attr, style in ROWS:
        line = f"{label:<31}" + "".join(f"{fmt(value_of(f, attr), style):>16}" for f in measured)
        if cairn is not None:
            for base in bases:
                a, b = value_of(base, attr), value_of(cairn, attr)
                line += f"{f'{b / a:,.3f}x' if a and b is not None else '':>22}"
        print(line.rstrip())
    for f in measured:
        for note in f.notes:
            print(f"{f.system}: {note}")
    if cairn is not None:
        for what, value, _bound, met in targets(by.get("langgraph"), cairn):
            verdict = "—" if met is None else "met" if met else "MISSED"
            print(f"target {what}: {fmt(value, 'f')} {verdict}")


def median_of(repeats: int, measure: Callable[[], Figures]) -> Figures:
    """The figures of the run with the median time per super-step of
    ``repeats`` runs (one after the other; each run's figures are whole,
    never mixed across runs)."""
    runs = sorted((measure() for _ in range(max(1, repeats))), key=lambda f: f.step_us or 0.0)
    chosen = runs[len(runs) // 2]
    if len(runs) > 1:
        chosen.notes.append(f"median of {len(runs)} runs by µs per super-step: "
                            + ", ".join(f"{f.step_us:.0f}" for f in runs if f.step_us is not None))
    return chosen


def in_this_process(system: str, steps: int, samples: int, seed: int) -> Figures:
    if system == "cairn":
        return measure_cairn(steps, samples, seed)
    return measure_langgraph(steps, samples, seed, system)


def in_child(system: str, steps: int, samples: int, seed: int) -> Figures:
    """Measure ``system`` at ``steps`` in a fresh interpreter, one after the
    other (never two at once). Each system starts from a clean heap and
    page cache state of its own: measured in one process, the system that
    runs second inherits the first one's heap (LangGraph's 3,000-step run
    leaves gigabytes of checkpoints behind it) and its per-step figures
    grow with it (Cairn's CPU per super-step was 770 µs at 3,000 after
    LangGraph in one process, 263 µs alone)."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.graph", "--child", "--only", system, "--steps", str(steps),
         "--samples", str(samples), "--seed", str(seed)],
        capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{system} at {steps} super-steps failed:\n{out.stderr}")
    doc = json.loads(out.stdout)
    derived = {"logical_bytes", "disk_ratio", "vacuumed_ratio", "flat_ratio"}
    return Figures(**{k: v for k, v in doc.items() if k not in derived})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, nargs="+", default=[300, 3000], help="super-steps of each run")
    parser.add_argument("--only", default=",".join(SYSTEMS),
                        help=f"comma-separated systems to measure, of: {', '.join(SYSTEMS)}")
    parser.add_argument("--samples", type=int, default=100,
                        help="random checkpoints read (and diffs) per size")
    parser.add_argument("--seed", type=int, default=23)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of tables")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of each system at each size, each in a fresh interpreter; the one "
                             "with the median time per super-step is reported (a 300-step run lasts "
                             "about 0.1 s on Cairn's side: one run is one noisy sample)")
    parser.add_argument("--in-process", action="store_true",
                        help="measure every system in this interpreter (tests, profiling): "
                             "the later systems inherit the earlier ones' heap")
    args = parser.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(SYSTEMS))
    if unknown:
        parser.error(f"--only: unknown system {', '.join(unknown)} (known: {', '.join(SYSTEMS)})")
    if any(n < 2 for n in args.steps) or args.samples < 2:
        parser.error("--steps and --samples must be at least 2")
    skipped: dict[str, str] = {}
    if "cairn" in only and not graph_available():
        skipped["cairn"] = NO_GRAPH
        only.remove("cairn")
    if "cairn" in skipped:  # with --json, on stderr: stdout holds the JSON alone
        print(f"cairn: skipped: {NO_GRAPH}", file=sys.stderr if args.json else sys.stdout, flush=True)
    if args.child:  # one system at one size, in this fresh interpreter: its figures as JSON
        (steps,) = args.steps
        (system,) = only
        json.dump(in_this_process(system, steps, args.samples, args.seed).as_json(), sys.stdout)
        return 0
    sizes = []
    measure = in_this_process if args.in_process else in_child
    for steps in args.steps:
        measured = [median_of(args.repeats, functools.partial(measure, system, steps, args.samples,
                                                              args.seed))
                    for system in SYSTEMS if system in only and (system in DURABILITY or system == "cairn")]
        by = {f.system: f for f in measured}
        judged = targets(by.get("langgraph"), by["cairn"]) if "cairn" in by else []
        sizes.append({"steps": steps, "logical_bytes": steps * MESSAGE_BYTES,
                      **{f.system: f.as_json() for f in measured},
                      "targets": [dict(zip(("target", "measured", "bound", "met"), t, strict=True))
                                  for t in judged]})
        if not args.json:
            report(steps, measured)
    if args.json:
        json.dump({**environment(), "skipped": skipped, "sizes": sizes}, sys.stdout, indent=2)
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
