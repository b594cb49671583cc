"""The client CPU of binding a LangGraph write's statements: psycopg's
``ClientCursor.mogrify`` against ``cairn.store.pgliterals`` (``_lg_binder``),
on the very calls a CairnSaver run on PostgreSQL makes.

    python -m bench.pg_literals                 # 60 super-steps captured, 9 rounds
    python -m bench.pg_literals --steps 60 --rounds 9

It runs ``bench.graph``'s graph (``bench.langgraph_saver.run``) with
CairnSaver on a fresh database of ``$CAIRN_BENCH_PG`` (``bench.pgdb``),
recording every (query, parameters) ``_lg_operate`` binds; then, round after
round, alternating which goes first, binds the calls of the last 40
super-steps once with psycopg (``ClientCursor(conn).mogrify``, a cursor per
call; the saver made one per part of a message, 1 to 4 statements) and once with ``_lg_binder``
(the connection's settings checked per call, as the saver checks them per
message part; ``pgliterals`` renders every call, none is left to psycopg):
the thread's CPU time, per super-step (the calls / 40, the
same window as the figures of issue 24, 2026-12-07), and per statement.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from typing import Any

import psycopg

from bench import pgdb
from bench.langgraph_saver import run
from cairn.store import pgliterals, postgres

#: super-steps of the window timed (the last ones of the run)
WINDOW = 40


def capture(steps: int) -> tuple[str, list[tuple[str, Any]]]:
    """The (query, parameters) the saver bound in a run of ``steps`` super-steps."""
    from cairn.langgraph import CairnSaver

    calls: list[tuple[str, Any]] = []
    binder = postgres._lg_binder

    def recording(conn: Any) -> Any:
        bind = binder(conn)

        def recorded(query: str, params: Any) -> str:
            calls.append((query, params))
            return bind(query, params)
        return recorded

    postgres._lg_binder = recording  # type: ignore[assignment]
    try:
        with pgdb.fresh_database("pglit") as url:
            saver = CairnSaver(url, tenant="bench")
            try:
                run(saver, steps)
            finally:
                saver.close()
    finally:
        postgres._lg_binder = binder  # type: ignore[assignment]
    return pgdb.admin_url(), calls


def _label(query: str) -> str:
    return " ".join(query.split())[:40]


def timed(calls: list[tuple[str, Any]], bind: Any) -> tuple[float, dict[str, float]]:
    """CPU seconds binding ``calls`` once, and per statement (5 repeats each, averaged)."""
    start = time.thread_time()
    for query, params in calls:
        bind(query, params)
    total = time.thread_time() - start
    per: dict[str, float] = defaultdict(float)
    for query, params in calls:
        t0 = time.thread_time()
        for _ in range(5):
            bind(query, params)
        per[_label(query)] += (time.thread_time() - t0) / 5
    return total, per


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    url, calls = capture(args.steps)
    holds = [i for i, (q, _) in enumerate(calls) if "lg_hold(" in q]
    window = calls[holds[-2 * WINDOW]:] if len(holds) >= 2 * WINDOW else calls
    print(f"{len(calls)} calls captured in {args.steps} super-steps; timing the last {len(window)} "
          f"({len(window) / WINDOW:.1f} a super-step)")
    with psycopg.connect(url) as conn:
        def mogrify(query: str, params: Any) -> str:
            return psycopg.ClientCursor(conn).mogrify(query, params)

        ours = postgres._lg_binder(conn)
        for query, params in window:  # pgliterals renders every call (none left to psycopg); warm caches
            pgliterals.bind(query, params)
            mogrify(query, params)
        sides = {"psycopg": mogrify, "pgliterals": ours}
        totals: dict[str, list[float]] = {name: [] for name in sides}
        per: dict[str, dict[str, list[float]]] = {name: defaultdict(list) for name in sides}
        for r in range(args.rounds):
            order = list(sides) if r % 2 == 0 else list(sides)[::-1]
            line = []
            for name in order:
                total, by = timed(window, sides[name])
                totals[name].append(total / WINDOW * 1e6)
                for label, s in by.items():
                    per[name][label].append(s / WINDOW * 1e6)
                line.append(f"{name} {total / WINDOW * 1e6:.0f}")
            print(f"round {r + 1}: µs per super-step: " + ", ".join(line))
    print()
    for name in sides:
        print(f"{name}: median {statistics.median(totals[name]):.0f} µs per super-step "
              f"(min {min(totals[name]):.0f}, max {max(totals[name]):.0f})")
    ratio = statistics.median(a / b for a, b in zip(totals["psycopg"], totals["pgliterals"], strict=True))
    print(f"median per-round ratio psycopg / pgliterals: {ratio:.1f}x")
    print("\nper statement, µs per super-step (medians): psycopg -> pgliterals")
    for label in per["psycopg"]:
        print(f"  {label:42s} {statistics.median(per['psycopg'][label]):6.1f} -> "
              f"{statistics.median(per['pgliterals'][label]):5.1f}")


if __name__ == "__main__":
    main()
