"""What archiving a closed run saves and costs (issue 26 item 5): bytes per
archived run against the bytes it held in the hot tables, and the read of an
archived run's history against a hot run's, side by side in one run.

    python -m bench.archive                  # SQLite, 400 runs of 12 model turns
    python -m bench.archive --sealed         # encryption on (payloads sealed row by row)
    python -m bench.archive --runs 100 --turns 6

Workload: runs of an agent loop, each turn a recorded model call
(``ScriptedModel``) and a tool step, with text drawn from a Zipf-distributed
vocabulary of 5,000 words (prose-like redundancy, not repeated bytes: the
ratio is not flattered by ``"z" * 2000``). Half the runs are archived.

Bytes: the database file after ``wal_checkpoint(TRUNCATE)`` and ``VACUUM``
before and after archiving (the hot bytes the archived runs held, indexes
and page overhead included, divided by their number), against the archive
objects stored for them (their sizes on disk). Reads: ``store.history`` of a
hot run and of an archived one, interleaved, medians of ``--reads`` each;
the archived read both cold (the decoded-archive cache emptied before each
read: fetch the object, check its hash, inflate, decode) and warm (cached).
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import statistics
import time
from pathlib import Path
from typing import Any

import cairn
from bench.common import fresh_dir, settle
from cairn.models import Message, ScriptedModel

VOCABULARY = 5000


def words(rng: random.Random, count: int) -> str:
    """Prose-like text: word ranks Zipf-distributed (s ~ 1.1), as natural language's are."""
    ranks = [min(int(rng.paretovariate(1.1)), VOCABULARY) for _ in range(count)]
    return " ".join(f"w{rank:x}{'aeiou'[rank % 5]}" for rank in ranks)


def build_app(url: str, turns: int, sealed: bool) -> cairn.App:
    keyring = None
    if sealed:
        from cairn.security.keyring import LocalKeyring

        keyring = LocalKeyring({"kek1": os.urandom(32)}, "kek1")
    app = cairn.App(db=url, keyring=keyring)
    rng = random.Random(7)
    model = ScriptedModel(lambda request, n: Message("assistant", words(rng, 60 + n % 40)))

    @app.step()
    def search(query: str) -> dict[str, Any]:
        return {"query": query, "hits": [words(rng, 25) for _ in range(3)]}

    @app.workflow(name="agent")
    def agent(ctx: cairn.Context, task: str) -> int:
        seen = 0
        for turn in range(turns):
            reply = ctx.model(model, [Message("user", f"{task} turn {turn}")]).message.text
            seen += len(search(reply[:60])["hits"])
        return seen

    return app


def disk_bytes(db: Path) -> int:
    """The database file's bytes once the WAL is folded in and free pages are returned."""
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return db.stat().st_size


def timed(store: Any, run_id: str) -> float:
    """Seconds of one ``store.history`` of ``run_id``."""
    started = time.perf_counter()
    store.history(run_id)
    return time.perf_counter() - started


def trigger_cost(steps: int, rounds: int) -> None:
    """What the trigger that freezes an archived run costs a journaled step
    (SQLite: a probe of ``run_archives`` per update of a run row):
    the same run on a database with them and one with them dropped,
    alternated round by round, CPU time per step, medians."""
    with fresh_dir("archive-triggers") as directory:
        apps = {}
        for name in ("with", "without"):
            app = cairn.App(db=f"sqlite:///{directory / name}.db")

            @app.step()
            def tick(i: int) -> int:
                return i

            @app.workflow(name="steps")
            def run_steps(ctx: cairn.Context, n: int) -> int:
                return sum(tick(i) for i in range(n))

            apps[name] = app
            if name == "without":
                with sqlite3.connect(directory / f"{name}.db") as conn:
                    conn.execute("DROP TRIGGER runs_archived_fixed")
        samples: dict[str, list[float]] = {"with": [], "without": []}
        for r in range(rounds):
            for name in (("with", "without") if r % 2 else ("without", "with")):
                settle()
                started = time.process_time()
                apps[name].run("steps", steps)
                samples[name].append((time.process_time() - started) / steps)
        for app in apps.values():
            app.close()
    with_, without = (statistics.median(samples[n]) * 1e6 for n in ("with", "without"))
    load = os.getloadavg()
    print(f"bench.archive triggers: {steps} steps x {rounds} rounds, SQLite; load average {load[0]:.1f}")
    print(f"  CPU per step: with the triggers {with_:.1f} us, without {without:.1f} us "
          f"(difference {with_ - without:+.1f} us, {with_ / without:.3f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--sealed", action="store_true")
    parser.add_argument("--triggers", action="store_true",
                        help="only the cost per step of the triggers that freeze archived runs")
    args = parser.parse_args()
    if args.triggers:
        trigger_cost(500, 15)
        return
    with fresh_dir("archive") as directory:
        db = directory / "cairn.db"
        app = build_app(f"sqlite:///{db}", args.turns, args.sealed)
        ids = []
        for i in range(args.runs):
            ids.append(f"run-{i:05d}")
            app.run("agent", f"task {i}", run_id=ids[-1], tenant=f"t{i % 4}")
        store: Any = app.store
        entries = sum(len(store.history(r)) for r in ids) / len(ids)
        before = disk_bytes(db)
        archived, hot = ids[::2], ids[1::2]
        records = [store.archive_run(r) for r in archived]
        after = disk_bytes(db)
        freed = (before - after) / len(archived)
        stored = statistics.mean(r.stored_bytes for r in records)
        files = [(directory / "cairn.db.artifacts" / r.ref[:2] / r.ref).stat() for r in records]
        on_disk = statistics.mean(f.st_size for f in files)
        allocated = statistics.mean(f.st_blocks * 512 for f in files)  # whole file-system blocks
        rows = statistics.mean(r.hot_bytes for r in records)

        cold, warm, hot_reads = [], [], []
        for i in range(args.reads):
            a, h = archived[i % len(archived)], hot[i % len(hot)]
            settle() if i % 50 == 0 else None
            hot_reads.append(timed(store, h))
            store._archive_cache().clear()
            cold.append(timed(store, a))
            warm.append(timed(store, a))
        app.close()
    load = os.getloadavg()
    mode = "sealed" if args.sealed else "plain"
    print(f"bench.archive: {args.runs} runs x {args.turns} turns ({entries:.0f} entries each), {mode}, "
          f"SQLite; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    print(f"  hot bytes per run (database after VACUUM, before - after, / {len(archived)} archived): "
          f"{freed:,.0f}")
    print(f"  archive object per run: {stored:,.0f} bytes ({on_disk:,.0f} in its file, {allocated:,.0f} "
          f"allocated in file-system blocks); rows encoded: {rows:,.0f}")
    print(f"  archived / hot: {stored / freed:.3f}x  (target <= 0.3x)")
    print(f"  database: {before:,} -> {after:,} bytes")
    ms = 1000.0
    print(f"  history read p50: hot {statistics.median(hot_reads) * ms:.2f} ms, "
          f"archived cold {statistics.median(cold) * ms:.2f} ms, warm {statistics.median(warm) * ms:.2f} ms "
          f"(p90 cold {statistics.quantiles(cold, n=10)[-1] * ms:.2f} ms; target p50 <= 50 ms)")


if __name__ == "__main__":
    main()
