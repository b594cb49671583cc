"""Bundle pinning and replay checks (issue 12), measured side by side.

``python -m bench.bundles [--quick]`` prints, on SQLite in one run:

* µs per journaled step of a 300-step run pinned to its bundle (every run
  created by ``app.run`` records one) against the same run created without
  a bundle (as runs older than bundles are): the per-step path is the same
  code, so the ratio should be 1 within the noise; alternated, median of N;
* 3-step runs per second, pinned against unpinned (a run's start computes
  nothing new: the bundle id is cached per process);
* milliseconds for a dry-run replay check of a 1,000-step journal (target:
  at most 100 ms).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import cairn


def _app(directory: Path) -> tuple[cairn.App, Any, Any]:
    app = cairn.App(db=f"sqlite:///{directory}/cairn.db")

    @app.step
    def inc(x: int) -> int:
        return x + 1

    @app.workflow(name="chain")
    def chain(ctx: cairn.Context, n: int) -> int:
        total = 0
        for _ in range(n):
            total = inc(total)
        return total

    @app.workflow(name="three")
    def three(ctx: cairn.Context) -> int:
        return inc(inc(inc(0)))

    return app, chain, three


def _run(app: cairn.App, workflow: str, arguments: dict[str, Any], pinned: bool) -> None:
    definition = app.definition(workflow)
    new = app._new_run(definition, arguments, None, None, "default", "default", 0)
    if not pinned:
        new = dataclasses.replace(new, bundle=None)
    claim = app.store.create_claimed_run(new, app._inline_id, app.lease_seconds)
    app._drive(new.run_id, claim)


def step_us(steps: int, pinned: bool) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        app, _, _ = _app(Path(tmp))
        try:
            _run(app, "chain", {"n": 1}, pinned)  # warm-up
            started = time.perf_counter()
            _run(app, "chain", {"n": steps}, pinned)
            return (time.perf_counter() - started) / steps * 1e6
        finally:
            app.close()


def runs_per_second(runs: int, pinned: bool) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        app, _, _ = _app(Path(tmp))
        try:
            _run(app, "three", {}, pinned)
            started = time.perf_counter()
            for _ in range(runs):
                _run(app, "three", {}, pinned)
            return runs / (time.perf_counter() - started)
        finally:
            app.close()


def replay_check_ms(steps: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        app, _, _ = _app(Path(tmp))
        try:
            app.run("chain", steps)
            [run] = app.list_runs(workflow="chain")
            app.replay_check(run.run_id)  # warm-up (bundle computed, code loaded)
            started = time.perf_counter()
            report = app.replay_check(run.run_id)
            elapsed = (time.perf_counter() - started) * 1e3
            if not (report.compatible and report.replayed == steps):
                raise RuntimeError(f"unexpected replay check: {report}")
            return elapsed
        finally:
            app.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats
    steps, runs = (100, 100) if args.quick else (300, 300)
    pinned: dict[str, list[float]] = {"step": [], "runs": []}
    unpinned: dict[str, list[float]] = {"step": [], "runs": []}
    for _ in range(repeats):  # alternated, so drift in the machine's load hits both alike
        unpinned["step"].append(step_us(steps, False))
        pinned["step"].append(step_us(steps, True))
        unpinned["runs"].append(runs_per_second(runs, False))
        pinned["runs"].append(runs_per_second(runs, True))
    checks = [replay_check_ms(1000) for _ in range(repeats)]
    med = statistics.median
    print(f"{'figure':<44}{'unpinned':>12}{'pinned':>12}{'ratio':>8}")
    for name, label in (("step", "µs per journaled step (300-step run)"), ("runs", "3-step runs per second")):
        a, b = med(unpinned[name]), med(pinned[name])
        print(f"{label:<44}{a:>12.1f}{b:>12.1f}{b / a:>8.2f}")
        print(f"{'  samples':<44}{' '.join(f'{v:.0f}' for v in unpinned[name]):>12}  "
              f"{' '.join(f'{v:.0f}' for v in pinned[name])}")
    print(f"{'replay check, 1,000-step journal, ms':<44}{med(checks):>24.1f}   (target <= 100; samples "
          f"{' '.join(f'{v:.0f}' for v in checks)})")


if __name__ == "__main__":
    main()
