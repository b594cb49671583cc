"""Claim cost against backlog size and tenant count, on SQLite and PostgreSQL.

    python -m bench.claims            # backlogs 1k, 10k, 100k; 1 and 200 tenants
    python -m bench.claims --quick    # 1k and 10k only

Results go to ``bench/results/claims-latest.json``.

A claim (``claim_runs``, limit 8) walks lanes through an index (see
``store/admission.py``), so it should cost about the same whatever the
backlog. Each figure is the median over 40 claims of the wall time of one
``claim_runs`` call (lock, plan, epoch bumps, history, commit); each claimed
run is then finished outside the timed region, so the backlog stays put.
The baseline row of each backend is the smallest backlog with one tenant,
measured in the same run; ratios say how the cost grows from there.

Backlogs are written in bulk by SQL that copies one run made through the
store (its row and its ``run.created`` entry), with distinct ids and times.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from bench import pgdb
from bench.common import RESULTS_DIR, Result, Sample, fresh_dir, print_table, settle, write_results
from cairn.store.contract import Store
from cairn.store.postgres import PostgresStore
from cairn.store.records import EventType, HistoryEvent, NewRun, Payload, RunStatus
from cairn.store.sqlite import SQLiteStore

WF = "wf"
CLAIMS = 40
LIMIT = 8

_RUN_COLUMNS = ("workflow, workflow_version, thread_id, queue, priority, parent_run_id, status, input, "
                "input_ref, result, result_ref, error, epoch, owner, lease_expires_at, wake_at, waiting_on, "
                "recoveries, budget")
_HISTORY_COLUMNS = ("event, epoch, worker, position, step_kind, name, input_hash, attempt, started_at, "
                    "payload, payload_ref, detail")


def _fill_sql(dialect: str) -> tuple[str, str]:
    """Statements copying run ``seed`` into ``n`` runs ``b<i>`` of tenant ``t<i % tenants>``."""
    mod = "%" if dialect == "sqlite" else "%%"
    if dialect == "sqlite":
        series = ("WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i + 1 < :n) ")
        rows, cat, src = "s", "||", "runs"
        p = {k: f":{k}" for k in ("n", "tenants", "t0")}
    else:
        series = ""
        rows, cat, src = "generate_series(0, %(n)s - 1) AS s(i)", "||", "runs"  # % is %% below
        p = {k: f"%({k})s" for k in ("n", "tenants", "t0")}
    runs = (f"{series}INSERT INTO runs (run_id, tenant, runnable_at, created_at, updated_at, {_RUN_COLUMNS}) "
            f"SELECT 'b' {cat} s.i, 't' {cat} (s.i {mod} {p['tenants']}), {p['t0']} + s.i * 0.000001, "
            f"{p['t0']}, {p['t0']}, {_RUN_COLUMNS} FROM {src}, {rows} WHERE run_id = 'seed'")
    history = (f"{series}INSERT INTO history (run_id, seq, tenant, at, {_HISTORY_COLUMNS}) "
               f"SELECT 'b' {cat} s.i, 1, 't' {cat} (s.i {mod} {p['tenants']}), {p['t0']}, "
               f"{_HISTORY_COLUMNS} "
               f"FROM history, {rows} WHERE run_id = 'seed' AND seq = 1")
    return runs, history


def _fill(store: Store, dialect: str, backlog: int, tenants: int) -> None:
    store.create_run(NewRun("seed", WF, "1", "seed", None, Payload(data=b"[]")))
    runs, history = _fill_sql(dialect)
    params = {"n": backlog, "tenants": tenants, "t0": time.time() - 3600}
    if isinstance(store, SQLiteStore):
        with store._write() as conn:  # bench only: bulk SQL the store has no method for
            conn.execute(runs, params)
            conn.execute(history, params)
            conn.execute("DELETE FROM runs WHERE run_id = 'seed'")
            conn.execute("DELETE FROM history WHERE run_id = 'seed'")
        store._conn().execute("ANALYZE")
    else:
        assert isinstance(store, PostgresStore)
        with store._conn() as conn:
            conn.execute(runs, params)
            conn.execute(history, params)
            conn.execute("DELETE FROM runs WHERE run_id = 'seed'")
            conn.execute("DELETE FROM history WHERE run_id = 'seed'")
            conn.execute("ANALYZE")


def _measure(store: Store) -> Sample:
    times: list[float] = []
    for _ in range(CLAIMS):
        t0 = time.perf_counter()
        claims = store.claim_runs("bench", [WF], LIMIT, 30.0, 3)
        times.append((time.perf_counter() - t0) * 1e6)
        assert len(claims) == LIMIT, len(claims)
        for c in claims:
            done = HistoryEvent(run_id=c.run.run_id, seq=c.next_seq, event=EventType.RUN_COMPLETED,
                                at=time.time(), epoch=c.run.epoch, worker="bench")
            store.finish_run(c.run.run_id, c.run.epoch, done, RunStatus.COMPLETED, Payload(data=b"0"), None)
    return Sample(tuple(times))


#: The claim query before queues (one global ORDER BY over every runnable
#: run, on an index of runnable_at alone): the reference for the selection.
_OLD_SELECT = {
    "sqlite": ("SELECT run_id FROM runs WHERE runnable_at IS NOT NULL AND runnable_at <= :now "
               "AND workflow IN (SELECT value FROM json_each(:workflows)) "
               "ORDER BY priority DESC, runnable_at LIMIT :limit"),
    "postgres": ("SELECT run_id, status, owner, epoch, recoveries FROM runs "
                 "WHERE runnable_at <= %(now)s::float8 AND workflow = ANY(%(workflows)s::text[]) "
                 "ORDER BY priority DESC, runnable_at, run_id COLLATE \"C\" LIMIT %(limit)s::bigint "
                 "FOR UPDATE SKIP LOCKED"),
}


def _select_only(store: Store, dialect: str) -> tuple[Sample, Sample]:
    """Median time of the selection alone: the old query (on its old index,
    created for this) and the new lane walk. Nothing is claimed: SQLite rolls
    back; PostgreSQL commits transactions that only locked rows."""
    old: list[float] = []
    new: list[float] = []
    if isinstance(store, SQLiteStore):
        conn = store._conn()
        conn.execute("CREATE INDEX old_runnable ON runs (runnable_at) WHERE runnable_at IS NOT NULL")
        params = {"now": time.time(), "workflows": '["wf"]', "limit": LIMIT}
        for _ in range(CLAIMS):
            conn.execute("BEGIN IMMEDIATE")
            t0 = time.perf_counter()
            conn.execute(_OLD_SELECT[dialect], params).fetchall()
            t1 = time.perf_counter()
            store._lanes(conn, "default", '["wf"]', params["now"], LIMIT)
            t2 = time.perf_counter()
            conn.execute("ROLLBACK")
            old.append((t1 - t0) * 1e6)
            new.append((t2 - t1) * 1e6)
        conn.execute("DROP INDEX old_runnable")
    else:
        assert isinstance(store, PostgresStore)
        with store._conn() as conn:
            conn.execute("CREATE INDEX old_runnable ON runs (runnable_at) WHERE runnable_at IS NOT NULL")
            now = time.time()
            params = {"now": now, "workflows": ["wf"], "limit": LIMIT, "queues": None, "max_lanes": 64}
            for _ in range(CLAIMS):
                # Committed (they change nothing), not rolled back: psycopg
                # forgets statements prepared in a rolled-back transaction, and
                # claims run prepared statements. The lane walk runs as a claim
                # runs it, with the claim's plan setting.
                with conn.transaction():
                    t0 = time.perf_counter()
                    conn.execute(_OLD_SELECT[dialect], params).fetchall()
                    t1 = time.perf_counter()
                with conn.transaction():
                    conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
                    t2 = time.perf_counter()
                    store._select_lanes(conn, params)
                    t3 = time.perf_counter()
                old.append((t1 - t0) * 1e6)
                new.append((t3 - t2) * 1e6)
            conn.execute("DROP INDEX old_runnable")
    return Sample(tuple(old)), Sample(tuple(new))


@contextmanager
def _sqlite() -> Iterator[Store]:
    with fresh_dir("claims") as d:
        store = SQLiteStore(d / "claims.db")
        try:
            yield store
        finally:
            store.close()


@contextmanager
def _postgres() -> Iterator[Store]:
    with pgdb.fresh_database("claims") as url:
        store = PostgresStore(url)
        try:
            yield store
        finally:
            store.close()


def run(backlogs: Sequence[int], tenant_counts: Sequence[int]) -> list[Result]:
    backends: dict[str, Callable[[], Any]] = {"sqlite": _sqlite, "postgres": _postgres}
    results: list[Result] = []
    for name, opener in backends.items():
        for backlog in backlogs:
            for tenants in tenant_counts:
                with opener() as store:
                    _fill(store, name, backlog, tenants)
                    settle()
                    sample = _measure(store)
                    old, new = _select_only(store, name)
                system = f"{name} {backlog:,} waiting, {tenants} tenant{'s' if tenants > 1 else ''}"
                print(f"{system}: median {statistics.median(sample.values):,.0f} µs", file=sys.stderr)
                params = {"backlog": backlog, "tenants": tenants, "limit": LIMIT}
                results.append(Result(f"{name} claim µs", system, "µs", sample=sample, params=params))
                results.append(Result(f"{name} select µs", f"{system}: lane walk", "µs", sample=new,
                                      params=params))
                results.append(Result(f"{name} select µs", f"{system}: old ORDER BY", "µs", sample=old,
                                      params=params))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-save", action="store_true",
                        help="Do not write bench/results/claims-latest.json.")
    args = parser.parse_args(argv)
    backlogs = (1_000, 10_000) if args.quick else (1_000, 10_000, 100_000)
    results = run(backlogs, (1, 200))
    for dialect in ("sqlite", "postgres"):
        rows = [r for r in results if r.metric == f"{dialect} claim µs"]
        print_table(rows, baselines=(rows[0].system,))
        selects = [r for r in results if r.metric == f"{dialect} select µs"]
        print_table(selects, baselines=(selects[0].system, selects[1].system))
    if not args.no_save:
        baselines = [r.system for r in results
                     if r.params["backlog"] == backlogs[0] and r.params["tenants"] == 1]
        out = write_results(results, baselines, {"backlogs": list(backlogs), "limit": LIMIT},
                            RESULTS_DIR / "claims-latest.json")
        print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
