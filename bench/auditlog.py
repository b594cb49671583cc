"""The audit log a page at a time (issue 26): what a page costs to read and
what its index costs to write.

    python -m bench.auditlog --pages --main /tmp/auditpage-main   # page latency, main vs this tree
    python -m bench.auditlog --write-cost                         # a history index's cost per step
    python -m bench.auditlog ... --sqlite-only --quick

``--pages``: a tenant with ``--runs`` runs (three in four archived, one in
four hot) and ``--records`` operator records (token mints, spread between
the runs), built once per source tree (each tree's own schema), then the
first page and a deep one (the cursor at the middle of the log) of 50
entries, newest and oldest first, timed ``--reps`` times in a child process
per tree, the trees alternated round by round in one session; p50 of every
sample, and the median of each round's first (cold) sample.

``--write-cost``: what an index on history in log order would cost a
journaled step (``history_audit_log (tenant, at, run_id, seq)``, this
branch's first version; dropped for this cost: the hot stream reads runs by
primary key instead): one run of ``--steps`` steps (``app.run``,
durability ``process``) on a fresh database with the index created and
without it (as shipped), alternated round by round; medians of
``--rounds``, wall and CPU time per step. Also the store's ``append`` of one
entry alone (SQLite), the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.audit import timed_appends
from bench.common import fresh_dir, settle

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 50
PAGES = ("first-newest", "deep-newest", "first-oldest", "deep-oldest")


# -- the child: runs on the tree under test (only the public API both trees have) ---------------

def child_build(url: str, runs: int, records: int, state: Path) -> None:
    import cairn
    from cairn.api.auditlog import cursor_of, position

    app = cairn.App(db=url)

    @app.workflow(name="w")
    def w(ctx: cairn.Context, x: int) -> int:
        return x

    per_run, extra = divmod(records, runs)
    for i in range(runs):
        app.run(w, i, run_id=f"r{i:04d}", tenant="a")
        if i % 4:
            app.operator.archive_run(f"r{i:04d}")
        for k in range(per_run + (1 if i < extra else 0)):
            app.tokens.mint("a", "viewer", f"bot{i}-{k}")
    log = app.audit.log(tenant="a")
    middle = len(log) // 2
    state.write_text(json.dumps({"entries": len(log), "deep-oldest": cursor_of(position(log[middle])),
                                 "deep-newest": cursor_of(position(log[::-1][middle]))}))
    app.close()


def child_measure(url: str, reps: int, state: Path) -> None:
    import cairn
    from cairn.api.auditlog import LogFilter

    cursors = json.loads(state.read_text())
    app = cairn.App(db=url)
    found: dict[str, list[float]] = {}
    for name in PAGES:
        where, order = name.split("-")
        after = None if where == "first" else cursors[f"deep-{order}"]
        samples = []
        for _ in range(reps):
            started = time.perf_counter()
            page = app.audit.log_page(LogFilter(tenant="a"), LIMIT, after=after, newest=order == "newest")
            samples.append((time.perf_counter() - started) * 1e3)
            assert len(page.entries) == LIMIT
        found[name] = samples
    app.close()
    print(json.dumps(found))


# -- the parent ----------------------------------------------------------------------------------

def _child(tree: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}:{ROOT}"}
    done = subprocess.run([sys.executable, "-m", "bench.auditlog", "--child", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"child {args[:1]} on {tree} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def pages(trees: dict[str, Path], urls: dict[str, str], runs: int, records: int, reps: int, rounds: int,
          work: Path, backend: str) -> None:
    for label, tree in trees.items():
        started = time.perf_counter()
        _child(tree, "build", urls[label], str(runs), str(records), str(work / f"{label}.json"))
        entries = json.loads((work / f"{label}.json").read_text())["entries"]
        archived = runs - (runs + 3) // 4
        print(f"{backend} {label:6}: built {runs} runs ({archived} archived), {records} operator records: "
              f"{entries} entries in tenant a's log ({time.perf_counter() - started:.0f} s)")
    samples: dict[str, dict[str, list[float]]] = {label: {p: [] for p in PAGES} for label in trees}
    cold: dict[str, dict[str, list[float]]] = {label: {p: [] for p in PAGES} for label in trees}
    order = list(trees)
    for i in range(rounds):
        for label in (order if i % 2 == 0 else order[::-1]):
            settle()
            got = json.loads(_child(trees[label], "measure", urls[label], str(reps),
                                    str(work / f"{label}.json")))
            for page in PAGES:
                samples[label][page] += got[page]
                cold[label][page].append(got[page][0])
    for page in PAGES:
        line = "  ".join(f"{label} p50 {statistics.median(samples[label][page]):8.2f} ms "
                         f"(cold {statistics.median(cold[label][page]):8.2f} ms)" for label in order)
        print(f"{backend} {page:13} {LIMIT} entries: {line}; {rounds} rounds x {reps} pages")


def _add_index(url: str) -> None:
    """The index a first version of this branch had (and dropped: what it costs is why)."""
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            conn.execute("CREATE INDEX history_audit_log ON history (tenant, at, run_id, seq)")
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:  # the store's tables are in schema cairn
        conn.execute('CREATE INDEX history_audit_log ON cairn.history (tenant, at, run_id COLLATE "C", seq)')


def step_cost(url: str, kept: bool, steps: int) -> tuple[float, float]:
    """(wall, CPU) microseconds per step of one run of ``steps`` steps."""
    from bench.cairn_workloads import build_url

    w = build_url(url)
    try:
        if kept:
            _add_index(url)
        w.app.run(w.chain, 1)  # warm-up: connection and statements ready
        settle()
        wall, cpu = time.perf_counter(), time.process_time()
        result = w.app.run(w.chain, steps)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        w.close()
    if result != steps:
        raise RuntimeError(f"chain returned {result!r}, expected {steps}")
    return wall / steps * 1e6, cpu / steps * 1e6


def store_append(kept: bool, steps: int) -> tuple[float, float]:
    """(wall, CPU) microseconds per ``SQLiteStore.append`` of one journal entry, the store alone."""
    with fresh_dir(f"auditlog-append-{'kept' if kept else 'dropped'}") as d:
        return timed_appends(str(d / "cairn.sqlite"), steps, _add_index if kept else None)


def side_by_side(name: str, measure: Callable[[bool, int], tuple[float, float]], steps: int,
                 rounds: int) -> None:
    kept: list[tuple[float, float]] = []
    dropped: list[tuple[float, float]] = []
    for i in range(rounds):
        for state in ((True, False) if i % 2 == 0 else (False, True)):
            (kept if state else dropped).append(measure(state, steps))
    for label, index in (("wall", 0), ("CPU", 1)):
        a = statistics.median(x[index] for x in kept)
        b = statistics.median(x[index] for x in dropped)
        print(f"{name:10} {label:4} per step: with the index {a:8.2f} us, without (as shipped) {b:8.2f} us, "
              f"difference {a - b:+6.2f} us ({a / b:.3f}x); {rounds} rounds of {steps} steps")


def sqlite_step(kept: bool, steps: int) -> tuple[float, float]:
    with fresh_dir(f"auditlog-{'kept' if kept else 'dropped'}") as d:
        return step_cost(f"sqlite:///{d / 'cairn.sqlite'}", kept, steps)


def pg_step(admin: str) -> Callable[[bool, int], tuple[float, float]]:
    counter = iter(range(10**6))

    def measure(kept: bool, steps: int) -> tuple[float, float]:
        with _pg_database(admin, f"cairn_bench_auditlog_{next(counter)}") as url:
            return step_cost(url, kept, steps)

    return measure


class _pg_database:  # noqa: N801  (a context manager used like a function)
    """A fresh database on the throwaway cluster, dropped afterwards; its store URL."""

    def __init__(self, admin: str, name: str) -> None:
        self.admin, self.name = admin, name

    def __enter__(self) -> str:
        import psycopg
        from psycopg import sql
        from psycopg.conninfo import make_conninfo
        from tests.engine.conftest import postgres_url

        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))
        return str(postgres_url(make_conninfo(self.admin, dbname=self.name)))

    def __exit__(self, *exc: Any) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", action="store_true")
    parser.add_argument("--write-cost", action="store_true")
    parser.add_argument("--main", type=Path, help="with --pages: main's source tree (git archive main)")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--sqlite-only", action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.child:
        what, url, *rest = args.child
        if what == "build":
            child_build(url, int(rest[0]), int(rest[1]), Path(rest[2]))
        else:
            child_measure(url, int(rest[0]), Path(rest[1]))
        return
    print(f"bench.auditlog {time.strftime('%Y-%m-%d %H:%M:%S')}")
    if args.quick:
        args.runs, args.records, args.reps, args.rounds, args.steps = 20, 200, 3, 2, 300
    admin = None
    if not args.sqlite_only:
        from tests import pgcluster

        admin = pgcluster.admin_url()
    try:
        if args.pages:
            if args.main is None:
                parser.error("--pages needs --main (a checkout of main: git archive main | tar -x -C DIR)")
            trees = {"main": args.main.resolve(), "branch": ROOT}
            with fresh_dir("auditlog-pages") as work:
                urls = {label: f"sqlite:///{work / label}.sqlite" for label in trees}
                pages(trees, urls, args.runs, args.records, args.reps, args.rounds, work, "sqlite")
                if admin is not None:
                    with _pg_database(admin, "cairn_bench_auditlog_main") as main_url, \
                            _pg_database(admin, "cairn_bench_auditlog_branch") as branch_url:
                        pages(trees, {"main": main_url, "branch": branch_url}, args.runs, args.records,
                              args.reps, args.rounds, work, "postgres")
        if args.write_cost:
            side_by_side("append", store_append, args.steps * 5, args.rounds * 2 + 1)
            side_by_side("sqlite", sqlite_step, args.steps, args.rounds * 2 + 1)
            if admin is not None:
                side_by_side("postgres", pg_step(admin), args.steps, args.rounds * 2 + 1)
    finally:
        if admin is not None:
            from tests import pgcluster

            pgcluster.shutdown()


if __name__ == "__main__":
    main()
