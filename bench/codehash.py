"""What computing the bundles costs a fresh process: ``python -m bench.codehash [TREE ...]``.

A worker (or a resume in a new process) computes the code hash of every
workflow it registers before it can serve a run (``Registry.local``). Each
sample is a new Python process that builds ``bench.cairn_workloads``' app
(five workflows) and times ``app.runtime.registry.local()``; the parent
alternates the source trees given (``PYTHONPATH=<tree>/src:<tree>``; default:
this one) sample by sample, so they share the machine's drift. Each tree is
measured with the code-hash cache switched off (``CAIRN_CODE_CACHE=off``),
and, where the tree has the cache (``cairn/engine/codecache.py``), cold (an
empty cache directory per sample) and warm (one directory the first sample
filled). Medians of ``--samples`` per cell, in ms.

``--resume N`` times instead ``bench.engine.cairn_resume_ms`` (resume of a
SIGKILLed run, the call to the next new step: ``python -m bench.engine``'s
``resume ms``), N samples per tree, in one long-lived child process per
tree (as in ``bench.engine``: a new app per sample, the cache warm after the
first), the trees alternated sample by sample.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import sys, tempfile, time
from pathlib import Path
from bench import cairn_workloads
w = cairn_workloads.build(Path(tempfile.mkdtemp()) / "cairn.sqlite")
start = time.perf_counter()
w.app.runtime.registry.local()
print((time.perf_counter() - start) * 1e3)
w.close()
"""


def sample(tree: Path, mode: str, warm_dir: Path) -> float:
    """One fresh process's ``Registry.local()`` in ms."""
    env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}{os.pathsep}{tree}"}
    if mode == "off":
        env["CAIRN_CODE_CACHE"] = "off"
    else:
        env.pop("CAIRN_CODE_CACHE", None)
        env["XDG_CACHE_HOME"] = str(warm_dir if mode == "warm" else tempfile.mkdtemp(prefix="codehash-cold-"))
    child = subprocess.run([sys.executable, "-c", CHILD], cwd=tree, env=env, capture_output=True, text=True,
                           timeout=120, check=False)
    if child.returncode != 0:
        raise RuntimeError(f"{tree}: {child.stderr.strip()[-800:]}")
    return float(child.stdout.strip().splitlines()[-1])


RESUME_CHILD = """
import sys
from bench import engine
engine.cairn_resume_ms()  # warm-up, as bench.engine's warm-up round
for line in sys.stdin:
    print(engine.cairn_resume_ms(), flush=True)
"""


def resume(trees: list[Path], samples: int) -> None:
    """Alternated resume samples of each tree, one child process per tree."""
    cache = tempfile.mkdtemp(prefix="codehash-resume-")
    children = {}
    for tree in trees:
        env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}{os.pathsep}{tree}", "XDG_CACHE_HOME": cache}
        children[tree] = subprocess.Popen([sys.executable, "-c", RESUME_CHILD], cwd=tree, env=env, text=True,
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    figures: dict[Path, list[float]] = {tree: [] for tree in trees}
    try:
        for i in range(samples):
            for tree in trees if i % 2 == 0 else reversed(trees):
                child = children[tree]
                assert child.stdin is not None
                assert child.stdout is not None
                child.stdin.write("go\n")
                child.stdin.flush()
                figures[tree].append(float(child.stdout.readline()))
    finally:
        for child in children.values():
            if child.stdin is not None:
                child.stdin.close()
            child.wait(timeout=60)
    print(f"resume ms (bench.engine.cairn_resume_ms), median of {samples}, alternated:")
    for tree, values in figures.items():
        ordered = sorted(values)
        print(f"  {tree!s:40} {statistics.median(values):7.2f}  (quartiles {ordered[len(ordered) // 4]:.2f}-"
              f"{ordered[3 * len(ordered) // 4]:.2f}; {min(values):.2f}-{max(values):.2f})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs="*", type=Path, help="source trees (default: this one)")
    parser.add_argument("--samples", type=int, default=9, help="fresh processes per cell (default 9)")
    parser.add_argument("--resume", type=int, metavar="N", help="time N resumes per tree instead")
    args = parser.parse_args(argv)
    trees = [t.resolve() for t in args.trees] or [Path(__file__).resolve().parent.parent]
    if args.resume:
        resume(trees, args.resume)
        return 0
    cells: dict[tuple[Path, str], list[float]] = {}
    warm = {tree: Path(tempfile.mkdtemp(prefix="codehash-warm-")) for tree in trees}
    for tree in trees:
        if (tree / "src/cairn/engine/codecache.py").exists():
            sample(tree, "warm", warm[tree])  # fill the warm directory
    for i in range(args.samples):
        for tree in trees if i % 2 == 0 else reversed(trees):
            has_cache = (tree / "src/cairn/engine/codecache.py").exists()
            for mode in ("off", "cold", "warm") if has_cache else ("off",):
                cells.setdefault((tree, mode), []).append(sample(tree, mode, warm[tree]))
    print(f"Registry.local() of bench.cairn_workloads (5 workflows) in a fresh process, ms, "
          f"median of {args.samples}:")
    for (tree, mode), values in cells.items():
        print(f"  {tree!s:40} cache {mode:4}  {statistics.median(values):7.2f}  "
              f"({min(values):.2f}-{max(values):.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
