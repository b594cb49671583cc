"""Two source trees side by side in one run: ``python -m bench.sidebyside BEFORE AFTER``.

On this shared 2-core machine two benchmark runs taken one after the other
differ by more than most changes do. Here one parent starts a child process
per tree (``PYTHONPATH=<tree>/src``), and in each round measures the floors
(bare sqlite step, one fsync) itself and then asks each child, in turn and in
alternating order, for the same workloads: 300 three-step ``app.run``s, one
300-step chain, one 50-call ``write`` tool loop. The medians of the rounds
share the machine's drift, so their ratio means something where two separate
runs' would not.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import baselines

WORKLOADS = (("runs", 300), ("chain", 300), ("write", 50))


def child() -> int:
    """Serve workload requests (``KIND N`` per line) on stdin; print one figure per line."""
    from bench.cairn_workloads import build

    w = build(Path(tempfile.mkdtemp()) / "cairn.sqlite")
    app = w.app
    app.run(w.three)
    app.run(w.chain, 5)
    app.run(w.writes, 5)
    for line in sys.stdin:
        kind, size = line.split()
        n = int(size)
        start = time.perf_counter()
        if kind == "runs":
            for _ in range(n):
                app.run(w.three)
            print(n / (time.perf_counter() - start), flush=True)  # runs/s
        else:
            app.run(w.chain if kind == "chain" else w.writes, n)
            print((time.perf_counter() - start) / n * 1e6, flush=True)  # µs per step / call
    w.close()
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs=2, help="the source trees to compare (each holds src/cairn)")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    kids: dict[str, subprocess.Popen[str]] = {}
    for tree in args.trees:
        root = Path(tree).resolve()
        here = Path(__file__).resolve().parent.parent  # this bench/, whatever the tree compared
        env = dict(os.environ, PYTHONPATH=f"{root / 'src'}{os.pathsep}{here}")
        kids[str(root)] = subprocess.Popen([sys.executable, "-m", "bench.sidebyside", "--child"], env=env,
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(tree: str, kind: str, n: int) -> float:
        kid = kids[tree]
        assert kid.stdin is not None
        assert kid.stdout is not None
        kid.stdin.write(f"{kind} {n}\n")
        kid.stdin.flush()
        return float(kid.stdout.readline())

    samples: dict[str, list[float]] = {}
    trees = list(kids)
    for round_ in range(args.rounds):
        samples.setdefault("floor", []).append(baselines.bare_sqlite_step_us(iterations=500))
        samples.setdefault("fsync", []).append(baselines.fsync_cost_us(samples=50))
        for tree in trees if round_ % 2 == 0 else trees[::-1]:
            for kind, n in WORKLOADS:
                samples.setdefault(f"{kind} {tree}", []).append(ask(tree, kind, n))
    for kid in kids.values():
        assert kid.stdin is not None
        kid.stdin.close()
        kid.wait()
    med = {key: statistics.median(values) for key, values in samples.items()}
    for key, values in samples.items():
        print(f"{key}: median {med[key]:,.1f}, spread {(max(values) - min(values)) / med[key] * 100:.0f}%")
    for tree in trees:
        write = med[f"write {tree}"] - med["fsync"]
        print(f"{tree}: step / floor {med[f'chain {tree}'] / med['floor']:.2f}x, "
              f"runs/s {med[f'runs {tree}']:,.0f}, write - fsync {write:,.0f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(child() if sys.argv[1:] == ["--child"] else main(sys.argv[1:]))
