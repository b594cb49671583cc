"""Launch overhead of the gVisor tier (``Policy(tier="gvisor")``) beside
the standard tier and a plain subprocess, in one run, interleaved sample
by sample so the machine's load falls on all alike.

    python -m bench.sandbox_gvisor            # 10 samples of each

Each sample runs ``/usr/bin/true`` and waits for it. Printed: the median
and 90th percentile of each, its ratio to ``plain`` and to the standard
tier, and the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable

from cairn.sandbox import Policy, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as ws:
        kinds: dict[str, Callable[[], object]] = {
            "plain": lambda: subprocess.run(["/usr/bin/true"], check=True),
            "standard": lambda: run(["/usr/bin/true"], ws),
            "gvisor": lambda: run(["/usr/bin/true"], ws, Policy(tier="gvisor")),
        }
        for launch in kinds.values():  # warm-up, untimed
            launch()
        times: dict[str, list[float]] = {name: [] for name in kinds}
        load_before = os.getloadavg()[0]
        for _ in range(args.samples):
            for name, launch in kinds.items():
                started = time.perf_counter()
                launch()
                times[name].append(time.perf_counter() - started)
        load_after = os.getloadavg()[0]
    median = {name: statistics.median(t) for name, t in times.items()}
    print(f"{args.samples} samples each; load average {load_before:.2f} -> {load_after:.2f}")
    for name, t in times.items():
        p90 = sorted(t)[max(0, int(len(t) * 0.9) - 1)]
        to_plain, to_standard = median[name] / median["plain"], median[name] / median["standard"]
        print(f"{name:9} median {median[name] * 1000:7.1f} ms  p90 {p90 * 1000:7.1f} ms  "
              f"x{to_plain:6.1f} plain  x{to_standard:5.1f} standard")


if __name__ == "__main__":
    main()
