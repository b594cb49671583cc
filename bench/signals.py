"""Signals: what waiting runs cost, and how fast a signal wakes one.

    python -m bench.signals                 # 100,000 waiting runs, 300 signals per backend, DBOS side by side
    python -m bench.signals --quick         # 10,000 waiting runs, 60 signals, ~1 minute
    python -m bench.signals --only latency --backends sqlite
    python -m bench.signals --only queued   # 1,000 signals queued for one run, taken in one execution

Results go to ``bench/results/signals-latest.json``. PostgreSQL is
``$CAIRN_BENCH_PG`` if set, else a private throwaway cluster started like the
tests' (``tests/pgcluster.py``: never the machine's own server).

Figures (see bench/README.md, "Signals"):

* **idle worker with N runs waiting**: a worker process (``cairn worker``'s
  loop, concurrency 8, poll 0.1 s) on a database holding 0, then N runs
  suspended in ``ctx.wait_for_signal``; after it has been idle for 2 s, its
  RSS and thread count (``/proc``) and the CPU it burns per second idle.
* **database bytes per suspended run**: the size of the database (SQLite:
  the file after a WAL checkpoint; PostgreSQL: runs, history and mailbox
  with their indexes) with N waiting runs minus with none, over N. The N
  runs are copies (bulk SQL) of one run a worker really suspended: its row
  and its history.
* **claim µs with N waiting**: the median ``claim_runs`` (limit 8) of
  runnable runs, on the database without and with the N waiting runs.
* **signal → next step**: a worker process runs a workflow that waits for a
  signal and then runs a step, 300 times; this process sends each signal
  (``app.signal``) once the run is suspended again, and the step body
  records when it starts. Latency = step start minus the moment before
  ``app.signal`` (one machine, one clock). p50 and p99.
* **queued signals**: 1,000 signals delivered to one run before it runs,
  then taken by 1,000 receives in one execution (``app.run``): seconds, and
  the mailbox rows the store handed the engine (one per receive; it was
  every message of the key, taken ones included: N²).
* **DBOS recv/send**: the same loop with ``DBOS.recv`` / ``DBOS.send`` on
  DBOS's SQLite system database, in one process (DBOS's best case: its
  sender and receiver share memory); fewer rounds, since each takes as long
  as DBOS's polling.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import cairn
from bench.common import REPO_ROOT, RESULTS_DIR, Result, Sample, fresh_dir, print_table, settle, write_results
from cairn.store.contract import Store
from cairn.store.postgres import PostgresStore
from cairn.store.records import RunStatus
from cairn.store.sqlite import SQLiteStore

OUT = RESULTS_DIR / "signals-latest.json"
MARKS_ENV = "CAIRN_BENCH_MARKS"
CLAIMS = 40
LIMIT = 8


# -- the workflows (this module is also the worker child) ------------------------------------


def build_app(db: str) -> cairn.App:
    app = cairn.App(db=db, lease_seconds=30.0)
    marks = os.environ.get(MARKS_ENV)

    @app.workflow(name="waiter")
    def waiter(ctx: cairn.Context) -> Any:
        return ctx.wait_for_signal("go")

    @app.workflow(name="noop")
    def noop(ctx: cairn.Context) -> int:
        return 1

    @app.workflow(name="drain")
    def drain(ctx: cairn.Context, n: int) -> int:
        return sum(int(ctx.wait_for_signal("n", type_=int)) for _ in range(n))

    @app.step
    def mark(i: int) -> int:
        started = time.time()
        if marks:
            with open(marks, "a") as f:
                f.write(f"{i} {started!r}\n")
        return i

    @app.workflow(name="single")
    def single(ctx: cairn.Context, i: int) -> int:
        ctx.wait_for_signal("go")
        return mark(i)

    @app.workflow(name="pingpong")
    def pingpong(ctx: cairn.Context, rounds: int) -> int:
        for i in range(rounds):
            ctx.wait_for_signal("go")
            mark(i)
        return rounds

    return app


def _worker_child(db: str) -> int:
    app = build_app(db)
    worker = app.worker(concurrency=8, poll_interval=0.1)
    print("ready", flush=True)
    worker.run()
    app.close()
    return 0


@contextmanager
def _worker_process(db: str, marks: Path | None = None) -> Iterator[subprocess.Popen[str]]:
    env = dict(os.environ)
    if marks is not None:
        env[MARKS_ENV] = str(marks)
    proc = subprocess.Popen([sys.executable, "-m", "bench.signals", "_worker", db], cwd=REPO_ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the worker process did not start")
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _proc_status(pid: int) -> tuple[float, int, float]:
    """RSS in MiB, thread count, CPU seconds used so far."""
    rss, threads = 0.0, 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return rss, threads, cpu


# -- backends ------------------------------------------------------------------------------------


@contextmanager
def _sqlite_db(label: str) -> Iterator[str]:
    with fresh_dir(label) as d:
        yield f"sqlite:///{d / 'signals.db'}"


@contextmanager
def _postgres_db(label: str) -> Iterator[str]:
    from bench import pgdb

    with pgdb.fresh_database(label) as url:
        yield url


def _ensure_postgres() -> None:
    """Point ``$CAIRN_BENCH_PG`` at a server: the given one, or a private cluster."""
    from bench import pgdb

    if os.environ.get(pgdb.PG_ENV):
        return
    from tests import pgcluster

    os.environ[pgdb.PG_ENV] = pgcluster.admin_url()


BACKENDS: dict[str, Callable[[str], Any]] = {"sqlite": _sqlite_db, "postgres": _postgres_db}


# -- filling a database with waiting runs -----------------------------------------------------------


def _columns(store: Store, table: str) -> list[str]:
    if isinstance(store, SQLiteStore):
        return [row[1] for row in store._conn().execute(f"PRAGMA table_info({table})")]
    assert isinstance(store, PostgresStore)
    with store._conn() as conn:
        rows = conn.execute("SELECT column_name FROM information_schema.columns WHERE table_name = %s "
                            "AND table_schema = current_schema() ORDER BY ordinal_position", (table,))
        return [r[0] for r in rows]


def fill_waiting(app: cairn.App, n: int) -> None:
    """``n`` runs suspended in ``wait_for_signal``: copies of one that really is."""
    seed = app.start("waiter").run_id
    claim = app.store.claim_run(seed, "bench", 30.0, 5)
    assert claim is not None
    from cairn.engine.executor import execute

    assert execute(app.runtime, claim, "bench").status == "suspended"
    store = app.store
    runs = [c for c in _columns(store, "runs") if c != "run_id"]
    history = [c for c in _columns(store, "history") if c != "run_id"]
    sqlite = isinstance(store, SQLiteStore)
    series = "WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i + 1 < :n) " if sqlite \
        else ""
    rows = "s" if sqlite else "generate_series(0, %(n)s - 1) AS s(i)"
    seed_param = ":seed" if sqlite else "%(seed)s"
    copy_runs = (f"{series}INSERT INTO runs (run_id, {', '.join(runs)}) SELECT 'w' || s.i, {', '.join(runs)} "
                 f"FROM runs, {rows} WHERE run_id = {seed_param}")
    copy_history = (f"{series}INSERT INTO history (run_id, {', '.join(history)}) "
                    f"SELECT 'w' || s.i, {', '.join(history)} FROM history, {rows} "
                    f"WHERE run_id = {seed_param}")
    params = {"n": n, "seed": seed}
    if isinstance(store, SQLiteStore):
        with store._write() as conn:
            conn.execute(copy_runs, params)
            conn.execute(copy_history, params)
        store._conn().execute("ANALYZE")
    else:
        assert isinstance(store, PostgresStore)
        with store._conn() as conn:
            conn.execute(copy_runs, params)
            conn.execute(copy_history, params)
        with store._conn() as conn:
            conn.execute("ANALYZE")


def database_bytes(store: Store) -> int:
    if isinstance(store, SQLiteStore):
        store._conn().execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return sum(p.stat().st_size for p in store.path.parent.glob(store.path.name + "*") if p.is_file())
    assert isinstance(store, PostgresStore)
    with store._conn() as conn:
        row = conn.execute("SELECT pg_total_relation_size('runs') + pg_total_relation_size('history') "
                           "+ pg_total_relation_size('mailbox')").fetchone()
        assert row is not None
        return int(row[0])


def claim_cost(app: cairn.App) -> Sample:
    """Median ``claim_runs`` of 8 runnable ``noop`` runs (each claim takes fresh ones)."""
    for _ in range(CLAIMS * LIMIT):
        app.start("noop")
    settle()
    times = []
    for _ in range(CLAIMS):
        t0 = time.perf_counter()
        claims = app.store.claim_runs("bench-claims", ["noop"], LIMIT, 30.0, 5)
        times.append((time.perf_counter() - t0) * 1e6)
        assert len(claims) == LIMIT, len(claims)
    return Sample(tuple(times))


# -- the measurements ---------------------------------------------------------------------------------


def waiting_costs(backend: str, n: int) -> list[Result]:
    results: list[Result] = []
    sizes: dict[int, int] = {}
    for count in (0, n):
        with BACKENDS[backend](f"sig_wait_{count}") as db:
            app = build_app(db)
            try:
                base = database_bytes(app.store)
                if count:
                    t0 = time.perf_counter()
                    fill_waiting(app, count)
                    print(f"{backend}: {count:,} waiting runs written in {time.perf_counter() - t0:.1f}s",
                          file=sys.stderr)
                sizes[count] = database_bytes(app.store) - base
                with _worker_process(db) as proc:
                    time.sleep(2.0)  # idle: its first claims and its listener are behind it
                    rss, threads, cpu0 = _proc_status(proc.pid)
                    time.sleep(2.0)
                    _, _, cpu1 = _proc_status(proc.pid)
                system = f"{backend} {count:,} waiting"
                results.append(Result("idle worker RSS MiB", system, "MiB", Sample((rss,)),
                                      params={"waiting": count}))
                results.append(Result("idle worker threads", system, "threads", Sample((float(threads),)),
                                      params={"waiting": count}))
                idle_cpu = (cpu1 - cpu0) / 2 * 1000
                results.append(Result("idle worker CPU ms/s", system, "ms/s", Sample((idle_cpu,)),
                                      params={"waiting": count}))
                results.append(Result("claim µs", system, "µs", claim_cost(app), params={"waiting": count}))
            finally:
                app.close()
    per_run = (sizes[n] - sizes[0]) / n
    results.append(Result("bytes per suspended run", f"{backend} {n:,} waiting", "bytes", Sample((per_run,)),
                          params={"waiting": n}))
    return results


def signal_latency(backend: str, rounds: int) -> list[Result]:
    with BACKENDS[backend]("sig_latency") as db, fresh_dir("sig_marks") as d:
        marks = d / "marks.txt"
        marks.touch()
        app = build_app(db)
        try:
            with _worker_process(db, marks):
                run_id = app.start("pingpong", rounds).run_id
                sent: list[float] = []
                for i in range(rounds):
                    # suspended again, after the step of the previous round (a
                    # run woken but not claimed yet is suspended too)
                    _until(lambda i=i: _lines(marks) >= i
                           and app.get_run(run_id).status is RunStatus.SUSPENDED)
                    sent.append(time.time())
                    app.signal(run_id, "go")
                app.handle(run_id).result(timeout=60)
        finally:
            app.close()
        started = {int(i): float(t) for i, t in (line.split() for line in marks.read_text().splitlines())}
    latencies = tuple((started[i] - sent[i]) * 1000 for i in range(rounds))
    results = _percentiles(f"{backend}: Cairn worker process", latencies, {"rounds": rounds, "poll": 0.1})
    return results + _fresh_latency(backend, rounds)


def _fresh_latency(backend: str, rounds: int) -> list[Result]:
    """The same wake-up for a run per signal: a journal of a few entries. The
    ping-pong above wakes one run whose journal grows by three entries a
    round, and every wake-up replays it from the top (the claim reads and
    decodes its whole history): its p50 is that of a journal of about 1.5 times rounds entries
    journal; this one is the wake-up itself."""
    with BACKENDS[backend]("sig_fresh") as db, fresh_dir("sig_fresh_marks") as d:
        marks = d / "marks.txt"
        marks.touch()
        app = build_app(db)
        sent: list[float] = []
        try:
            with _worker_process(db, marks):
                for i in range(rounds):
                    run_id = app.start("single", i).run_id
                    _until(lambda run_id=run_id: app.get_run(run_id).status is RunStatus.SUSPENDED)
                    sent.append(time.time())
                    app.signal(run_id, "go")
                    _until(lambda i=i: _lines(marks) > i)
        finally:
            app.close()
        started = {int(i): float(t) for i, t in (line.split() for line in marks.read_text().splitlines())}
    latencies = tuple((started[i] - sent[i]) * 1000 for i in range(rounds))
    return _percentiles(f"{backend}: Cairn worker process, a run per signal", latencies, {"rounds": rounds})


def dbos_latency(rounds: int) -> list[Result]:
    try:
        from bench.baselines import _dbos_configured
    except ImportError as exc:  # pragma: no cover - bench extra missing
        return [Result("signal → next step p50 ms", "DBOS recv/send (SQLite)", "ms", note=f"skipped: {exc}")]
    started: dict[int, float] = {}
    sent: list[float] = []
    with fresh_dir("dbos_signals") as d, _dbos_configured(d) as dbos:

        @dbos.step()
        def mark(i: int) -> int:
            started[i] = time.time()
            return i

        @dbos.workflow()
        def pingpong(n: int) -> int:
            for i in range(n):
                dbos.recv("go", timeout_seconds=60)
                mark(i)
            return n

        dbos.launch()
        handle = dbos.start_workflow(pingpong, rounds)
        for i in range(rounds):
            _until(lambda i=i: len(started) >= i)
            time.sleep(0.05)  # it is inside recv by now, like the suspended Cairn run
            sent.append(time.time())
            dbos.send(handle.get_workflow_id(), i, "go")
        handle.get_result()
    latencies = tuple((started[i] - sent[i]) * 1000 for i in range(rounds))
    return _percentiles("DBOS recv/send (SQLite, one process)", latencies, {"rounds": rounds})


def _percentiles(system: str, latencies: Sequence[float], params: dict[str, Any]) -> list[Result]:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    print(f"{system}: p50 {statistics.median(ordered):.2f} ms, p99 {p99:.2f} ms, max {ordered[-1]:.2f} ms "
          f"({len(ordered)} signals)", file=sys.stderr)
    return [Result("signal → next step p50 ms", system, "ms", Sample(tuple(latencies)), params=params),
            Result("signal → next step p99 ms", system, "ms", Sample((p99,)), params=params)]


def _lines(path: Path) -> int:
    with open(path, "rb") as f:
        return f.read().count(b"\n")


def _until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out")
        time.sleep(0.001)


def queued_drain(backend: str, n: int) -> list[Result]:
    """``n`` signals queued for one run, taken by ``n`` receives in one
    execution (``app.run``): the seconds it takes, and the mailbox rows the
    store hands the engine (a receive used to read every message of its key,
    taken ones included: n² rows)."""
    with BACKENDS[backend]("sig_queued") as db:
        app = build_app(db)
        try:
            run_id = app.start("drain", n).run_id
            for i in range(n):
                app.signal(run_id, "n", i)
            rows = _count_mailbox_rows(app.store)
            t0 = time.perf_counter()
            assert app.run("drain", n, run_id=run_id) == n * (n - 1) // 2
            seconds = time.perf_counter() - t0
        finally:
            app.close()
    system = f"{backend}: {n:,} queued signals"
    print(f"{system}: taken in {seconds:.2f}s, {rows[0]:,} mailbox rows read", file=sys.stderr)
    return [Result("drain queued signals s", system, "s", Sample((seconds,)), params={"signals": n}),
            Result("mailbox rows read", system, "rows", Sample((float(rows[0]),)), params={"signals": n})]


def _count_mailbox_rows(store: Store) -> list[int]:
    """Count (``[0]``) every mailbox message any method of ``store`` returns."""
    from cairn.store.records import Delivery

    rows = [0]
    for name in dir(type(store)):
        method = getattr(store, name, None)
        if name.startswith("_") or not callable(method):
            continue

        def counting(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
            result = _method(*args, **kwargs)
            found = result if isinstance(result, list) else [result]
            rows[0] += sum(1 for item in found if isinstance(item, Delivery))
            return result

        setattr(store, name, counting)
    return rows


# -- main -------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_worker"]:
        return _worker_child(argv[1])
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10,000 waiting runs, 60 signals")
    parser.add_argument("--waiting", type=int, default=None, help="waiting runs (default 100,000)")
    parser.add_argument("--rounds", type=int, default=None, help="signals per backend (default 300)")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--only", default="waiting,latency,queued,dbos",
                        help="groups: waiting, latency, queued, dbos")
    parser.add_argument("--queued", type=int, default=None, help="signals queued for one run (default 1,000)")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    waiting = args.waiting or (10_000 if args.quick else 100_000)
    rounds = args.rounds or (60 if args.quick else 300)
    groups = set(args.only.split(","))
    backends = [b for b in args.backends.split(",") if b]
    if "postgres" in backends:
        _ensure_postgres()
    load_before = os.getloadavg()
    results: list[Result] = []
    for backend in backends:
        if "waiting" in groups:
            results.extend(waiting_costs(backend, waiting))
        if "latency" in groups:
            results.extend(signal_latency(backend, rounds))
        if "queued" in groups:
            results.extend(queued_drain(backend, args.queued or (200 if args.quick else 1000)))
    if "dbos" in groups:
        results.extend(dbos_latency(10 if args.quick else 30))
    baselines = [f"{b} 0 waiting" for b in backends] + ["sqlite: Cairn worker process"]
    print_table(results, baselines)
    # Latencies are wall-clock: on a shared machine they follow its load.
    load = {"before": load_before, "after": os.getloadavg(), "cores": os.cpu_count()}
    print(f"\nload average (1 min) {load_before[0]:.1f} before, {load['after'][0]:.1f} after, "
          f"on {os.cpu_count()} cores")
    if not args.no_save:
        path = write_results(results, baselines, {"waiting": waiting, "rounds": rounds, "load": load}, OUT)
        print(f"\nwritten to {path.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
