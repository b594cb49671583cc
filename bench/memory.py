"""A step with one memory write vs a plain step, on SQLite (issue 14).

    python -m bench.memory            # 2,000 steps per sample, 7 samples each, interleaved
    python -m bench.memory --quick    # 500 steps, 3 samples
    python -m bench.memory --floor    # ...and the bare-SQLite floor of the extra row

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

``--floor`` also times the SQL alone on the same schema, with no Cairn code:
a plain step's commit is one autocommitted history row; a step with a write
is that row and the memory row (the statements the store runs, positional
parameters, one ``BEGIN IMMEDIATE ... COMMIT``). Its ratios bound what any
Python on top can reach: the B-trees the extra row writes (item: the table,
its primary key index, the run index; run memory: one WITHOUT ROWID tree)
and the second statement's execution.
"""

from __future__ import annotations

import argparse
import gc
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import cairn
from cairn.store.sqlite import SQLiteStore

_HISTORY = ("INSERT INTO history (run_id, seq, event, at, epoch, worker, position, step_kind, name, "
            "input_hash, attempt, started_at, payload, payload_ref, detail, tenant) "
            "VALUES (?, ?, 'step.completed', ?, 1, 'w', ?, 'step', 'inc', 'h', 1, ?, ?, NULL, NULL, "
            "'default')")
_ITEM = ("INSERT INTO memory_items (tenant, namespace, key, value, value_ref, metadata, index_text, "
         "version, created_at, updated_at, accessed_at, ttl, expires_at, run_id, position, operation_id, "
         "actor, tier) "
         "VALUES ('default', 'bench\x1f', ?, ?, NULL, NULL, NULL, 1, ?, ?, ?, NULL, NULL, ?, ?, ?, NULL, "
         "'hot') ON CONFLICT (tenant, namespace, key) DO UPDATE SET value = excluded.value, "
         "version = memory_items.version + 1 RETURNING version")
_RUN = ("INSERT INTO memory_run (run_id, key, tenant, value, value_ref, version, created_at, updated_at, "
        "position, operation_id, actor) VALUES (?, ?, 'default', ?, NULL, 1, ?, ?, ?, ?, NULL) "
        "ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value, version = memory_run.version + 1 "
        "RETURNING version")


def _floor(path: Path, steps: int, kind: str) -> float:
    """CPU µs per step of the SQL alone (see the module doc)."""
    SQLiteStore(path).close()  # the schema, by the store's migrations
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    run = f"r-{kind}"
    started = time.process_time()
    for seq in range(1, steps + 1):
        now = time.time()
        history = (run, seq, now, seq, now, str(seq).encode())
        if kind == "plain":
            conn.execute(_HISTORY, history)
            continue
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(_HISTORY, history)
        if kind == "item write":
            item = (f"k{seq}", str(seq).encode(), now, now, now, run, seq, f"op{seq}")
            conn.execute(_ITEM, item).fetchall()
        else:
            conn.execute(_RUN, (run, f"k{seq}", str(seq).encode(), now, now, seq, f"op{seq}")).fetchall()
        conn.execute("COMMIT")
    elapsed = time.process_time() - started
    conn.close()
    return elapsed / steps * 1e6


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
    parser.add_argument("--floor", action="store_true", help="also time the bare SQL (no Cairn code)")
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
        floors: dict[str, list[float]] = {}
        for i in range(repeats if args.floor else 0):
            for name in ("plain", "item write", "run write"):
                gc.collect()
                db = Path(tmp) / f"floor_{i}_{name.replace(' ', '_')}.db"
                floors.setdefault(name, []).append(_floor(db, steps * 4, name))
    plain, plain_cpu = statistics.median(samples["plain"]), statistics.median(cpu["plain"])
    print(f"{'workflow':<12} {'wall µs':>9} {'min':>8} {'ratio':>7} {'cpu µs':>9} {'ratio':>7}"
          f"   ({steps} steps x {repeats})")
    for name, values in samples.items():
        median, median_cpu = statistics.median(values), statistics.median(cpu[name])
        print(f"{name:<12} {median:>9.1f} {min(values):>8.1f} {median / plain:>6.2f}x {median_cpu:>9.1f} "
              f"{median_cpu / plain_cpu:>6.2f}x")
    if floors:
        bare = statistics.median(floors["plain"])
        print(f"bare SQL (cpu µs, median of {repeats} x {steps * 4} steps; the floor of the ratios above):")
        for name, values in floors.items():
            median = statistics.median(values)
            print(f"{name:<12} {median:>9.1f} {median / bare:>6.2f}x   (+{median - bare:.1f} µs)")


if __name__ == "__main__":
    main()
