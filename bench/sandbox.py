"""Sandbox launch overhead (issue 27: <= 10 ms, standard tier), side by
side with a plain subprocess, in one run.

    python -m bench.sandbox            # 40 samples of each, interleaved
    python -m bench.sandbox --quick    # 10 samples

Each sample runs ``/usr/bin/true`` (nothing to do: the time is the launch)
and waits for it. The kinds, interleaved sample by sample so that the
machine's load falls on all of them alike:

* ``plain``: ``subprocess.run(["/usr/bin/true"])``;
* ``bwrap bare``: ``bwrap --unshare-all --ro-bind / /`` around it (the
  namespaces alone, what the issue's 4-5 ms was measured with);
* ``sandbox``: ``cairn.sandbox.run`` (the standard tier: every namespace,
  the seccomp filter, prlimit, a pids cgroup, size-capped ``/tmp``, output
  captured in files);
* ``sandbox+egress``: the same with an egress allowlist (the host proxy
  started and stopped, the in-sandbox relay: a Python interpreter).

Printed: the median and 90th percentile of each, and each one's overhead
over ``plain`` (the difference of medians, and the ratio).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from cairn.sandbox import Egress, Policy, check, run

TARGET_MS = 10.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    samples = 10 if args.quick else 40
    missing = [c.name for c in check() if not c.available]
    if missing:
        raise SystemExit(f"sandbox controls missing on this host: {', '.join(missing)} (cairn sandbox check)")
    with tempfile.TemporaryDirectory(prefix="cairn-bench-sandbox-") as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        egress = Policy(egress=Egress(hosts=("example.com",)))
        kinds: dict[str, Callable[[], object]] = {
            "plain": lambda: subprocess.run(["/usr/bin/true"], check=True),
            "bwrap bare": lambda: subprocess.run(["bwrap", "--unshare-all", "--ro-bind", "/", "/",
                                                  "/usr/bin/true"], check=True),
            "sandbox": lambda: run(["/usr/bin/true"], ws),
            "sandbox+egress": lambda: run(["/usr/bin/true"], ws, egress),
        }
        times: dict[str, list[float]] = {k: [] for k in kinds}
        for fn in kinds.values():  # warm-up: the filter built, the controls checked, pages cached
            fn()
        for _ in range(samples):
            for name, fn in kinds.items():
                started = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - started) * 1000)
    plain = statistics.median(times["plain"])
    print(f"launch of /usr/bin/true, {samples} samples each, interleaved (ms)")
    print(f"{'kind':<16}{'median':>9}{'p90':>9}{'overhead':>11}{'ratio':>8}")
    for name, values in times.items():
        med = statistics.median(values)
        p90 = sorted(values)[int(len(values) * 0.9) - 1]
        print(f"{name:<16}{med:>9.2f}{p90:>9.2f}{med - plain:>+11.2f}{med / plain:>7.1f}x")
    bare = statistics.median(times["bwrap bare"])
    print(f"sandbox / bwrap bare: {statistics.median(times['sandbox']) / bare:.2f}x (what Cairn adds to the "
          "namespaces: seccomp, prlimit, cgroup, binds, captured output)")
    overhead = statistics.median(times["sandbox"]) - plain
    verdict = "met" if overhead <= TARGET_MS else "NOT met"
    print(f"standard-tier overhead {overhead:.2f} ms: target <= {TARGET_MS:.0f} ms {verdict}")


if __name__ == "__main__":
    main()
