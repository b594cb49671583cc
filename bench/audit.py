"""What the audit chain costs (issue 26): per journaled step, side by side
with the chain off, and how fast ``cairn audit verify`` checks entries.

    python -m bench.audit                    # SQLite: step cost side by side, verify speed
    python -m bench.audit --postgres         # PostgreSQL too ($CAIRN_BENCH_PG, bench/pgdb.py)
    python -m bench.audit --quick            # small sizes

Step cost: one run of ``--steps`` steps (``app.run``, durability
``process``), with the chain (the store as shipped) and without it (SQLite:
the write connections' audit trigger not installed; PostgreSQL: the trigger
disabled), the two alternated round by round on fresh databases so drift
hits both alike; medians of ``--rounds``. Verify speed: a database of
``--runs`` runs of ``--run-steps`` steps; ``App.audit.verify()`` end to end
(reading every entry and link in one snapshot, then recomputing each link),
and the recomputation alone on the rows already read.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator

from bench.cairn_workloads import CairnWorkloads, build, build_url
from bench.common import fresh_dir, settle, stopwatch
from cairn.api.auditchain import verify_chains
from cairn.store import auditlinks


@contextlib.contextmanager
def sqlite_chain(on: bool) -> Iterator[None]:
    """Stores opened inside install the audit trigger (``on``) or not."""
    kept = auditlinks.TRIGGERS
    if not on:
        auditlinks.TRIGGERS = ()
    try:
        yield
    finally:
        auditlinks.TRIGGERS = kept


def step_us(make: Callable[[], CairnWorkloads], steps: int) -> float:
    w = make()
    try:
        w.app.run(w.chain, 1)  # warm-up: connection and statements ready
        settle()
        with stopwatch() as elapsed:
            result = w.app.run(w.chain, steps)
    finally:
        w.close()
    if result != steps:
        raise RuntimeError(f"chain returned {result!r}, expected {steps}")
    return elapsed() / steps * 1e6


def sqlite_step(on: bool, steps: int) -> float:
    with fresh_dir(f"audit-{'on' if on else 'off'}") as d, sqlite_chain(on):
        return step_us(lambda: build(d / "cairn.sqlite"), steps)


def pg_step(on: bool, steps: int) -> float:
    import psycopg

    from bench.pgdb import fresh_database

    with fresh_database(f"audit_{'on' if on else 'off'}") as db_url:
        def make() -> CairnWorkloads:
            w = build_url(db_url)
            with psycopg.connect(db_url, autocommit=True) as conn:
                conn.execute("SET search_path = cairn")
                conn.execute(f"ALTER TABLE history {'ENABLE' if on else 'DISABLE'} TRIGGER audit_link")
            return w

        return step_us(make, steps)


def side_by_side(name: str, measure: Callable[[bool], float], rounds: int) -> None:
    on: list[float] = []
    off: list[float] = []
    for _ in range(rounds):
        off.append(measure(False))
        on.append(measure(True))
    m_on, m_off = statistics.median(on), statistics.median(off)
    deltas = sorted(a - b for a, b in zip(on, off, strict=True))
    print(f"{name}: step {m_off:.1f} us without the chain, {m_on:.1f} us with it: "
          f"+{m_on - m_off:.1f} us per step (median of {rounds} paired rounds; paired differences "
          f"{deltas[0]:+.1f} .. {deltas[-1]:+.1f}, median {statistics.median(deltas):+.1f})")


def verify_speed(runs: int, run_steps: int) -> None:
    with fresh_dir("audit-verify") as d:
        w = build(d / "cairn.sqlite")
        try:
            for i in range(runs):
                w.app.run(w.chain, run_steps, run_id=f"r{i}")
            settle()
            with stopwatch() as whole:
                report = w.app.audit.verify()
            entries, links = w.app.store.audit_scan(lambda e, lk, _: (list(e), list(lk)))
            linked = {r[0] for r in links}
            with stopwatch() as alone:
                chains = verify_chains(entries, links, lambda run: run in linked)
        finally:
            w.close()
    if report.problems or chains.problems:
        raise RuntimeError(f"the bench's own history does not verify: {report.summary()}")
    print(f"verify: {report.entries} entries of {report.runs} runs: end to end "
          f"{report.entries / whole():,.0f} entries/s ({whole():.2f} s, SQLite read included); "
          f"recomputing the links alone "
          f"{chains.entries / alone():,.0f} entries/s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--run-steps", type=int, default=50)
    parser.add_argument("--postgres", action="store_true", help="Measure on PostgreSQL too (bench/pgdb.py).")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.rounds, args.runs, args.run_steps = 100, 3, 100, 20
    started = time.time()
    side_by_side("SQLite", lambda on: sqlite_step(on, args.steps), args.rounds)
    if args.postgres:
        side_by_side("PostgreSQL", lambda on: pg_step(on, args.steps), args.rounds)
    verify_speed(args.runs, args.run_steps)
    print(f"({time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()
