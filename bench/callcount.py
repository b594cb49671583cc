"""Instructions per journaled call, counted by callgrind: ``python -m bench.callcount``.

    python -m bench.callcount write               # this tree, 20 and 120 write-tool calls
    python -m bench.callcount step --tree ../main  # another tree (its src/ on PYTHONPATH)
    python -m bench.callcount write --sizes 20 220

Wall clock on this shared 2-core machine moves by more than most changes to
the engine do; an instruction count does not. For each of two sizes this
runs one process under ``valgrind --tool=callgrind --instr-atstart=no``: the
child builds the benchmark app (``bench.cairn_workloads``), runs a warm-up
run, turns WAL auto-checkpoints off and freezes and disables the garbage
collector (otherwise a checkpoint or a collection falling into one size and
not the other moved the count by up to 40 %), then waits until the parent has
switched instrumentation on (``callgrind_control -i on``) and runs the
measured workflow. The difference of the two totals over the difference of
the sizes is the cost of one call: start-up, the run's creation and its end
cancel out. Interpreter start-up is not instrumented at all, which is what
makes a count take minutes rather than a quarter of an hour.

``KIND`` is ``step`` (a chain of steps), ``read`` or ``write`` (a loop of
tool calls; the fsync is the kernel's and not counted) or ``three`` (that
many 3-step runs, each ``app.run``: instructions per run).

``url`` (``count``'s, ``--url`` of the child) runs the child on that
PostgreSQL database instead of a fresh SQLite file: what is counted is then
the client's side of each call (psycopg, libpq, the store), not the
server's. Its runs are leased for an hour, so the lease thread's renewal (a
round trip every ``lease_seconds / 3`` of wall time, which valgrind
stretches) does not fall into one window and not the other.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KINDS = ("step", "read", "write", "three")


def child(kind: str, n: int, signal_path: str, chain_off: bool = False, url: str | None = None) -> int:
    """The counted process: set up, announce readiness, wait, run ``n`` calls
    (with the audit chain's work taken out of the write if ``chain_off``:
    ``bench.audit.chain``), on a fresh SQLite file or the PostgreSQL ``url``."""
    from bench.cairn_workloads import build, build_url

    if chain_off:
        from bench.audit import chain

        # kept referenced for the process's life (it ends in os._exit): a context manager
        # dropped at once is closed by the collector, which undid the patch (counted "off" = on)
        chain_taken_out = chain(False)
        chain_taken_out.__enter__()
    if url is None:
        w = build(Path(tempfile.mkdtemp(prefix="cairn-callcount-")) / "cairn.sqlite")
    else:
        w = build_url(url, lease_seconds=3600.0)
    if kind == "three":
        w.app.run(w.three)
    else:
        workflow = {"step": w.chain, "read": w.reads, "write": w.writes}[kind]
        w.app.run(workflow, 3)
    settle(w.app.store, signal_path)
    if kind == "three":
        for _ in range(n):
            w.app.run(w.three)
    elif w.app.run(workflow, n) != n:
        raise RuntimeError(f"{kind} workflow did not return {n}")
    os._exit(0)  # no teardown: nothing after the measured run is counted


def settle(store: object, signal_path: str) -> None:
    """In the counted child, after its warm-up: take out what lands in a window
    or not by chance (WAL auto-checkpoints on ``store``'s connection, garbage
    collections: the warmed-up objects frozen, the collector off), say so in
    ``signal_path + ".ready"``, and wait for ``".go"`` (instrumentation is on
    by then)."""
    from cairn.store.sqlite import SQLiteStore

    # A sealed store (encryption at rest) wraps the SQLite store: its checkpoints are that store's.
    # Until 2026-12-06 only a bare SQLiteStore was found here, so a count with encryption on kept
    # its auto-checkpoints while one with it off did not: one checkpoint (about 213,000
    # instructions) fell into on's 60-run window and none into its 20-run one, 5,300 a run counted
    # on "on" alone (bench/results/encryption-2026-12-06-enctime.txt).
    while getattr(type(store), "sealed", False):
        store = store.inner  # type: ignore[attr-defined]
    if isinstance(store, SQLiteStore):  # PostgreSQL checkpoints in its server, not counted
        # on the connection every write commits on (SQLiteStore._writer_conn: a commit there checkpoints)
        store._writer_conn().execute("PRAGMA wal_autocheckpoint = 0")  # type: ignore[attr-defined]
    gc.collect()
    gc.freeze()
    gc.disable()
    Path(signal_path + ".ready").write_text(str(os.getpid()))
    while not os.path.exists(signal_path + ".go"):
        time.sleep(0.05)


#: callgrind's cache and branch-predictor simulation (``collected(..., simulate=True)``)
SIMULATE = ("--cache-sim=yes", "--branch-sim=yes")


def collected(module_args: list[str], signal_path: str, env: dict[str, str], simulate: bool = False) -> int:
    """Instructions of one ``python -m MODULE_ARGS`` child under callgrind,
    instrumented from its go signal on (the child calls ``settle`` first);
    with ``simulate``, its cache misses and branch mispredictions are
    simulated too (``events`` reads them)."""
    for stale in (".ready", ".go"):  # of an earlier count in the same place: it would start this one unseen
        Path(signal_path + stale).unlink(missing_ok=True)
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", *(SIMULATE if simulate else ()),
         f"--callgrind-out-file={signal_path}.callgrind", sys.executable, "-m", *module_args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    ready = Path(signal_path + ".ready")
    while not ready.exists():
        if proc.poll() is not None:
            shown = proc.stdout.read() if proc.stdout else ""
            raise RuntimeError(f"the counted child exited early:\n{shown}")
        time.sleep(0.2)
    subprocess.run(["callgrind_control", "-i", "on", ready.read_text()], check=True, capture_output=True)
    Path(signal_path + ".go").touch()
    output, _ = proc.communicate()
    found = re.search(r"Collected : (\d+)", output)
    if found is None:
        raise RuntimeError(f"no instruction count in callgrind's output:\n{output[-2000:]}")
    return int(found.group(1))


def events(signal_path: str) -> dict[str, int]:
    """The totals of the child ``collected`` ran at ``signal_path``, by event
    (``Ir``; with ``simulate`` also ``I1mr``, ``D1mr``, ``Bcm``, ``Bim``...)."""
    names: list[str] = []
    for line in Path(signal_path + ".callgrind").read_text().splitlines():
        if line.startswith("events:"):
            names = line.split()[1:]
        elif line.startswith("totals:"):
            return dict(zip(names, map(int, line.split()[1:]), strict=True))
    raise RuntimeError(f"no totals in {signal_path}.callgrind")


def tree_env(tree: Path) -> dict[str, str]:
    """The environment of a child counting ``tree``'s ``src/cairn`` with this ``bench``."""
    paths = [str(tree / "src"), str(Path(__file__).resolve().parent.parent)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def count(tree: Path, kind: str, n: int, workdir: Path, chain_off: bool = False,
          url: str | None = None) -> int:
    """Instructions of one child process running ``n`` calls (instrumented
    from the go signal on), on SQLite or the PostgreSQL database ``url``."""
    signal_path = str(workdir / f"{kind}-{n}{'-off' if chain_off else ''}{'-pg' if url else ''}")
    return collected(["bench.callcount", "--child", kind, str(n), signal_path,
                      *(["--chain-off"] if chain_off else []), *(["--url", url] if url else [])],
                     signal_path, tree_env(tree))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.callcount", description=__doc__.splitlines()[0])
    parser.add_argument("kind", nargs="?", choices=KINDS, default="write")
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="source tree whose src/cairn is counted (default: this one)")
    parser.add_argument("--sizes", type=int, nargs=2, default=(20, 120), metavar=("SMALL", "LARGE"))
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--chain-off", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child[0], int(args.child[1]), args.child[2], args.chain_off, args.url)
    small, large = args.sizes
    if not 0 < small < large:
        parser.error("--sizes: SMALL must be positive and below LARGE")
    with tempfile.TemporaryDirectory(prefix="cairn-callcount-") as name:
        workdir = Path(name)
        low = count(args.tree.resolve(), args.kind, small, workdir)
        high = count(args.tree.resolve(), args.kind, large, workdir)
    unit = "run" if args.kind == "three" else "call"
    print(f"{args.tree}: {args.kind}: {small} -> {low:,} Ir, {large} -> {high:,} Ir; "
          f"{(high - low) / (large - small):,.0f} instructions per {unit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
