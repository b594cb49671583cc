"""Encryption at rest: what sealing adds per journaled step and to 3-step runs/s.

    python -m bench.encryption            # SQLite, rounds alternating on/off
    python -m bench.encryption --quick

One embedded App per mode on its own SQLite file (durability ``process``);
the modes alternate round by round so drift hits both alike. Each figure is
given as wall time and as this process's CPU time (``time.process_time``):
on a shared, loaded machine the wall figures are mostly other processes'
noise, the CPU figures what encryption itself adds. Per-step cost:
a run of ``STEPS`` steps each returning a payload of the given size, its
wall time over ``STEPS`` (median of the rounds); the same with encryption
off gives the added cost. Runs/s: 3-step runs of 100-byte results, back to
back. Figures only: no assertion (tests/ holds none on time either).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import cairn
from cairn.security.keyring import LocalKeyring

STEPS = 200


def make(path: Path, sealed: bool) -> tuple[cairn.App, Any, Any]:
    ring = LocalKeyring({"k1": os.urandom(32)}, "k1") if sealed else None
    app = cairn.App(db=f"sqlite:///{path}", keyring=ring)

    @app.step()
    def produce(size: int, i: int) -> str:
        return "x" * size

    @app.workflow(name="steps")
    def steps(ctx: cairn.Context, size: int, count: int) -> int:
        for i in range(count):
            produce(size, i)
        return count

    @app.workflow(name="three")
    def three(ctx: cairn.Context) -> int:
        for i in range(3):
            produce(100, i)
        return 3

    return app, steps, three


def seal_cost(app: cairn.App, size: int, count: int = 20000) -> tuple[float, float]:
    """Median microseconds to seal, and to open, one step's entry of ``size``
    bytes in ``app``'s sealed store (the CPU the store adds, without the
    database's noise): medians of 9 batches of ``count // 9``."""
    from cairn.store.records import EventType, HistoryEvent, Payload

    store: Any = app.store
    run = app.start("three")
    event = HistoryEvent(run.run_id, 5, EventType.STEP_COMPLETED, 0.0, 1, "w", 3, "step", "produce", "h", 1,
                         0.0, Payload(os.urandom(size // 2).hex().encode()), None)
    tenant = "default"
    sealed = store._seal_event(tenant, event)
    batch = count // 9
    seal_times, open_times = [], []
    for _ in range(9):
        started = time.process_time()
        for _ in range(batch):
            store._seal_event(tenant, event)
        seal_times.append((time.process_time() - started) / batch * 1e6)
        started = time.process_time()
        for _ in range(batch):
            store._open_event(tenant, sealed)
        open_times.append((time.process_time() - started) / batch * 1e6)
    return statistics.median(seal_times), statistics.median(open_times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rounds = 3 if args.quick else 15
    sizes = (100, 1024, 4096)
    work = Path(tempfile.mkdtemp(prefix="cairn-bench-enc-"))
    apps = {mode: make(work / f"{mode}.db", mode == "on") for mode in ("off", "on")}
    per_step: dict[tuple[str, int], list[float]] = {}
    cpu_step: dict[tuple[str, int], list[float]] = {}
    runs_per_s: dict[str, list[float]] = {}
    cpu_runs_per_s: dict[str, list[float]] = {}
    for _ in range(rounds):
        for mode, (app, steps, three) in apps.items():
            for size in sizes:
                started, cpu = time.perf_counter(), time.process_time()
                app.run(steps, size, STEPS)
                per_step.setdefault((mode, size), []).append((time.perf_counter() - started) / STEPS * 1e6)
                cpu_step.setdefault((mode, size), []).append((time.process_time() - cpu) / STEPS * 1e6)
            count = 50 if args.quick else 200
            started, cpu = time.perf_counter(), time.process_time()
            for _ in range(count):
                app.run(three)
            runs_per_s.setdefault(mode, []).append(count / (time.perf_counter() - started))
            cpu_runs_per_s.setdefault(mode, []).append(count / (time.process_time() - cpu))
    print(f"per journaled step (median of {rounds} rounds of {STEPS} steps), SQLite:")
    for size in sizes:
        off = statistics.median(per_step[("off", size)])
        on = statistics.median(per_step[("on", size)])
        c_off = statistics.median(cpu_step[("off", size)])
        c_on = statistics.median(cpu_step[("on", size)])
        print(f"  payload {size:>5} B: wall off {off:7.1f} us  on {on:7.1f} us  added {on - off:+6.1f} us | "
              f"CPU off {c_off:7.1f} us  on {c_on:7.1f} us  added {c_on - c_off:+6.1f} us")
    off_r, on_r = statistics.median(runs_per_s["off"]), statistics.median(runs_per_s["on"])
    print(f"3-step runs/s: off {off_r:7.1f}  on {on_r:7.1f}  ({(on_r / off_r - 1) * 100:+.1f} %)")
    c_off_r, c_on_r = statistics.median(cpu_runs_per_s["off"]), statistics.median(cpu_runs_per_s["on"])
    change = (c_on_r / c_off_r - 1) * 100
    print(f"3-step runs per CPU second: off {c_off_r:7.1f}  on {c_on_r:7.1f}  ({change:+.1f} %)")
    print("sealing alone, CPU (an entry's payload of random hex, in process, no database):")
    for size in sizes:
        sealing, opening = seal_cost(apps["on"][0], size)
        print(f"  payload {size:>5} B: seal {sealing:5.1f} us  open {opening:5.1f} us")
    for app, _, _ in apps.values():
        app.close()


if __name__ == "__main__":
    main()
