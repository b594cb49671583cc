"""Encryption at rest: what sealing adds per journaled step and to 3-step runs/s.

    python -m bench.encryption            # SQLite, 80 rounds, each a pair of off and on
    python -m bench.encryption --rounds 200
    python -m bench.encryption --quick

One embedded App per mode on its own SQLite file (durability ``process``).
Each round runs both modes next to each other, which goes first alternating
round by round (the one that follows starts with the other's code and pages
in the caches); a first round is not counted (compiling, caches, the
tenant's first data key). Every figure is paired: the median of the rounds'
on-minus-off differences, with its interquartile range and a 95 % interval
of the median (``bench.audit.paired``), judged against the issue's bounds
(``verdict``: "shown" only when the whole interval is within the bound).
Load that changes from round to round moves both halves of a pair alike;
the difference of two medians over blocks of rounds, which this bench gave
until 2026-12-07, moved between three quiet runs by as much as the effect
(-11.5 to -15.7 % runs per CPU second). Each figure is given as wall time
and as this process's CPU time (``time.process_time``): on a shared, loaded
machine the wall figures are mostly other processes' noise, the CPU figures
what encryption itself adds.

The CPU that encryption adds is more than its instructions say (callgrind:
about +5 % a 3-step run, where the timed runs per CPU second showed -8 to
-20 %). Not the kernel: system time is alike, and a run makes 1.4 more
``pwrite`` (0.7 more WAL frames for the larger rows) and 0.08 more
``getrandom`` calls, no ``stat``, ``open`` or ``mmap``; not another thread
nor garbage collection (none in a window in either mode). The added code
runs cold: callgrind's simulation (``--simulate``) counts +5.1 % instructions
a run but +10.7 % first-level instruction cache misses and +10.7 %
mispredicted conditional branches (+6.9 % indirect). The five AES-GCM calls
(``cryptography``'s OpenSSL copies, sets up and frees a cipher context per
call) make 19,500 instructions and 1,660 of those misses a run; timed where
a run makes them they take 3 to 6 us each against under one in a loop
(``aes_in_situ``, printed by the timed mode), 18 to 25 us a run. (Under
valgrind OpenSSL takes its AES-NI path, valgrind's CPU having no AVX-512;
natively its VAES/AVX-512 one, which, masked off by ``OPENSSL_ia32cap``,
cost the same in situ.) bench/results/encryption-2026-12-06-enctime.txt.

Per-step cost: a run of ``STEPS`` steps each returning a payload of the
given size, its time over ``STEPS``; on minus off in the same round is what
encryption added. Runs/s: ``count`` 3-step runs of 100-byte results back to
back per mode a round; per pair, the per cent of runs/s encryption took away,
``1 - (time off) / (time on)``. Figures only: no assertion (tests/ holds
none on time either).

    python -m bench.encryption --ablate           # what each piece costs a run, in CPU time
    python -m bench.encryption --instructions     # needs valgrind
    python -m bench.encryption --instructions --quick --tree ../main
    python -m bench.encryption --instructions --quick --layouts 5
    python -m bench.encryption --instructions --quick --simulate  # + cache misses, mispredicts
    python -m bench.encryption --layer --tree ../main  # the sealing layer alone, over a stub store

``--ablate`` times 3-step runs in one app off, one on and one on per piece of
sealing taken out (``take_out``: AES-GCM replaced by a stand-in of the same
lengths, a step's keyed digest by a constant, the run's input or result passed
through unsealed), all in one process, each round's apps in a shuffled order;
a piece's cost is the full app's CPU a run minus its app's in the same round.
Where the time goes, not what is stored: those apps' rows do not verify. One
more app is an off one making the same five AES-GCM encryptions where a run
makes them and nothing else of sealing (``bare_aes``): against the off app,
the floor of any sealing with these ``cryptography`` calls (2026-12-07,
branch ``encrun``, five sessions: 2.6 to 6.1 % of 3-step runs per CPU second,
where the whole of sealing took 10.1 to 11.8 %).

``--layer`` counts the instructions of the sealing layer alone
(``layer_calls``: a 3-step run's ``create_claimed_run``, three ``append`` and
``finish_run`` on the sealed store over a stub in place of the SQL store): no
SQLite, no engine, no heap layout to move it, so the same code counts the same
to about a hundred instructions in 110,000 (the whole run's count moves by
thousands between layouts): the figure to judge a change of the sealed store's
own code by, before the whole run's count and the timed pairs.

``--instructions`` counts the CPU instructions of 3-step runs instead, a
figure that other processes' load does not move: the one to compare changes
by on a shared machine. It counts the way ``bench.callcount`` does, each mode alike: one
process per mode and window size under callgrind, instrumented only after
its warm-up, with WAL auto-checkpoints off and the garbage collector frozen
and off (a collection or a checkpoint falling into a window or not moved a
mode by up to 0.5 %), and two window sizes, so that what a window costs
once (its first run's extra work, instrumentation's start) cancels: a run's
count is the difference of the two windows over the difference of their
runs. Its wall clock and random bytes are pinned (``pin_inputs``), so a
session repeats another's to a few hundred instructions a run; where its
objects land in memory still moves the count by a few thousand a run, so
``--layouts N`` counts in N heap layouts (``LAYOUT_OBJECTS``). ``--tree``
counts another tree's ``src/cairn`` with this bench.
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import cairn
from cairn.security.keyring import LocalKeyring
from cairn.security.shredding import FileShredder
from cairn.store import sealing

STEPS = 200


def make(path: Path, sealed: bool, lease_seconds: float = 30.0) -> tuple[cairn.App, Any, Any]:
    shredder = FileShredder(path.with_name(path.name + ".subjects"))  # subject keys' secrets (erasure)
    ring = LocalKeyring({"k1": os.urandom(32)}, "k1", shredder) if sealed else None
    app = cairn.App(db=f"sqlite:///{path}", keyring=ring, lease_seconds=lease_seconds)

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



def aes_in_situ(app: cairn.App, three: Any, count: int) -> tuple[float, float]:
    """Median microseconds of one AES-GCM encryption as ``app``'s 3-step runs
    make it (its tenant's writing key wrapped in a timer for ``count`` runs,
    then restored), and of the same call repeated in a loop."""
    keys = app.store.keys  # type: ignore[attr-defined]
    times: list[int] = []
    clock = time.perf_counter_ns

    class Timed:
        def __init__(self, cipher: Any) -> None:
            self.cipher = cipher

        def encrypt(self, nonce: bytes, data: bytes, associated: bytes) -> bytes:
            started = clock()
            sealed: bytes = self.cipher.encrypt(nonce, data, associated)
            times.append(clock() - started)
            return sealed

    saved = dict(keys.writing)
    try:
        for tenant, (version, cipher, head, checked) in saved.items():
            keys.writing[tenant] = (version, Timed(cipher), head, checked)
        for _ in range(count):
            app.run(three)
    finally:
        keys.writing.update(saved)
    cipher = next(iter(saved.values()))[1]
    nonce, associated, data = os.urandom(12), os.urandom(60), b"x" * 100
    loop = []
    for _ in range(5000):
        started = clock()
        cipher.encrypt(nonce, data, associated)
        loop.append(clock() - started)
    return statistics.median(times) / 1e3, statistics.median(loop) / 1e3

#: the counted child's clock: starts at 2026-12-06 00:00 UTC, 137,113 ns a reading (an odd step, so
#: its times have as many digits as a real clock's)
CLOCK_START_NS, CLOCK_STEP_NS = 1_796_515_200_000_000_000, 137_113
#: Heap layouts (``--layouts``): how many 64-byte objects a child allocates and keeps before
#: building its app. With its inputs pinned a child's count repeats, but where its objects land
#: still moves it (dictionaries keyed by identity, the allocators' free lists): the same code's
#: per-run count moved by 3,900 instructions over these five, and by about 10,000 after an
#: unrelated change to what the child allocated. A change's effect is told from that by the
#: median and range over several layouts.
LAYOUT_OBJECTS = (0, 1, 7, 50, 333)
#: nonces a 3-step run draws at most (its input, three results, its result; ``pin_inputs``)
NONCES_A_RUN = 5


def pin_inputs(runs: int) -> None:
    """Make the counted child's inputs the same in every session (``runs``:
    how many 3-step runs it makes in all): the wall clock (``time.time``,
    ``time.time_ns``) a counter that moves by ``CLOCK_STEP_NS`` a reading,
    and ``os.urandom`` (run ids, worker names, data and key encryption keys,
    nonces) a seeded generator's bytes. Both moved a count between sessions
    (main's per-run count by up to 14,000 instructions): what a run writes
    (timestamps in the rows and their indexes, the run ids' time and random
    bits) steered SQLite's B-tree work, and under callgrind the clock's
    readings followed the machine's load. Pinned, three children of one mode
    and window count the same to a few hundred instructions in 44 million
    (bench/results/encryption-2026-12-06-sealcount.txt). The stand-ins are
    C callables (``itertools``, ``functools.partial``, ``random.Random``'s
    ``randbytes``), so the Python around them costs what the real ones'
    does. Only the counted child does this, never a real app."""
    import functools
    import itertools
    import operator
    import random

    readings = itertools.count(CLOCK_START_NS, CLOCK_STEP_NS)
    time.time_ns = functools.partial(next, readings)  # type: ignore[assignment]
    seconds = map(operator.truediv, readings, itertools.repeat(1e9))
    time.time = functools.partial(next, seconds)  # type: ignore[assignment]
    draw = random.Random(20261206).randbytes
    os.urandom = draw  # type: ignore[assignment]
    # The nonce pool's refills (``envelope._urandom``, bound at import) are drawn now, before the
    # window: the generator's work for 768 bytes a refill (about 2,000 instructions a run) would
    # be counted where the real call's is the kernel's, which callgrind does not count. Handed out
    # by ``next`` (the size it is called with is ``next``'s default, never reached).
    from cairn.security import envelope

    size = envelope.NONCE_SIZE * envelope.NONCE_BATCH
    refills = [draw(size) for _ in range(runs * NONCES_A_RUN // envelope.NONCE_BATCH + 1)]
    envelope._urandom = functools.partial(next, iter(refills))  # type: ignore[assignment]


def _instrumented_child(mode: str, count: int, signal_path: str) -> None:
    """Under callgrind (instrumentation off): warm up, settle (``bench.callcount.settle``),
    then run ``count`` 3-step runs and leave at once."""
    from bench.callcount import settle

    # The tenant's key is looked up again every KEY_REFRESH_SECONDS of wall time: at this
    # process's speed under callgrind (about 50 times slower, more under load) that is a read
    # of data_keys every few runs, a count that follows the machine's load, not the code's
    # (main measured +8.0 % and +12.4 % an hour apart). At full speed it is one read per
    # thousands of runs, so the counted runs leave it out.
    sealing.KEY_REFRESH_SECONDS = 1e9
    # Likewise the lease thread renews the running run's lease every lease_seconds / 3 of wall
    # time (a write transaction): under callgrind a few fall into a 220-run window or not, with
    # the load (main's count of one mode moved by 26,000 a run between two sessions); at full
    # speed that is one renewal per thousands of runs. A lease of an hour keeps them out.
    pin_inputs(30 + count)
    # this layout's objects, kept for the process's life (``LAYOUT_OBJECTS``)
    _kept = [bytes(64) for _ in range(LAYOUT_OBJECTS[int(os.environ.get("CAIRN_BENCH_LAYOUT", "0"))])]
    work = Path(tempfile.mkdtemp(prefix="cairn-bench-enc-ir-"))
    app, _, three = make(work / "x.db", mode != "off", lease_seconds=3600.0)
    subject = {"subject": "bench-subject"} if mode == "subject" else {}  # sealed with a subject's key
    for _ in range(30):
        app.run(three, **subject)
    # emptied, so every mode's window starts from the same WAL (settle turns its checkpoints off)
    with sqlite3.connect(work / "x.db") as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    settle(app.store, signal_path)
    for _ in range(count):
        app.run(three, **subject)
    os._exit(0)  # nothing after the measured runs is counted: no teardown


MODES = ("off", "on", "subject")
#: ``--layer``'s two windows, in 3-step runs' worth of calls
LAYER_WINDOWS = (200, 1200)


class _StubInner:
    """``--layer``'s store under the sealed one: takes each call and keeps nothing, asking for a
    step entry's audit digest as the SQL stores do when they write one (``audit_digest``)."""

    def __init__(self, digest: Any) -> None:
        self.digest = digest

    def create_claimed_run(self, run: Any, worker: str, lease_seconds: float) -> None:
        return None

    def append(self, run_id: str, epoch: int, events: Any, *, barrier: bool = False) -> None:
        for event in events:
            self.digest(event, None)

    def finish_run(self, run_id: str, epoch: int, event: Any, status: Any, result: Any, error: Any) -> None:
        return None


def layer_calls(app: cairn.App) -> Any:
    """A function making, on ``app``'s sealed store, the calls of one 3-step run as the engine
    makes them (``create_claimed_run``, three ``append``, ``finish_run``, with the values a run of
    ``three`` stores: its input ``{}``, three results of 102 bytes, its result ``3``), over
    ``_StubInner`` in place of the SQL store: what the sealing layer itself does a run, no
    database. ``app`` is warmed up first (its tenant's keys made and cached)."""
    from cairn.store.records import EventType, HistoryEvent, NewRun, Payload, RunStatus

    store: Any = app.store
    hot = list(store._hot)
    hot[-1] = _StubInner(store.audit_keys.digest)
    object.__setattr__(store, "_hot", tuple(hot))
    run = NewRun("r" + "0" * 28, "three", "v", "default", None, Payload(b"{}"))
    steps = [(HistoryEvent(run.run_id, 4 + i, EventType.STEP_COMPLETED, 0.0, 1, "w", i, "step", "produce",
                           "h", 1, 0.0, Payload(b'"' + b"x" * 100 + b'"'), None),) for i in range(3)]
    finish = HistoryEvent(run.run_id, 7, EventType.RUN_COMPLETED, 0.0, 1, "w")
    result = Payload(b"3")

    def one() -> None:
        store.create_claimed_run(run, "w", 3600.0)
        for entries in steps:
            store.append(run.run_id, 1, entries, barrier=False)
        store.finish_run(run.run_id, 1, finish, RunStatus.COMPLETED, result, None)

    return one


def _layer_child(count: int, signal_path: str) -> None:
    """Under callgrind (instrumentation off): ``layer_calls`` warmed up, then ``count`` of them."""
    from bench.callcount import settle

    sealing.KEY_REFRESH_SECONDS = 1e9  # as ``_instrumented_child``
    pin_inputs(100 + count)
    app, _, three = make(Path(tempfile.mkdtemp(prefix="cairn-bench-enc-layer-")) / "x.db", True, 3600.0)
    for _ in range(20):
        app.run(three)
    one = layer_calls(app)
    for _ in range(50):
        one()
    settle(app.store, signal_path)
    for _ in range(count):
        one()
    os._exit(0)


def layer(tree: Path) -> None:
    """Instructions of the sealing layer alone a 3-step run (``layer_calls``): no SQLite, no
    engine, no heap layout moving it by thousands (the same code counts the same to a few
    instructions), so the figure to judge a change of ``cairn.store.sealed*`` by."""
    from bench.callcount import collected, tree_env

    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("--layer needs valgrind (callgrind and callgrind_control)")
    compileall.compile_dir(tree / "src" / "cairn", quiet=1)
    compileall.compile_dir(Path(__file__).resolve().parent, quiet=1)
    env = {**tree_env(tree), "PYTHONHASHSEED": "0"}
    totals = {}
    with tempfile.TemporaryDirectory(prefix="cairn-bench-enc-layer-") as work:
        for size in LAYER_WINDOWS:
            signal_path = f"{work}/layer-{size}"
            totals[size] = collected(["bench.encryption", "--child", "layer", str(size), signal_path],
                                     signal_path, env)
    small, large = LAYER_WINDOWS
    print(f"sealing layer alone (create_claimed_run, 3 appends, finish_run over a stub store; "
          f"windows of {small} and {large}), {tree}: "
          f"{(totals[large] - totals[small]) / (large - small):,.0f} instructions a 3-step run")


#: what ``--simulate`` shows per run, of callgrind's simulated events: first-level instruction
#: and data cache read misses, last-level misses, mispredicted conditional and indirect branches
SIMULATED = (("I1mr", "I1 misses"), ("D1mr", "D1 read misses"), ("DLmr", "LL data misses"),
             ("Bcm", "cond. mispredicts"), ("Bim", "ind. mispredicts"))


def instructions(sizes: tuple[int, int], tree: Path, layouts: int, simulate: bool = False) -> None:
    """Instructions per 3-step run, encryption off and on (see the module
    doc), in each of ``layouts`` heap layouts (``LAYOUT_OBJECTS``); with
    ``simulate``, callgrind's simulated cache misses and branch
    mispredictions per run too (``SIMULATED``)."""
    from bench.callcount import collected, events, tree_env

    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("--instructions needs valgrind (callgrind and callgrind_control)")
    if not 1 <= layouts <= len(LAYOUT_OBJECTS):
        raise SystemExit(f"--layouts: 1 to {len(LAYOUT_OBJECTS)}, not {layouts}")
    # compiled before the first child, which would otherwise compile what changed since the last
    # count on its way to the window: its heap laid out otherwise, its count off by up to 33,000
    compileall.compile_dir(tree / "src" / "cairn", quiet=1)
    compileall.compile_dir(Path(__file__).resolve().parent, quiet=1)
    small, large = sizes
    added: list[float] = []
    for layout in range(layouts):
        env = {**tree_env(tree), "PYTHONHASHSEED": "0", "CAIRN_BENCH_LAYOUT": str(layout)}  # one hash seed
        totals: dict[tuple[str, int], int] = {}
        simulated: dict[tuple[str, int], dict[str, int]] = {}
        with tempfile.TemporaryDirectory(prefix="cairn-bench-enc-ir-") as work:
            for size in sizes:
                for mode in MODES:  # the modes alternate within a size: every mode counted alike
                    signal_path = f"{work}/{mode}-{size}"
                    child = ["bench.encryption", "--child", mode, str(size), signal_path]
                    totals[mode, size] = collected(child, signal_path, env, simulate)
                    simulated[mode, size] = events(signal_path)
        per_run = {mode: (totals[mode, large] - totals[mode, small]) / (large - small) for mode in MODES}
        print(f"layout {layout} ({LAYOUT_OBJECTS[layout]} objects kept first):")
        for mode in MODES:
            low, high = totals[mode, small], totals[mode, large]
            print(f"  {mode:>7}: {small} runs {low:,} Ir, {large} runs {high:,} Ir")
        off, on, subject = per_run["off"], per_run["on"], per_run["subject"]
        added.append((on / off - 1) * 100)
        print(f"instructions per 3-step run (callgrind, windows of {small} and {large} runs), SQLite: "
              f"off {off:,.0f}  "
              f"on {on:,.0f}  ({added[-1]:+.2f} %; {(on - off) / 5:,.0f} per sealed value, 5 a run)")
        print(f"  with a subject (its own data key, issue 26 erasure): {subject:,.0f}  "
              f"({(subject / on - 1) * 100:+.2f} % vs the tenant's key)")
        for event, name in SIMULATED if simulate else ():
            run = {mode: (simulated[mode, large][event] - simulated[mode, small][event]) / (large - small)
                   for mode in ("off", "on")}
            added = (f"{(run['on'] / run['off'] - 1) * 100:+.1f} %" if run["off"] >= 100
                     else f"{run['on'] - run['off']:+,.0f}")
            print(f"  {name} per run (simulated): off {run['off']:,.0f}  on {run['on']:,.0f}  ({added})")
    if layouts > 1:
        print(f"encryption on over {layouts} layouts: median {statistics.median(added):+.2f} %, "
              f"range {min(added):+.2f} to {max(added):+.2f} %")


#: the issue's bounds (issue 25): microseconds encryption adds a journaled step, and per cent of
#: the 3-step runs/s figure it takes away
TARGET_STEP_US, TARGET_RUNS_PERCENT = 10.0, 5.0
SIZES = (100, 1024, 4096)


def round_of(app: cairn.App, steps: Any, three: Any, count: int) -> dict[str, float]:
    """One mode's share of a round: a run of ``STEPS`` steps per payload size
    (wall and CPU microseconds a step), then ``count`` 3-step runs back to back
    (wall and CPU microseconds a run)."""
    figures: dict[str, float] = {}
    for size in SIZES:
        started, cpu = time.perf_counter(), time.process_time()
        app.run(steps, size, STEPS)
        figures[f"step wall {size}"] = (time.perf_counter() - started) / STEPS * 1e6
        figures[f"step CPU {size}"] = (time.process_time() - cpu) / STEPS * 1e6
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(count):
        app.run(three)
    figures["run wall"] = (time.perf_counter() - started) / count * 1e6
    figures["run CPU"] = (time.process_time() - cpu) / count * 1e6
    return figures


def timed_pairs(rounds: int, count: int) -> None:
    """The timed figures, paired: each round runs both modes next to each
    other (``round_of``), which goes first alternating round by round, and
    every figure is the median of the rounds' on-minus-off differences with
    a 95 % interval of that median (``bench.audit.paired``; ``verdict``
    against the issue's bounds). Load that changes from round to round
    moves both halves of a pair alike; the difference of two medians taken
    over blocks of rounds (this bench until 2026-12-07) moved by as much as
    the effect between runs (-11.5 to -15.7 % runs per CPU second, quiet)."""
    from bench.audit import paired, verdict

    work = Path(tempfile.mkdtemp(prefix="cairn-bench-enc-"))
    apps = {mode: make(work / f"{mode}.db", mode == "on") for mode in ("off", "on")}
    load_before = os.getloadavg()
    # A round not counted first: each mode's first runs compile, fill caches and (on) make the
    # tenant's data key. The one that follows the other starts with the other's code and pages in
    # the caches, so which goes first alternates.
    pairs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    for number in range(-1, rounds):
        for mode in (("off", "on") if number % 2 == 0 else ("on", "off")):
            figures = round_of(*apps[mode], count)
            if number >= 0:
                pairs[mode].append(figures)
    load_after = os.getloadavg()
    off, on = pairs["off"], pairs["on"]

    def diffs(label: str) -> list[float]:
        return [b[label] - a[label] for a, b in zip(off, on, strict=True)]

    def median(rows: list[dict[str, float]], label: str) -> float:
        return statistics.median(row[label] for row in rows)

    print(f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after (1 min; 2 shared cores); "
          f"{rounds} rounds, each off and on next to each other")
    print(f"per journaled step (a run of {STEPS} steps per size and mode a round), SQLite, on minus off:")
    for size in SIZES:
        for clock in ("CPU", "wall"):
            label = f"step {clock} {size}"
            added = diffs(label)
            judged = f"; target {verdict(added, TARGET_STEP_US)}" if clock == "CPU" else ""
            print(f"  payload {size:>5} B {clock:>4}: off {median(off, label):6.1f} us  "
                  f"on {median(on, label):6.1f} us  added: {paired(added)}{judged}")
    print(f"3-step runs ({count} back to back per mode a round), on minus off:")
    for clock in ("CPU", "wall"):
        label = f"run {clock}"
        print(f"  {clock:>4} a run: off {median(off, label):6.1f} us  on {median(on, label):6.1f} us  "
              f"added: {paired(diffs(label))}")
    # runs/s taken away, per pair: 1 - (runs/s on) / (runs/s off) = 1 - (time off) / (time on)
    for clock, per in (("CPU", "runs per CPU second"), ("wall", "runs/s")):
        label = f"run {clock}"
        lost = [(1 - a[label] / b[label]) * 100 for a, b in zip(off, on, strict=True)]
        rates = f"off {1e6 / median(off, label):7.1f}  on {1e6 / median(on, label):7.1f}"
        judged = f"; target {verdict(lost, TARGET_RUNS_PERCENT, '%')}" if clock == "CPU" else ""
        print(f"  3-step {per}: {rates}; per cent lost to encryption: {paired(lost)}{judged}")
    in_situ, hot = aes_in_situ(apps["on"][0], apps["on"][2], 10 * count)
    print(f"AES-GCM in 3-step runs (5 a run), each call timed where the run makes it: median "
          f"{in_situ:.2f} us a call; the same call in a loop: {hot:.2f} us (aes_in_situ)")
    print("sealing alone, CPU (an entry's payload of random hex, in process, no database):")
    for size in SIZES:
        sealing, opening = seal_cost(apps["on"][0], size)
        print(f"  payload {size:>5} B: seal {sealing:5.1f} us  open {opening:5.1f} us")
    for app, _, _ in apps.values():
        app.close()


#: ``--ablate``: each piece of what encryption does in a 3-step run, taken out of one more app
#: (a probe's stand-in, never a real store's): its cost in situ is that app's time against the
#: full one's, paired round by round
PIECES = ("aes", "digest", "input", "result")


class _AesStandIn:
    """AES-GCM's stand-in for ``--ablate``: the same length out (the plaintext and 16 zero
    bytes), the Python call kept, none of ``cryptography``'s work."""

    TAG = bytes(16)

    def encrypt(self, nonce: bytes, data: bytes, associated: bytes) -> bytes:
        return data + self.TAG


class _DigestStandIn:
    """A tenant's keyed BLAKE2b state's stand-in for ``--ablate``: copied, fed and asked
    for a digest as ``sealedsteps.append`` does, each a Python call, no hashing."""

    DIGEST = bytes(32)

    def copy(self) -> _DigestStandIn:
        return self

    def update(self, data: bytes) -> None:
        pass

    def digest(self) -> bytes:
        return self.DIGEST


def take_out(app: cairn.App, piece: str) -> None:
    """``app``'s sealed store with ``piece`` (``PIECES``) taken out: ``aes`` AES-GCM replaced
    by ``_AesStandIn``, ``digest`` a step's keyed digest by ``_DigestStandIn``, ``input`` and
    ``result`` the run's input or result passed to the store under it unsealed. The store's
    caches hold the stand-ins from the app's first runs on: it is warmed up first."""
    store: Any = app.store
    if piece == "aes":
        for tenant, (version, _, head, _) in list(store.keys.writing.items()):
            store.keys.writing[tenant] = (version, _AesStandIn(), head, float("inf"))
    elif piece == "digest":
        for tenant in list(store.audit_keys.keyed):
            store.audit_keys.keyed[tenant] = _DigestStandIn()
    elif piece == "input":
        inner, tenants, subjects = store.inner, store._tenants, store._subjects

        def create_claimed_run(run: Any, worker: str, lease_seconds: float) -> Any:
            tenants[run.run_id], subjects[run.run_id] = run.tenant, run.subject
            return inner.create_claimed_run(run, worker, lease_seconds)

        object.__setattr__(store, "create_claimed_run", create_claimed_run)
    elif piece == "result":
        object.__setattr__(store, "finish_run", store.inner.finish_run)
    else:
        raise SystemExit(f"--ablate: one of {', '.join(PIECES)}, not {piece!r}")


#: ``bare_aes``'s associated data: as long as a step's place with its header (what the five
#: calls of a sealed run authenticate)
BARE_ASSOCIATED = bytes(64)


def bare_aes(app: cairn.App, cipher: Any = None) -> None:
    """``app`` (encryption off) making the five AES-GCM encryptions a sealed 3-step run makes, and
    nothing else of sealing: each value its store is handed (the run's input, each entry's payload,
    the result) is encrypted by ``cipher`` (default: AES-256-GCM of a random key) with a nonce and
    associated data of the real lengths, and the ciphertext dropped; the store keeps the plaintext.
    What ``--ablate`` reports of it, against the off app, is the floor of any sealing that makes
    these five ``cryptography`` calls where the run makes them: the calls and their cold caches,
    none of the Python around them. A probe: nothing it encrypts is kept."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    store: Any = app.store
    encrypt = (AESGCM(os.urandom(32)) if cipher is None else cipher).encrypt
    nonce, associated = os.urandom(12), BARE_ASSOCIATED
    append, create_claimed_run, finish_run = store.append, store.create_claimed_run, store.finish_run

    def appended(run_id: str, epoch: int, events: Any, *, barrier: bool = False) -> None:
        for event in events:
            if event.payload is not None and event.payload.data is not None:
                encrypt(nonce, event.payload.data, associated)
        append(run_id, epoch, events, barrier=barrier)

    def created(run: Any, worker: str, lease_seconds: float) -> Any:
        if run.input.data is not None:
            encrypt(nonce, run.input.data, associated)
        return create_claimed_run(run, worker, lease_seconds)

    def finished(run_id: str, epoch: int, event: Any, status: Any, result: Any, error: Any) -> None:
        if result is not None and result.data is not None:
            encrypt(nonce, result.data, associated)
        finish_run(run_id, epoch, event, status, result, error)

    store.append, store.create_claimed_run, store.finish_run = appended, created, finished


def ablated(rounds: int, count: int) -> None:
    """What each piece costs a 3-step run, in CPU time: one app off, one on, and one on per
    piece of ``PIECES`` with it taken out (``take_out``); each round runs every app's
    ``count`` runs, in a shuffled order, and a piece's cost is the full app's time minus its
    app's in the same round (paired)."""
    import random

    from bench.audit import paired

    work = Path(tempfile.mkdtemp(prefix="cairn-bench-enc-ablate-"))
    names = ("off", "on", *PIECES, "bare")
    apps = {name: make(work / f"{name}.db", name not in ("off", "bare")) for name in names}
    for name, (app, _, three) in apps.items():
        for _ in range(20):  # warmed up: compiled, the tenant's key made and cached
            app.run(three)
        if name in PIECES:
            take_out(app, name)
            app.run(three)
        elif name == "bare":
            bare_aes(app)
            app.run(three)
    load_before = os.getloadavg()
    order, shuffle = list(names), random.Random(25).shuffle
    taken: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        shuffle(order)
        for name in order:
            app, _, three = apps[name]
            started = time.process_time()
            for _ in range(count):
                app.run(three)
            taken[name].append((time.process_time() - started) / count * 1e6)
    load_after = os.getloadavg()
    off, on = taken["off"], taken["on"]
    print(f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after; {rounds} rounds of {count} "
          f"3-step runs per app, shuffled; CPU a run: off {statistics.median(off):.1f} us, "
          f"on {statistics.median(on):.1f} us")
    print(f"  on minus off: {paired([b - a for a, b in zip(off, on, strict=True)])}")
    for piece in PIECES:
        saved = [a - b for a, b in zip(on, taken[piece], strict=True)]
        print(f"  {piece:>6} taken out, on minus it (what it costs): {paired(saved)}")
    bare = taken["bare"]
    print(f"  bare AES-GCM (an off app making the five calls, nothing else; bare_aes), it minus off: "
          f"{paired([b - a for a, b in zip(off, bare, strict=True)])}")
    lost = {name: [(1 - a / b) * 100 for a, b in zip(off, taken[name], strict=True)]
            for name in ("on", "bare")}
    print(f"  per cent of 3-step runs per CPU second lost: on {paired(lost['on'])}")
    print(f"                                             bare AES-GCM {paired(lost['bare'])}")
    for app, _, _ in apps.values():
        app.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per 3-step run under callgrind instead (needs valgrind)")
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="with --instructions or --layer: the tree whose src/cairn is counted")
    parser.add_argument("--layouts", type=int, default=1,
                        help=f"with --instructions: count in N heap layouts (1-{len(LAYOUT_OBJECTS)})")
    parser.add_argument("--simulate", action="store_true",
                        help="with --instructions: simulate caches and branch prediction too (slower)")
    parser.add_argument("--rounds", type=int, default=80,
                        help="timed mode: rounds, each one pair of off and on (default 80; --quick: 12)")
    parser.add_argument("--ablate", action="store_true",
                        help="timed: what each piece of sealing costs a 3-step run (take_out), paired")
    parser.add_argument("--layer", action="store_true",
                        help="instructions of the sealing layer alone a 3-step run (needs valgrind)")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, count, signal_path = args.child
        if mode == "layer":
            _layer_child(int(count), signal_path)
        else:
            _instrumented_child(mode, int(count), signal_path)
        return
    if args.layer:
        layer(args.tree.resolve())
        return
    if args.instructions:
        instructions((20, 60) if args.quick else (20, 220), args.tree.resolve(), args.layouts, args.simulate)
        return
    if args.ablate:
        ablated(rounds=12 if args.quick else args.rounds, count=10 if args.quick else 20)
        return
    timed_pairs(rounds=12 if args.quick else args.rounds, count=10 if args.quick else 20)


if __name__ == "__main__":
    main()
