"""PostgreSQL benchmark: Cairn side by side with LangGraph + PostgresSaver and DBOS, one run.

    python -m bench.postgres                # full run (~10 minutes)
    python -m bench.postgres --quick        # smoke test with small sizes
    python -m bench.postgres --only cairn,workers
    python -m bench.postgres --round-trips  # count round trips and commits per run (strace)

Every system talks to the same PostgreSQL server with ``synchronous_commit=on``
(the run refuses to start otherwise): each commit returns once its WAL is
flushed. Every sample gets a fresh database, dropped afterwards. Figures are
medians of samples taken round-robin (see ``bench/README.md``); ratios compare
rows of the same metric measured in this run. Results go to
``bench/results/postgres-latest.json``.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg

from bench import pg_baselines as pgb
from bench import pgdb
from bench.common import (
    RESULTS_DIR,
    Result,
    Sample,
    find,
    fmt_value,
    package_version,
    print_table,
    ratio_lines,
    settle,
    stopwatch,
    write_results,
)
from bench.pg_workers import worker_processes

LATEST_JSON = RESULTS_DIR / "postgres-latest.json"
RATIO_BASELINES = ("langgraph", "dbos")
GROUPS = ("floor", "langgraph", "dbos", "cairn", "workers")
IMPORT_CHECKS = {"langgraph": "langgraph.checkpoint.postgres", "dbos": "dbos"}

ROUND_TRIP_US = "round trip µs"
COMMIT_US = "commit µs"
STEP_US = "step µs"
RUNS_PER_S = "runs/s"
STARTS_PER_S = "starts/s"
#: Targets from the issues, judged on this run's medians: a step (issue 5's
#: absolute figure, and issue 8's ratio to one durable INSERT commit of the
#: same run) and worker runs per second.
TARGET_STEP_US = 350.0
TARGET_STEP_PER_COMMIT = 1.2
TARGET_RUNS_PER_S = 1500.0

Key = tuple[str, str]  # (metric, system)


def worker_runs_metric(processes: int) -> str:
    return f"runs/s {processes}p"


def worker_steps_metric(processes: int) -> str:
    return f"steps/s {processes}p"


# -- settings ------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    steps: int
    runs: int
    worker_runs: int
    processes: tuple[int, ...]
    floor_iterations: int
    repeats: int
    warmup_rounds: int


FULL = Sizes(steps=300, runs=300, worker_runs=2000, processes=(1, 2, 4), floor_iterations=1000,
             repeats=5, warmup_rounds=1)
QUICK = Sizes(steps=100, runs=50, worker_runs=400, processes=(1, 2, 4), floor_iterations=200,
              repeats=3, warmup_rounds=1)


@dataclass(frozen=True)
class CairnWorkerSettings:
    """``app.worker(concurrency=..., poll_interval=...)`` in each worker process."""

    concurrency: int = 8
    poll: float = 0.01


@dataclass(frozen=True)
class DBOSWorkerSettings:
    """``DBOS.register_queue(worker_concurrency=..., polling_interval_sec=...)``;
    ``sys_db_pool_size`` of each worker process. ``concurrency=None``: no limit."""

    concurrency: int | None = 8
    poll: float = 0.01
    pool_size: int = 12


# -- Cairn in-process figures -------------------------------------------------------


def cairn_step_us(steps: int) -> float:
    """``app.run(chain, steps)`` on a fresh database; µs per step."""
    from bench.cairn_workloads import build_url

    with pgdb.fresh_database("cairn") as url:
        w = build_url(url)
        try:
            w.app.run(w.chain, 1)  # warm-up run
            with stopwatch() as elapsed:
                result = w.app.run(w.chain, steps)
        finally:
            w.close()
    if result != steps:
        raise RuntimeError(f"cairn chain returned {result!r}, expected {steps}")
    return elapsed() / steps * 1e6


def cairn_runs_per_s(n: int) -> float:
    """``n`` sequential ``app.run(three)`` (3 trivial steps each); runs/s."""
    from bench.cairn_workloads import build_url

    with pgdb.fresh_database("cairn") as url:
        w = build_url(url)
        try:
            w.app.run(w.three)  # warm-up run
            with stopwatch() as elapsed:
                for _ in range(n):
                    result = w.app.run(w.three)
        finally:
            w.close()
    if result != 3:
        raise RuntimeError(f"cairn 3-step workflow returned {result!r}, expected 3")
    return n / elapsed()


# -- worker processes -------------------------------------------------------------------

_CAIRN_PROGRESS = """
SELECT count(*) FILTER (WHERE status = 'completed'),
       count(*) FILTER (WHERE status NOT IN ('pending', 'running', 'completed')),
       max(updated_at) FILTER (WHERE status = 'completed')
FROM cairn.runs
"""
_DBOS_PROGRESS = """
SELECT count(*) FILTER (WHERE status = 'SUCCESS'),
       count(*) FILTER (WHERE status NOT IN ('ENQUEUED', 'PENDING', 'SUCCESS')),
       max(updated_at) FILTER (WHERE status = 'SUCCESS') / 1000.0
FROM dbos.workflow_status WHERE queue_name = %s
"""


def _wait_until_done(
    conn: psycopg.Connection[Any],
    query: str,
    params: Sequence[Any],
    runs: int,
    check_alive: Callable[[], None],
    timeout: float,
) -> float:
    """Poll until ``runs`` runs have completed; return the completion time the
    database recorded for the last of them (``time.time()`` scale), so the
    figure does not depend on the polling period."""
    deadline = time.monotonic() + timeout
    while True:
        row = conn.execute(query, params).fetchone()
        assert row is not None
        done, failed, last = int(row[0]), int(row[1]), row[2]
        if failed:
            raise RuntimeError(f"{failed} run(s) ended in a status other than completed")
        if done >= runs and last is not None:
            return float(last)
        check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {done}/{runs} runs completed within {timeout:.0f}s")
        time.sleep(0.05)


def _drain_timeout(runs: int) -> float:
    return 60.0 + runs / 20.0


def _worker_figures(
    system: str, processes: int, runs: int, seconds: float, started: float
) -> dict[Key, float]:
    if seconds <= 0:
        raise RuntimeError(f"non-positive drain time {seconds:.4f}s")
    figures = {
        (worker_runs_metric(processes), system): runs / seconds,
        (worker_steps_metric(processes), system): 3 * runs / seconds,
    }
    if processes == 1:
        figures[(STARTS_PER_S, system)] = started
    return figures


def cairn_workers(processes: int, runs: int, settings: CairnWorkerSettings) -> dict[Key, float]:
    """``runs`` runs of ``three`` created with ``app.start`` (one thread, timed
    separately as starts/s), then drained by ``processes`` worker processes
    released at once; runs/s from the release to the last completion."""
    from bench.cairn_workloads import build_url

    with pgdb.fresh_database(f"cairn_w{processes}") as url:
        w = build_url(url)
        try:
            with stopwatch() as starting:
                handles = [w.app.start(w.three) for _ in range(runs)]
            commands = [
                ["cairn", "--url", url, "--concurrency", str(settings.concurrency),
                 "--poll", str(settings.poll), "--worker-id", f"bench-w{i}"]
                for i in range(processes)
            ]
            with worker_processes(commands) as group, psycopg.connect(url, autocommit=True) as conn:
                go = time.time()
                group.go()
                last = _wait_until_done(conn, _CAIRN_PROGRESS, (), runs, group.check_alive,
                                        _drain_timeout(runs))
            for handle in (handles[0], handles[-1]):
                if handle.result(timeout=10) != 3:
                    raise RuntimeError(f"cairn run {handle.run_id} did not return 3")
        finally:
            w.close()
    return _worker_figures("cairn", processes, runs, last - go, runs / starting())


def dbos_workers(processes: int, runs: int, settings: DBOSWorkerSettings) -> dict[Key, float]:
    """DBOS's way to spread workflows over processes: a queue. ``runs``
    workflows of ``three`` are enqueued (one thread, timed separately) on a
    queue whose ``worker_concurrency`` is 0; ``processes`` DBOS processes
    launch and poll it; raising ``worker_concurrency`` releases them at once.
    runs/s from that commit to the last completion."""
    with pgdb.fresh_database(f"dbos_w{processes}") as url, pgb.dbos_session(url, listen=[]) as dbos:
        w = pgb.register_dbos_workloads(dbos)
        dbos.launch()
        queue = dbos.register_queue(pgb.DBOS_QUEUE, worker_concurrency=0, polling_interval_sec=settings.poll)
        with stopwatch() as starting:
            handles = [queue.enqueue(w.three) for _ in range(runs)]
        commands = [
            ["dbos", "--url", url, "--executor-id", f"bench-w{i}", "--pool-size", str(settings.pool_size)]
            for i in range(processes)
        ]
        with worker_processes(commands) as group, psycopg.connect(url, autocommit=True) as conn:
            queue.set_worker_concurrency(settings.concurrency)
            go = time.time()
            group.go()
            last = _wait_until_done(conn, _DBOS_PROGRESS, (pgb.DBOS_QUEUE,), runs, group.check_alive,
                                    _drain_timeout(runs))
        for handle in (handles[0], handles[-1]):
            if handle.get_result() != 3:
                raise RuntimeError(f"dbos workflow {handle.get_workflow_id()} did not return 3")
    return _worker_figures("dbos", processes, runs, last - go, runs / starting())


# -- plan ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One reported figure."""

    metric: str
    system: str
    unit: str
    lower_is_better: bool = True
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> Key:
        return (self.metric, self.system)


@dataclass
class Bench:
    """One measurement; a sample may yield several figures (``rows``)."""

    group: str
    label: str
    rows: list[Row]
    run: Callable[[], dict[Key, float]]
    warm_up: bool = True  # take part in the discarded warm-up round(s)
    samples: dict[Key, list[float]] = field(default_factory=dict)
    note: str = ""
    retried: int = 0  # failed attempts that were taken again (see ``_sample``)


def single(group: str, row: Row, fn: Callable[[], float]) -> Bench:
    return Bench(group, f"{row.system} {row.metric}", [row], lambda: {row.key: fn()})


def plan(s: Sizes, cairn_w: CairnWorkerSettings, dbos_w: DBOSWorkerSettings) -> list[Bench]:
    steps = {"steps": s.steps}
    runs = {"runs": s.runs, "steps_per_run": 3}
    iterations = {"iterations": s.floor_iterations}
    benches = [
        single("floor", Row(ROUND_TRIP_US, "psycopg SELECT 1", "µs", params=iterations),
               lambda: pgb.pg_round_trip_us(s.floor_iterations)),
        single("floor", Row(COMMIT_US, "psycopg INSERT", "µs", params=iterations),
               lambda: pgb.pg_commit_us(s.floor_iterations)),
        single("floor", Row(STEP_US, "psycopg tx floor", "µs/step", params=iterations),
               lambda: pgb.pg_tx_step_us(s.floor_iterations)),
        single("langgraph", Row(STEP_US, "langgraph", "µs/step", params=steps),
               lambda: pgb.langgraph_step_us(s.steps)),
        single("dbos", Row(STEP_US, "dbos", "µs/step", params=steps), lambda: pgb.dbos_step_us(s.steps)),
        single("cairn", Row(STEP_US, "cairn", "µs/step", params=steps), lambda: cairn_step_us(s.steps)),
        single("langgraph", Row(RUNS_PER_S, "langgraph", "runs/s", False, runs),
               lambda: pgb.langgraph_runs_per_s(s.runs)),
        single("dbos", Row(RUNS_PER_S, "dbos", "runs/s", False, runs), lambda: pgb.dbos_runs_per_s(s.runs)),
        single("cairn", Row(RUNS_PER_S, "cairn", "runs/s", False, runs), lambda: cairn_runs_per_s(s.runs)),
    ]
    systems: list[tuple[str, dict[str, Any], Callable[[int], dict[Key, float]]]] = [
        ("dbos", {"worker_concurrency": dbos_w.concurrency, "polling_interval_sec": dbos_w.poll,
                  "sys_db_pool_size": dbos_w.pool_size},
         lambda p: dbos_workers(p, s.worker_runs, dbos_w)),
        ("cairn", {"concurrency": cairn_w.concurrency, "poll_interval": cairn_w.poll},
         lambda p: cairn_workers(p, s.worker_runs, cairn_w)),
    ]
    for processes in s.processes:
        for system, settings, fn in systems:
            params = {"runs": s.worker_runs, "steps_per_run": 3, "processes": processes, **settings}
            rows = [
                Row(worker_runs_metric(processes), system, "runs/s", False, params),
                Row(worker_steps_metric(processes), system, "steps/s", False, params),
            ]
            if processes == 1:
                started = {"runs": s.worker_runs, "threads": 1,
                           "call": "app.start" if system == "cairn" else "queue.enqueue"}
                rows.append(Row(STARTS_PER_S, system, "runs/s", False, started))
            benches.append(Bench("workers", f"{system} {processes}p workers", rows,
                                 (lambda f, p: lambda: f(p))(fn, processes), warm_up=False))
    return benches


# -- running ---------------------------------------------------------------------------------


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def skip_reason(exc: BaseException) -> str:
    if isinstance(exc, ImportError):
        return f"skipped: ImportError: {exc}"
    return f"error: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


#: Attempts at one sample. The server is shared: another engineer's test may
#: restart it in the middle of a sample. A failed attempt is logged, counted in
#: the results (``retried``) and taken again once the server answers.
ATTEMPTS = 3


def _sample(b: Bench) -> dict[Key, float]:
    for attempt in range(1, ATTEMPTS + 1):
        settle()
        try:
            return b.run()
        except ImportError:
            raise
        except Exception as exc:
            if attempt == ATTEMPTS:
                raise
            b.retried += 1
            log(f"  {b.label}: attempt {attempt} failed ({skip_reason(exc)}); retrying")
            time.sleep(2.0)
            pgdb.wait_for_server()
    raise AssertionError("unreachable")


def run_rounds(benches: Sequence[Bench], sizes: Sizes) -> None:
    """One sample of every bench per round, round-robin; warm-up rounds are discarded."""
    for rnd in range(sizes.warmup_rounds + sizes.repeats):
        warm = rnd < sizes.warmup_rounds
        label = "warm-up" if warm else f"{rnd - sizes.warmup_rounds + 1}/{sizes.repeats}"
        shown: list[str] = []
        with stopwatch() as elapsed:
            for b in benches:
                if b.note or (warm and not b.warm_up):
                    continue
                try:
                    values = _sample(b)
                except Exception as exc:
                    b.note = skip_reason(exc)
                    if not isinstance(exc, ImportError):
                        traceback.print_exc()
                    log(f"  {b.label}: {b.note}")
                    continue
                if not warm:
                    for key, value in values.items():
                        b.samples.setdefault(key, []).append(value)
                shown.extend(f"{system} {metric}={fmt_value(v)}" for (metric, system), v in values.items())
        log(f"round {label} ({elapsed():.1f}s): " + "; ".join(shown))


_METRIC_ORDER = [ROUND_TRIP_US, COMMIT_US, STEP_US, RUNS_PER_S, STARTS_PER_S]
_SYSTEM_ORDER = ["psycopg SELECT 1", "psycopg INSERT", "psycopg tx floor", "langgraph", "dbos", "cairn"]


def _order(result: Result) -> tuple[int, int, int]:
    metric = result.metric
    if metric in _METRIC_ORDER:
        major, minor = _METRIC_ORDER.index(metric), 0
    else:  # "runs/s 2p", "steps/s 2p": by process count, runs before steps
        kind, procs = metric.split(" ")
        major, minor = len(_METRIC_ORDER) + int(procs.rstrip("p")), 0 if kind == "runs/s" else 1
    system = _SYSTEM_ORDER.index(result.system) if result.system in _SYSTEM_ORDER else len(_SYSTEM_ORDER)
    return (major, minor, system)


def to_results(benches: Sequence[Bench]) -> list[Result]:
    results: list[Result] = []
    for b in benches:
        for row in b.rows:
            values = b.samples.get(row.key, [])
            results.append(Result(
                metric=row.metric, system=row.system, unit=row.unit,
                sample=Sample(tuple(values)) if values and not b.note else None,
                note=b.note or (f"{b.retried} attempt(s) retried" if b.retried else ""),
                lower_is_better=row.lower_is_better, params={**row.params, "retried": b.retried},
            ))
    return sorted(results, key=_order)


def target_lines(results: Sequence[Result], processes: Sequence[int]) -> list[str]:
    lines: list[str] = []
    step = find(results, STEP_US, "cairn")
    if step is not None and step.value is not None:
        verdict = "met" if step.value <= TARGET_STEP_US else "NOT met"
        lines.append(f"cairn step µs: {step.value:,.0f} (target <= {TARGET_STEP_US:,.0f}: {verdict})")
        commit = find(results, COMMIT_US, "psycopg INSERT")
        if commit is not None and commit.value:
            ratio = step.value / commit.value
            verdict = "met" if ratio <= TARGET_STEP_PER_COMMIT else "NOT met"
            lines.append(f"cairn step / one durable INSERT commit: {ratio:.2f}x "
                         f"(target <= {TARGET_STEP_PER_COMMIT:.1f}x: {verdict})")
    best: tuple[float, int] | None = None
    for p in processes:
        r = find(results, worker_runs_metric(p), "cairn")
        if r is not None and r.value is not None and (best is None or r.value > best[0]):
            best = (r.value, p)
    if best is not None:
        verdict = "met" if best[0] >= TARGET_RUNS_PER_S else "NOT met"
        lines.append(f"cairn runs/s, best over worker-process counts: {best[0]:,.0f} with {best[1]} "
                     f"process(es) (target >= {TARGET_RUNS_PER_S:,.0f}: {verdict})")
    return lines


def parse_only(values: Sequence[str] | None) -> list[str]:
    chosen: list[str] = []
    for value in values or []:
        for part in value.split(","):
            name = part.strip()
            if name and name not in GROUPS:
                raise argparse.ArgumentTypeError(f"--only: unknown group {name!r}; choose from {GROUPS}")
            if name and name not in chosen:
                chosen.append(name)
    return chosen or list(GROUPS)


def _check_server() -> dict[str, Any]:
    """Server facts; refuse to measure unless every commit is flushed (``synchronous_commit=on``)."""
    facts = pgdb.server_facts()
    with pgdb.fresh_database("probe") as url:
        facts["synchronous_commit_new_database"] = pgdb.setting(url, "synchronous_commit")
    if facts["synchronous_commit_new_database"] != "on" or facts["fsync"] != "on":
        raise SystemExit(
            f"bench: the server runs with synchronous_commit={facts['synchronous_commit_new_database']}, "
            f"fsync={facts['fsync']}: this benchmark compares durable commits and needs both on"
        )
    return facts


def _raise_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.postgres",
                                     description="Cairn vs LangGraph vs DBOS on PostgreSQL.")
    parser.add_argument("--quick", action="store_true", help="small sizes and fewer samples (smoke test)")
    parser.add_argument("--only", action="append", metavar="GROUP",
                        help=f"measure only these groups (comma-separated): {', '.join(GROUPS)}")
    parser.add_argument("--repeats", type=int, help="samples per figure (median reported)")
    parser.add_argument("--worker-runs", type=int, help="runs drained by the worker processes per sample")
    parser.add_argument("--processes", help="worker-process counts, comma-separated (default 1,2,4)")
    parser.add_argument("--cairn-concurrency", type=int, default=CairnWorkerSettings.concurrency)
    parser.add_argument("--cairn-poll", type=float, default=CairnWorkerSettings.poll)
    parser.add_argument("--dbos-concurrency", type=int, default=DBOSWorkerSettings.concurrency,
                        help="queue worker_concurrency (0: no limit)")
    parser.add_argument("--dbos-poll", type=float, default=DBOSWorkerSettings.poll)
    parser.add_argument("--dbos-pool", type=int, default=DBOSWorkerSettings.pool_size)
    parser.add_argument("--round-trips", action="store_true",
                        help="instead of timing, count round trips and commits per run of each system")
    parser.add_argument("--out", type=Path, help="JSON output (default bench/results/postgres-latest.json)")
    parser.add_argument("--no-save", action="store_true", help="do not write the JSON results")
    args = parser.parse_args(argv)
    try:
        groups = parse_only(args.only)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    sizes = QUICK if args.quick else FULL
    overrides: dict[str, Any] = {}
    if args.repeats is not None:
        if args.repeats < 1:
            parser.error("--repeats must be >= 1")
        overrides["repeats"] = args.repeats
    if args.worker_runs is not None:
        overrides["worker_runs"] = args.worker_runs
    if args.processes:
        overrides["processes"] = tuple(int(p) for p in args.processes.split(","))
    sizes = Sizes(**{**sizes.__dict__, **overrides})
    cairn_w = CairnWorkerSettings(args.cairn_concurrency, args.cairn_poll)
    dbos_w = DBOSWorkerSettings(args.dbos_concurrency or None, args.dbos_poll, args.dbos_pool)

    signal.signal(signal.SIGTERM, _raise_on_signal)
    signal.signal(signal.SIGHUP, _raise_on_signal)
    try:
        pgdb.wait_for_server()
        stale = pgdb.drop_stale_databases()
        if stale:
            log(f"bench: dropped {len(stale)} database(s) left by killed benchmark runs")
        server = _check_server()
        if args.round_trips:
            from bench import pg_trace

            return pg_trace.run(quick=args.quick)
        return _measure(args, groups, sizes, cairn_w, dbos_w, server)
    finally:
        leftover = pgdb.drop_live_databases()
        if leftover:
            log(f"bench: dropped {len(leftover)} database(s) on the way out")


def _measure(args: argparse.Namespace, groups: list[str], sizes: Sizes, cairn_w: CairnWorkerSettings,
             dbos_w: DBOSWorkerSettings, server: dict[str, Any]) -> int:
    log(f"bench: {'quick' if args.quick else 'full'} PostgreSQL run of {', '.join(groups)}; "
        f"server {server['server_version']}, synchronous_commit={server['synchronous_commit_new_database']}")
    benches = [b for b in plan(sizes, cairn_w, dbos_w) if b.group in groups]
    for group, module in IMPORT_CHECKS.items():
        try:
            importlib.import_module(module)
        except ImportError as exc:
            print(f"bench: {group} skipped (ImportError: {exc}); pip install -e '.[bench]'")
            for b in benches:
                if b.group == group or b.label.startswith(group):
                    b.note = f"skipped: ImportError: {exc}"
    with stopwatch() as total:
        run_rounds(benches, sizes)
    results = to_results(benches)
    mode = "quick" if args.quick else "full"
    print()
    print(f"Cairn PostgreSQL benchmark ({mode}): medians; ratio = row / baseline row, same metric, this run")
    print(f"worker settings: cairn concurrency={cairn_w.concurrency} poll={cairn_w.poll}s per process; "
          f"dbos worker_concurrency={dbos_w.concurrency} polling_interval_sec={dbos_w.poll} "
          f"sys_db_pool_size={dbos_w.pool_size} per process")
    print_table(results, RATIO_BASELINES)
    lines = ratio_lines(results, "cairn", RATIO_BASELINES) + target_lines(results, sizes.processes)
    if lines:
        print()
        for line in lines:
            print(line)
    print(f"\ntotal bench time: {total():.0f}s")
    if not args.no_save:
        extra = {
            "mode": mode,
            "groups": groups,
            "sizes": {**sizes.__dict__, "processes": list(sizes.processes)},
            "worker_settings": {"cairn": cairn_w.__dict__, "dbos": dbos_w.__dict__},
            "postgres": server,
            "postgres_packages": {name: package_version(name) for name in
                                  ("langgraph-checkpoint-postgres", "psycopg", "psycopg-pool")},
            "total_seconds": total(),
        }
        path = write_results(results, RATIO_BASELINES, extra=extra, path=args.out or LATEST_JSON)
        print(f"results written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
