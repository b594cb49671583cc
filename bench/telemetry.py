"""What telemetry costs a journaled step: ``python -m bench.telemetry``.

Three ways to run the same chain of steps (``app.run``, SQLite in a temp
directory), alternated round by round in one process so the machine's drift
hits each alike:

- ``off``: no observer (the default: ``engine.observe`` builds the plain
  ``Execution``; this is what must cost what the tree before telemetry did);
- ``api``: ``instrument(app)`` with the OpenTelemetry API's no-op providers
  (the ``otel`` extra installed, no SDK configured);
- ``sdk``: ``instrument(app)`` with the SDK, a span processor exporting to
  memory and a metric reader (the cost of live spans and metrics themselves).

``--chain N --mode off`` runs one chain of N steps and exits: under
``valgrind --tool=callgrind`` two chain lengths give instructions per step
(the difference over the difference in steps), which the machine's load does
not change; run it with ``PYTHONPATH=<other tree>/src`` to compare trees.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import cairn


def build(db: str, mode: str) -> tuple[cairn.App, Any]:
    app = cairn.App(db=db)

    @app.step
    def tick(i: int) -> int:
        return i

    @app.workflow(name="chain")
    def chain(ctx: cairn.Context, n: int) -> int:
        return sum(tick(i) for i in range(n))

    if mode == "api":
        from cairn.api.instrumentation import instrument

        instrument(app)
    elif mode == "sdk":
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from cairn.api.instrumentation import instrument

        exporter = InMemorySpanExporter()
        tracer = TracerProvider()
        tracer.add_span_processor(SimpleSpanProcessor(exporter))
        instrument(app, tracer, MeterProvider(metric_readers=[InMemoryMetricReader()]))
        app.exporter = exporter  # type: ignore[attr-defined]
    return app, chain


def per_step_us(app: cairn.App, chain: Any, steps: int) -> float:
    started = time.perf_counter()
    assert app.run(chain, steps) == sum(range(steps))
    elapsed = time.perf_counter() - started
    exporter = getattr(app, "exporter", None)
    if exporter is not None:
        exporter.clear()
    return elapsed / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chain", type=int, help="run one chain of this many steps and exit (for callgrind)")
    parser.add_argument("--mode", choices=["off", "api", "sdk"], default="off")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=9)
    opts = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="cairn-bench-otel-"))
    if opts.chain is not None:
        app, chain = build(f"sqlite:///{tmp}/one.db", opts.mode)
        app.run(chain, opts.chain)
        app.close()
        return
    modes = ("off", "api", "sdk")
    apps = {mode: build(f"sqlite:///{tmp}/{mode}.db", mode) for mode in modes}
    samples: dict[str, list[float]] = {mode: [] for mode in modes}
    for mode in modes:  # warm-up round, discarded
        per_step_us(*apps[mode], opts.steps)
    for _ in range(opts.rounds):
        for mode in modes:
            samples[mode].append(per_step_us(*apps[mode], opts.steps))
    for app, _ in apps.values():
        app.close()
    medians = {mode: statistics.median(values) for mode, values in samples.items()}
    print(json.dumps({
        "µs per step (median)": {m: round(v, 1) for m, v in medians.items()},
        "spread": {m: round((max(v) - min(v)) / medians[m], 2) for m, v in samples.items()},
        "api / off": round(medians["api"] / medians["off"], 2),
        "sdk / off": round(medians["sdk"] / medians["off"], 2),
    }, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
