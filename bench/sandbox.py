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
  the seccomp filter, rlimits, a pids and a memory cgroup, size-capped
  ``/tmp``, output captured in memory files);
* ``sandbox warm``: ``cairn.sandbox.pool.Pool.run`` handing the command to
  a sandbox launched ahead for the workspace (``Pool.prepare``, untimed,
  before each sample: what a worker's pool does between two commands of a
  run); its launch ahead is the ``warm ahead`` row, off the request path;
* ``sandbox+egress``: the same with an egress allowlist (the host proxy
  started and stopped, the in-sandbox relay: a Python interpreter).

Printed: the median and 90th percentile of each, and each one's overhead
over ``plain`` (the difference of medians, and the ratio); and the median
CPU time of each (this process's and its waited-for descendants', from
``getrusage``), which a loaded machine disturbs far less than the wall
clock: the wall clock of a chain of processes (launcher, bwrap, its init,
the command) waits on every hand-over for a CPU, while its CPU time is
what the launch costs. The load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from cairn.sandbox import Egress, Policy, check, run
from cairn.sandbox.pool import Pool

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
        pool = Pool(size=1, refill=False)

        def warm() -> object:
            result = pool.run(["/usr/bin/true"], ws)
            if not result.warm:
                raise SystemExit(f"the pooled sandbox was not ready: {pool.last_failure}")
            return result

        kinds: dict[str, Callable[[], object]] = {
            "plain": lambda: subprocess.run(["/usr/bin/true"], check=True),
            "bwrap bare": lambda: subprocess.run(["bwrap", "--unshare-all", "--ro-bind", "/", "/",
                                                  "/usr/bin/true"], check=True),
            "sandbox": lambda: run(["/usr/bin/true"], ws),
            "warm ahead": lambda: pool.prepare(ws),
            "sandbox warm": warm,
            "sandbox+egress": lambda: run(["/usr/bin/true"], ws, egress),
        }
        times: dict[str, list[float]] = {k: [] for k in kinds}
        cpu: dict[str, list[float]] = {k: [] for k in kinds}
        for fn in kinds.values():  # warm-up: the filter built, the controls checked, pages cached
            fn()
        load_before = os.getloadavg()[0]
        for _ in range(samples):
            for name, fn in kinds.items():
                cpu_before = _cpu()
                started = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - started) * 1000)
                cpu[name].append((_cpu() - cpu_before) * 1000)
        load_after = os.getloadavg()[0]
        pool.close()
    plain = statistics.median(times["plain"])
    plain_cpu = statistics.median(cpu["plain"])
    print(f"launch of /usr/bin/true, {samples} samples each, interleaved (ms); load average "
          f"{load_before:.1f} before, {load_after:.1f} after, {os.cpu_count()} CPUs")
    print(f"{'kind':<16}{'median':>9}{'p90':>9}{'overhead':>11}{'ratio':>8}{'cpu':>9}{'cpu over':>10}")
    for name, values in times.items():
        med = statistics.median(values)
        p90 = sorted(values)[int(len(values) * 0.9) - 1]
        used = statistics.median(cpu[name])
        print(f"{name:<16}{med:>9.2f}{p90:>9.2f}{med - plain:>+11.2f}{med / plain:>7.1f}x"
              f"{used:>9.2f}{used - plain_cpu:>+10.2f}")
    warm_overhead = statistics.median(times["sandbox warm"]) - plain
    print(f"warm (a sandbox launched ahead, handed the command): {warm_overhead:+.2f} ms wall over plain: "
          f"target <= {TARGET_MS:.0f} ms {'met' if warm_overhead <= TARGET_MS else 'NOT met'}")
    bare = statistics.median(times["bwrap bare"])
    print(f"sandbox / bwrap bare: {statistics.median(times['sandbox']) / bare:.2f}x (what Cairn adds to the "
          "namespaces: seccomp, rlimits, cgroups, binds, captured output)")
    overhead = statistics.median(times["sandbox"]) - plain
    verdict = "met" if overhead <= TARGET_MS else "NOT met"
    cpu_overhead = statistics.median(cpu["sandbox"]) - plain_cpu
    print(f"cold standard-tier overhead {overhead:.2f} ms wall, {cpu_overhead:.2f} ms CPU: target <= "
          f"{TARGET_MS:.0f} ms {verdict} (wall clock)")


def _cpu() -> float:
    """CPU seconds of this process and its waited-for descendants (bwrap
    reaps its own children, so the whole sandbox is counted)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


if __name__ == "__main__":
    main()
