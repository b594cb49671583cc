"""A step with one memory write vs a plain step, on SQLite (issue 14).

    python -m bench.memory            # 2,000 steps per sample, 7 samples each, interleaved
    python -m bench.memory --quick    # 500 steps, 3 samples

Three workflows of ``n`` steps run inline in one process, each on a fresh
SQLite file, their samples interleaved (plain, item, run, plain, ...) so
drift of the machine hits all of them alike:

* **plain**: the step returns ``x + 1`` (the engine benchmark's ``chain``);
* **item write**: the step also puts one long-term item
  (``step_info().memory.put(("bench",), key, x)``), committed in the step's
  journal transaction (``Store.append_memory``);
* **run write**: the step puts one key of its run memory instead.

Per-step µs is the sample's wall time over ``n``, and its CPU time (this
process's, ``time.process_time``: on a loaded machine wall time mostly
measures the other processes); the figure is the median sample, and the
ratios are against the plain step of the same run. The
issue's target: a step with one memory write costs at most 1.2x a plain one.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from pathlib import Path

import cairn


def _app(path: Path) -> tuple[cairn.App, dict[str, cairn.Workflow[int]]]:
    app = cairn.App(db=f"sqlite:///{path}")

    @app.step()
    def inc(x: int) -> int:
        return x + 1

    @app.step()
    def inc_item(x: int) -> int:
        cairn.step_info().memory.put(("bench",), f"k{x}", x)
        return x + 1

    @app.step()
    def inc_run(x: int) -> int:
        cairn.step_info().memory.run.put(f"k{x}", x)
        return x + 1

    def chain_of(step: cairn.Step[[int], int], name: str) -> cairn.Workflow[int]:
        @app.workflow(name=name)
        def chain(ctx: cairn.Context, n: int) -> int:
            x = 0
            for _ in range(n):
                x = step(x)
            return x

        return chain

    return app, {"plain": chain_of(inc, "plain"), "item write": chain_of(inc_item, "item"),
                 "run write": chain_of(inc_run, "run")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    steps, repeats = (500, 3) if args.quick else (2000, 7)
    samples: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="cairn-bench-memory-") as tmp:
        apps = {}
        for name in ("plain", "item write", "run write"):
            apps[name] = _app(Path(tmp) / f"{name.replace(' ', '_')}.db")
        for name, (app, flows) in apps.items():
            app.run(flows[name], 50)  # warm up: connections, statements, caches
        for _ in range(repeats):
            for name, (app, flows) in apps.items():
                gc.collect()
                started, cpu_started = time.perf_counter(), time.process_time()
                assert app.run(flows[name], steps) == steps
                samples.setdefault(name, []).append((time.perf_counter() - started) / steps * 1e6)
                cpu.setdefault(name, []).append((time.process_time() - cpu_started) / steps * 1e6)
        for app, _ in apps.values():
            app.close()
    plain, plain_cpu = statistics.median(samples["plain"]), statistics.median(cpu["plain"])
    print(f"{'workflow':<12} {'wall µs':>9} {'min':>8} {'ratio':>7} {'cpu µs':>9} {'ratio':>7}"
          f"   ({steps} steps x {repeats})")
    for name, values in samples.items():
        median, median_cpu = statistics.median(values), statistics.median(cpu[name])
        print(f"{name:<12} {median:>9.1f} {min(values):>8.1f} {median / plain:>6.2f}x {median_cpu:>9.1f} "
              f"{median_cpu / plain_cpu:>6.2f}x")


if __name__ == "__main__":
    main()
