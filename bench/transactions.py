"""What a transactional step costs next to a plain step that commits its
user row itself, side by side in one run (SQLite, default durability).

    python -m bench.transactions             # 300-step runs, 5 rounds, medians
    python -m bench.transactions --steps 1000 --rounds 7
    valgrind --tool=callgrind python -m bench.transactions --only transaction --steps 200

Rows (µs per step; ratio = row / ``step + own commit``, measured alternately
in the same rounds, each sample on a fresh database file):

* ``step + own commit``: the baseline. A plain ``@app.step`` whose body
  INSERTs one row into the user's table in the same SQLite file through a
  connection of its own (``BEGIN IMMEDIATE; INSERT; COMMIT``, WAL,
  ``synchronous=NORMAL`` like the store), then the step's record: two
  commits, and a crash between them inserts the row again on recovery.
* ``transaction``: ``@app.transaction`` doing the same INSERT through its
  ``cairn.Tx``: one commit holding the fence, the row and the record.
* ``plain step``: the same step without any INSERT, for scale.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import threading
import time
from pathlib import Path

import cairn

ORDERS = "CREATE TABLE IF NOT EXISTS orders (run_id TEXT NOT NULL, position INTEGER NOT NULL)"
VARIANTS = ("step + own commit", "transaction", "plain step")


def build(db: Path) -> tuple[cairn.App, dict[str, cairn.Workflow[int]]]:
    app = cairn.App(db=f"sqlite:///{db}")
    own = threading.local()

    def user_connection() -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(own, "conn", None)
        if conn is None:
            conn = sqlite3.connect(db, isolation_level=None, timeout=30)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            own.conn = conn
        return conn

    @app.step()
    def own_commit(i: int) -> int:
        info = cairn.step_info()
        conn = user_connection()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO orders (run_id, position) VALUES (?, ?)", (info.run_id, info.position))
        conn.execute("COMMIT")
        return i

    @app.transaction()
    def in_transaction(tx: cairn.Tx, i: int) -> int:
        info = cairn.step_info()
        tx.execute("INSERT INTO orders (run_id, position) VALUES (?, ?)", (info.run_id, info.position))
        return i

    @app.step()
    def plain(i: int) -> int:
        return i

    @app.transaction()
    def create(tx: cairn.Tx) -> None:
        tx.execute(ORDERS)

    def chain(call: object) -> cairn.Workflow[int]:
        def body(ctx: cairn.Context, n: int) -> int:
            total = 0
            for i in range(n):
                total += call(i)  # type: ignore[operator]
            return total

        return app.workflow(name=f"chain-{getattr(call, '__name__', 'x')}")(body)

    @app.workflow(name="setup")
    def setup(ctx: cairn.Context) -> None:
        create()

    app.run(setup)
    return app, {"step + own commit": chain(own_commit), "transaction": chain(in_transaction),
                 "plain step": chain(plain)}


def sample(directory: Path, variant: str, steps: int) -> float:
    db = directory / f"{variant.replace(' ', '-').replace('+', 'and')}-{time.monotonic_ns()}.db"
    app, workflows = build(db)
    workflow = workflows[variant]
    try:
        app.run(workflow, 1)  # warm-up
        started = time.perf_counter()
        app.run(workflow, steps)
        elapsed = time.perf_counter() - started
    finally:
        app.close()
    return elapsed / steps * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", choices=VARIANTS, help="one variant, one sample (for callgrind)")
    args = parser.parse_args(argv)
    if args.only:
        with tempfile.TemporaryDirectory(prefix="cairn-bench-txn-") as tmp:
            print(f"{args.only}: {sample(Path(tmp), args.only, args.steps):.1f} µs/step")
        return 0
    samples: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="cairn-bench-txn-") as tmp:
        for _ in range(args.rounds):
            for variant in VARIANTS:  # alternated: the machine's noise hits every row alike
                samples[variant].append(sample(Path(tmp), variant, args.steps))
    baseline = statistics.median(samples[VARIANTS[0]])
    print(f"{'variant':<20} {'µs/step':>9} {'ratio':>7}   samples")
    for variant in VARIANTS:
        median = statistics.median(samples[variant])
        shown = " ".join(f"{s:.0f}" for s in samples[variant])
        print(f"{variant:<20} {median:9.1f} {median / baseline:7.2f}   {shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
