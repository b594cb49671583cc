"""What the retention controller costs (issue 26 part 3), against ``cairn
prune`` on the same runs, in one process, on SQLite.

    python -m bench.retention [--runs 300] [--rounds 5]

Three ways of deleting the same ``--runs`` finished runs (each a few steps,
one artifact, run memory), on identical fresh databases, alternated round
by round so drift hits all alike; medians of ``--rounds`` of CPU time
(``time.process_time``: SQLite works in this process) per run deleted:

* ``prune before``: ``prune_runs`` with one cutoff, without the per-run
  deletion record this branch adds (its statement swapped for a no-op): the
  baseline, what ``cairn prune`` cost before;
* ``prune``: the same call as shipped (with the record);
* ``policy pass``: a controller pass with a ``history`` policy (per-run
  cutoffs by tenant and workflow, the lease renewed and the fence checked
  before every batch of 500).

Also: the side loop's cost when no policy exists (one read of the policies
per period, no write), per pass.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import cairn
from bench.common import fresh_dir, settle
from cairn.store import sqlite
from cairn.store.retention import DataClass, policy
from cairn.worker.retention import Controller


def populate(path: Path, runs: int) -> cairn.App:
    app = cairn.App(db=f"sqlite:///{path}", inline_limit=256)

    @app.step()
    def big(n: int) -> str:
        return f"{n} " + "z" * 1000

    @app.workflow(name="job")
    def job(ctx: cairn.Context, n: int) -> int:
        big(n)
        ctx.memory.run.put("scratch", n)
        return n

    for n in range(runs):
        app.run(job, n, tenant=f"t{n % 2}", run_id=f"r{n}")
    # stored for every way (outside the timed part); only the policy pass reads it
    app.store.set_retention_policy(policy(None, None, "history", 0), "bench")
    return app


def by_prune(app: cairn.App, before: bool) -> int:
    kept = sqlite._Q["record_deleted_runs"]
    if before:
        sqlite._Q["record_deleted_runs"] = "SELECT :run_ids, :now, :actor"
    try:
        total = 0
        while pruned := app.store.prune_runs(app.store.clock() + 1, None, 500):
            total += pruned
        return total
    finally:
        sqlite._Q["record_deleted_runs"] = kept


def by_policy(app: cairn.App) -> int:
    app.store.clock = lambda: time.time() + 1  # every run finished before now - 0 s
    done = Controller(app.store, "bench", batch=500).run()
    assert done is not None
    return done.count(DataClass.HISTORY)


def measure(runs: int, rounds: int) -> dict[str, list[float]]:
    ways: dict[str, Callable[[cairn.App], int]] = {
        "prune before": lambda app: by_prune(app, True),
        "prune": lambda app: by_prune(app, False),
        "policy pass": by_policy,
    }
    samples: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, way in ways.items():
            with fresh_dir("retention") as where:
                app = populate(where / "cairn.db", runs)
                settle()
                start = time.process_time()
                deleted = way(app)
                spent = time.process_time() - start
                app.close()
            assert deleted == runs, (name, deleted)
            samples[name].append(spent / runs * 1e6)
    return samples


def idle_pass(passes: int = 200) -> float:
    """CPU microseconds of a side-loop pass with no policy (one read)."""
    with fresh_dir("retention-idle") as where:
        app = cairn.App(db=f"sqlite:///{where / 'cairn.db'}")
        controller = Controller(app.store, "idle")
        controller.run()
        start = time.process_time()
        for _ in range(passes):
            controller.run()
        spent = time.process_time() - start
        app.close()
    return spent / passes * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average {load}; {args.runs} runs, {args.rounds} rounds")
    samples = measure(args.runs, args.rounds)
    base = statistics.median(samples["prune before"])
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"{name:<13} {median:8.1f} us CPU per run deleted (x{median / base:.2f} of prune before; "
              f"samples {', '.join(f'{v:.0f}' for v in values)})")
    print(f"idle pass (no policy): {idle_pass():.1f} us CPU")


if __name__ == "__main__":
    main()
