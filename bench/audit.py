"""What the audit chain costs (issue 26): per journaled step, side by side
with the chain off, and how fast the verifier checks entries.

    python -m bench.audit                    # SQLite and PostgreSQL (a throwaway cluster)
    python -m bench.audit --sqlite-only
    python -m bench.audit --postgres-only    # the step's cost on PostgreSQL alone
    python -m bench.audit --quick            # small sizes
    python -m bench.audit --verify-only      # verify end to end, medians of --passes, both backends
    python -m bench.audit --instructions     # instructions per step, chain on and off (needs valgrind)
    python -m bench.audit --instructions --sqlite-only --repeat 3
    python -m bench.audit --in-loop --steps 200 --rounds 40   # the chain's cost in the step loop
    python -m bench.audit --postgres-only --raw               # every round's figures too
    python -m bench.audit --shown --repeat 3 --steps 200 --rounds 100   # issue 26's figure, both kinds

Keyed digests (encryption on): each entry's digest alone, plain SHA-256
against HMAC-SHA-256 under a tenant's audit key, and a step's cost on an
encrypted SQLite app with the keyed digest as shipped against the plain
digest swapped in, alternated round by round like the chain's.

Step cost: one run of ``--steps`` steps (``app.run``, durability ``process``)
on a fresh database, with the chain and without it, alternated round by
round so drift hits both alike; medians of ``--rounds``, wall and CPU time
per step (the client's: this process), and on PostgreSQL the server's CPU
per step too (``server``: its processes' time on the CPU, ``server_cpu``);
also the client's CPU split into user and system time (``getrusage``: its
split is tick-sampled, its sum exact), its voluntary context switches and
garbage collections, and beside the difference of the medians the median of
each round's on-minus-off (the two runs of a round ran next to each other).
``--in-loop`` alternates the chain run by run on one app instead and times
the store's chain function where the step loop calls it (``in_loop``).
"Off" is the same code with the chain's work taken out of the write:
SQLite's ``_audited`` (the digest and the link) returns no link and no
previous link is read; PostgreSQL's entry parameters carry no digest, no
link and no body (the statement's ``sha256`` of NULL is NULL; the hot path's
``insert_event_linked`` stores the NULL link its parameters carry, after a
NULL one). What "off" keeps (PostgreSQL's read of the entry before, which
also does the time clamp the ``history_monotonic_at`` trigger did before,
and the hot path's check of its link, NULL then) is not counted, so the
PostgreSQL figure is the chain's Python side plus its work in the server.

``--instructions`` counts the CPU instructions of a journaled step instead
(``bench.callcount``'s child, with the chain's work taken out for "off";
``--tree`` counts another checkout's src/; on PostgreSQL the client's
instructions, each count on a fresh database), a figure other processes' load
does not move: the one to compare changes by on a shared machine. Valgrind
runs SHA-256 without the CPU's SHA extensions, so its share is larger
there than natively.

Also measured in-process, without a database: the chain's own work per
entry (digest, link), and the verifier's speed over rows already read,
links only and links plus digests (entries/s, CPU time).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.cairn_workloads import CairnWorkloads, build, build_url
from bench.common import fresh_dir, settle
from cairn.store import auditlinks, postgres, sqlite
from cairn.store.auditverify import verify_chains


@contextlib.contextmanager
def chain(on: bool) -> Iterator[None]:
    """The stores' chain work on (as shipped) or taken out of the write."""
    # (``_linked_params`` is absent from a tree before the hot path computed links: --tree main)
    kept = (sqlite._audited, sqlite._previous_link, postgres._event_params,
            getattr(postgres, "_linked_params", None))
    if not on:
        def no_link(values: Any, event: Any, previous: Any, digester: Any) -> tuple[None, None]:
            return None, None

        def plain_params(event: Any, digester: Any = None) -> dict[str, Any]:
            params = dict(zip(postgres._EVENT_KEYS, postgres.event_values(event), strict=True))
            params.update(digest=None, audit_head=None, audit_tail=None)
            return params

        def plain_linked(event: Any, at_before: float, link_before: Any,
                         digester: Any = None) -> dict[str, Any]:
            values = postgres.event_values(event)
            if values[3] < at_before:  # the clamp is the statement's, not the chain's: kept
                values = (*values[:3], at_before, *values[4:])
            params = dict(zip(postgres._EVENT_KEYS, values, strict=True))
            params.update(digest=None, link=None, previous=link_before)
            return params

        sqlite._audited = no_link  # type: ignore[assignment]
        sqlite._previous_link = lambda conn, event: auditlinks.GENESIS  # type: ignore[assignment]
        postgres._event_params = plain_params  # type: ignore[assignment]
        postgres._linked_params = plain_linked  # type: ignore[assignment]
    try:
        yield
    finally:
        sqlite._audited, sqlite._previous_link, postgres._event_params = kept[:3]  # type: ignore[assignment]
        if kept[3] is not None:
            postgres._linked_params = kept[3]


def step_cost(make: Callable[[], CairnWorkloads], steps: int,
              server: Callable[[], float] | None = None) -> dict[str, float]:
    """Per step of one run of ``steps`` steps: wall and CPU microseconds (the
    client's, this process's), the CPU split into user and system time
    (``getrusage``: its split is the kernel's tick sampling, its sum exact),
    voluntary context switches (a wait on the server that found no answer
    ready), garbage collections (per 1,000 steps), and the server's CPU if
    ``server`` (its CPU seconds so far) is given."""
    w = make()
    try:
        w.app.run(w.chain, 1)  # warm-up: connection and statements ready
        settle()
        served = server() if server is not None else 0.0
        collections = sum(g["collections"] for g in gc.get_stats())
        usage = resource.getrusage(resource.RUSAGE_SELF)
        wall, cpu = time.perf_counter(), time.process_time()
        result = w.app.run(w.chain, steps)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        after = resource.getrusage(resource.RUSAGE_SELF)
        collections = sum(g["collections"] for g in gc.get_stats()) - collections
        served = server() - served if server is not None else 0.0
    finally:
        w.close()
    if result != steps:
        raise RuntimeError(f"chain returned {result!r}, expected {steps}")
    per = 1e6 / steps
    cost = {"wall": wall * per, "CPU": cpu * per,
            "user": (after.ru_utime - usage.ru_utime) * per, "sys": (after.ru_stime - usage.ru_stime) * per,
            "vcsw": (after.ru_nvcsw - usage.ru_nvcsw) / steps, "gc/1k": collections * 1000 / steps}
    if server is not None:
        cost["server"] = served * per
    return cost


def server_cpu(admin: str) -> Callable[[], float]:
    """The CPU seconds the server of ``admin`` has run so far: the
    postmaster and every process it started (backends, WAL writer,
    checkpointer...), from ``/proc/PID/schedstat`` (nanoseconds on the CPU,
    not ticks). A process that ended meanwhile drops out: the benchmark's
    connections stay open through a measured run."""
    import psycopg

    with psycopg.connect(admin, autocommit=True) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    postmaster = int(Path(f"/proc/{row[0]}/stat").read_text().rsplit(")", 1)[1].split()[1])

    def cpu() -> float:
        total = 0
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                if entry.name != str(postmaster) and int(stat.rsplit(")", 1)[1].split()[1]) != postmaster:
                    continue
                total += int((entry / "schedstat").read_text().split()[0])
        return total / 1e9

    return cpu


def sqlite_step(on: bool, steps: int) -> dict[str, float]:
    with fresh_dir(f"audit-{'on' if on else 'off'}") as d, chain(on):
        return step_cost(lambda: build(d / "cairn.sqlite"), steps)


def pg_step(admin: str) -> Callable[[bool, int], dict[str, float]]:
    import psycopg
    from psycopg import sql

    counter = iter(range(10**6))
    server = server_cpu(admin)

    def measure(on: bool, steps: int) -> dict[str, float]:
        name = f"cairn_bench_audit_{next(counter)}"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            from psycopg.conninfo import make_conninfo
            from tests.engine.conftest import postgres_url

            url = postgres_url(make_conninfo(admin, dbname=name))
            with chain(on):
                return step_cost(lambda: build_url(url), steps, server)
        finally:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    return measure


def side_by_side(name: str, measure: Callable[[bool, int], dict[str, float]], steps: int,
                 rounds: int, labels: tuple[str, str] = ("chain on", "off")) -> None:
    on: list[dict[str, float]] = []
    off: list[dict[str, float]] = []
    for i in range(rounds):
        for state in ((True, False) if i % 2 == 0 else (False, True)):
            cost = measure(state, steps)
            (on if state else off).append(cost)
            if RAW:
                print(f"  {name} round {i} {labels[0] if state else labels[1]}: "
                      + ", ".join(f"{k} {v:.2f}" for k, v in cost.items()), flush=True)
    for label in on[0]:
        a = statistics.median(x[label] for x in on)
        b = statistics.median(x[label] for x in off)
        # the two runs of a round ran next to each other: the median of their differences is
        # less moved by load that changes from round to round than the difference of the medians;
        # its spread is printed with it (issue 26, 2026-12-07)
        diffs = [x[label] - y[label] for x, y in zip(on, off, strict=True)]
        unit = "us" if label in _MICROSECONDS else "  "
        spread = paired(diffs) if rounds >= 2 else f"pair {diffs[0]:+.2f}"
        print(f"{name:10} {label:6} per step: {labels[0]} {a:8.2f} {unit}, {labels[1]} {b:8.2f} {unit}, "
              f"difference {a - b:+6.2f} {unit} ({a / b if b else float('nan'):.3f}x); {spread}; "
              f"{rounds} rounds of {steps} steps", flush=True)
    if "server" in on[0]:  # PostgreSQL: the client's CPU and the server's, both the chain's cost
        diffs = [x["CPU"] + x["server"] - y["CPU"] - y["server"] for x, y in zip(on, off, strict=True)]
        if rounds >= 2:
            print(f"{name:10} client + server CPU per step, on minus off: {paired(diffs)}", flush=True)
    if labels[1] == "off" and rounds >= 6:
        diffs = [x["CPU"] - y["CPU"] for x, y in zip(on, off, strict=True)]
        print(f"{name:10} CPU per step, chain on minus off, target {verdict(diffs)}", flush=True)


#: print each round's figures too (``--raw``)
RAW = False
#: the figures of ``step_cost`` in microseconds (the others are counts)
_MICROSECONDS = frozenset(("wall", "CPU", "user", "sys", "server"))

#: the issue's bound on what the chain adds a journaled step (issue 26), microseconds
TARGET_US = 5.0


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free confidence interval of the median of ``values``:
    the order statistics ``x(k)`` and ``x(n+1-k)`` with ``k`` the largest
    for which ``P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2`` (each
    value is above or below the true median with probability one half,
    whatever the distribution of the noise). Needs 6 values or more for 95 %."""
    from math import comb

    ordered = sorted(values)
    n = len(ordered)
    tail = (1 - confidence) / 2
    k, below = 0, 0.0  # below: P(Binomial(n, 1/2) <= k - 1)
    while k < n // 2:
        nxt = below + comb(n, k) / 2**n
        if nxt > tail:
            break
        below, k = nxt, k + 1
    if k == 0:
        return float("-inf"), float("inf")
    return ordered[k - 1], ordered[n - k]


def paired(diffs: list[float]) -> str:
    """The spread of per-round on-minus-off differences (issue 26, 2026-12-07):
    median, interquartile range and a 95 % interval of the median, so that a
    figure near a bound says whether the bound is shown or not, rather than one
    median whose run-to-run moves (several us on this machine) exceed the margin."""
    q1, med, q3 = statistics.quantiles(diffs, n=4, method="inclusive")
    low, high = median_interval(diffs)
    return (f"pairs median {med:+.2f}, IQR {q1:+.2f} to {q3:+.2f}, 95 % CI of the median {low:+.2f} to "
            f"{high:+.2f} ({len(diffs)} pairs)")


def verdict(diffs: list[float], bound: float = TARGET_US, unit: str = "us") -> str:
    """Whether the pairs show the chain within ``bound`` (in ``unit``: other
    benches judge percentages too, bench.encryption): the upper end of the
    median's 95 % interval at or under it ("shown"), its lower end over it
    ("exceeded"), else "not shown" (the noise spans the bound)."""
    low, high = median_interval(diffs)
    if high <= bound:
        return f"<= {bound:g} {unit}: shown"
    if low > bound:
        return f"<= {bound:g} {unit}: exceeded"
    return f"<= {bound:g} {unit}: not shown (the interval spans it)"


def store_append(on: bool, steps: int) -> dict[str, float]:
    """(wall, CPU) microseconds per ``SQLiteStore.append`` of one journal
    entry (a step's result, 40 bytes), the store alone: what the chain adds
    to the write itself, without the engine's noise around it."""
    with fresh_dir(f"audit-append-{'on' if on else 'off'}") as d, chain(on):
        wall, cpu = timed_appends(str(d / "cairn.sqlite"), steps)
    return {"wall": wall, "CPU": cpu}


def timed(function: Callable[..., Any], taken: list[int],
          clock: Callable[[], int] = time.perf_counter_ns) -> Callable[..., Any]:
    """``function``, each call's duration by ``clock`` appended to ``taken``."""
    def call(*args: Any, **keywords: Any) -> Any:
        started = clock()
        result = function(*args, **keywords)
        taken.append(clock() - started)
        return result
    return call


def timed_appends(path: str, steps: int, prepare: Callable[[str], None] | None = None) -> tuple[float, float]:
    """(wall, CPU) microseconds per ``append`` of one 40-byte step result to
    one run of a fresh SQLite store at ``path`` (``prepare``, given the
    store's URL, runs once the store has made its tables)."""
    from cairn.store.records import EventType, HistoryEvent, NewRun, Payload
    from cairn.store.sqlite import SQLiteStore

    store = SQLiteStore(path)
    try:
        if prepare is not None:
            prepare(f"sqlite:///{path}")
        run = NewRun(run_id="r", workflow="w", workflow_version="1", tenant="default", thread_id=None,
                     input=Payload(b"null", None))
        claim = store.create_claimed_run(run, "bench", 60.0)
        assert claim is not None
        seq, epoch = claim.next_seq, claim.run.epoch
        data = b'"' + b"r" * 38 + b'"'
        events = [HistoryEvent("r", seq + i, EventType.STEP_COMPLETED, time.time(), epoch, "bench", i,
                               "step", "inc", "0123456789abcdef", 1, time.time(), Payload(data, None))
                  for i in range(steps + 1)]
        store.append("r", epoch, events[:1])  # warm-up
        settle()
        wall, cpu = time.perf_counter(), time.process_time()
        for event in events[1:]:
            store.append("r", epoch, [event])
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        store.close()
    return wall / steps * 1e6, cpu / steps * 1e6


def rows_of(runs: int, run_steps: int) -> tuple[list[tuple[Any, ...]], dict[str, str]]:
    """Rows as ``audit_entries`` returns them, of a real SQLite store."""
    with fresh_dir("audit-verify") as d:
        w = build(d / "cairn.sqlite")
        try:
            for _ in range(runs):
                w.app.run(w.chain, run_steps)
            store: Any = w.app.store
            return list(store.audit_entries()), store.audit_run_tenants()
        finally:
            w.close()


def chain_work(rows: list[tuple[Any, ...]], repeat: int) -> float:
    """CPU microseconds of the chain's own work per entry (digest and link)."""
    import json

    details = [None if r[14] is None else json.loads(r[14]) for r in rows]
    started = time.process_time()
    for _ in range(repeat):
        previous = auditlinks.GENESIS
        for row, detail in zip(rows, details, strict=True):
            d = auditlinks.digest(row[12], detail)
            previous = auditlinks.link(previous, (*row[:12], row[13]), d)
    return (time.process_time() - started) / (repeat * len(rows)) * 1e6


@contextlib.contextmanager
def keyed(on: bool) -> Iterator[None]:
    """A sealed store's entry digests keyed (as shipped) or the plain
    SHA-256 of before (``AuditKey.digest`` swapped for ``auditlinks.digest``)."""
    kept = auditlinks.AuditKey.digest
    if not on:
        auditlinks.AuditKey.digest = lambda self, data, detail: auditlinks.digest(data, detail)  # type: ignore
    try:
        yield
    finally:
        auditlinks.AuditKey.digest = kept  # type: ignore[method-assign]


def sealed_step(on: bool, steps: int) -> dict[str, float]:
    """A step's cost on an encrypted SQLite app, its digests keyed or plain."""
    import base64

    ring = "kek1 " + base64.b64encode(bytes(32)).decode()
    os.environ["CAIRN_BENCH_KEYS"], os.environ["CAIRN_KEYRING"] = ring, "env:CAIRN_BENCH_KEYS"
    try:
        with fresh_dir(f"audit-keyed-{'on' if on else 'off'}") as d, keyed(on):
            return step_cost(lambda: build(d / "cairn.sqlite"), steps)
    finally:
        del os.environ["CAIRN_KEYRING"], os.environ["CAIRN_BENCH_KEYS"]


def digest_work(rows: list[tuple[Any, ...]], repeat: int) -> tuple[float, float]:
    """CPU microseconds per entry of the plain and of the keyed digest, alternated."""
    import json

    details = [None if r[14] is None else json.loads(r[14]) for r in rows]
    key = auditlinks.AuditKey(bytes(range(32)))
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(repeat * 2):
        use_key = i % 2 == 1
        started = time.process_time()
        for row, detail in zip(rows, details, strict=True):
            if use_key:
                key.digest(row[12], detail)
            else:
                auditlinks.digest(row[12], detail)
        times[use_key].append((time.process_time() - started) / len(rows) * 1e6)
    return statistics.median(times[0]), statistics.median(times[1])


def verify_speed(rows: list[tuple[Any, ...]], tenants: dict[str, str], digests: bool, repeat: int) -> float:
    started = time.process_time()
    for _ in range(repeat):
        chains = verify_chains(rows, tenants, None, check_digests=digests)
        assert not chains.problems, chains.problems[:1]
    return repeat * len(rows) / (time.process_time() - started)


def verify_rates(w: CairnWorkloads, runs: int, run_steps: int, repeat: int,
                 prepare: Callable[[], None] | None = None) -> tuple[int, list[float], list[float]]:
    """``audit verify`` end to end on ``w``'s store (the rows read from the
    database a page at a time, every digest and link checked: what ``cairn
    audit verify`` does before its anchor), after ``runs`` runs of
    ``run_steps`` steps: the entries and each of ``repeat`` passes' entries/s,
    wall and CPU time."""
    from cairn.store.auditverify import verify_store

    for _ in range(runs):
        w.app.run(w.chain, run_steps)
    if prepare is not None:
        prepare()
    store: Any = w.app.store
    walls: list[float] = []
    cpus: list[float] = []
    entries = 0
    for _ in range(repeat):
        settle()
        wall, cpu = time.perf_counter(), time.process_time()
        chains = verify_store(store)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        assert not chains.problems, chains.problems[:1]
        entries = chains.entries
        walls.append(entries / wall)
        cpus.append(entries / cpu)
    return entries, walls, cpus


def report_verify(name: str, entries: int, walls: list[float], cpus: list[float]) -> None:
    print(f"verify {name:8} end to end: {statistics.median(walls):,.0f} entries/s wall, "
          f"{statistics.median(cpus):,.0f} CPU (medians of {len(walls)} passes over {entries:,} entries; "
          f"wall runs {min(walls):,.0f}-{max(walls):,.0f})")


def verify_sqlite(runs: int, run_steps: int, repeat: int) -> None:
    with fresh_dir("audit-verify-e2e") as d:
        w = build(d / "cairn.sqlite")
        try:
            report_verify("sqlite", *verify_rates(w, runs, run_steps, repeat))
        finally:
            w.close()


def verify_postgres(admin: str, runs: int, run_steps: int, repeat: int) -> None:
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo
    from tests.engine.conftest import postgres_url

    name = "cairn_bench_audit_verify"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        w = build_url(postgres_url(make_conninfo(admin, dbname=name)))

        def analyze() -> None:
            # the history table filled in seconds has no statistics yet (autovacuum analyzes it
            # later): without them the planner sorted the whole table for each page (measured: 31 ms
            # a page of 2,000 over 5,000 entries, against 1.2 ms by the primary key once analyzed),
            # until the store pinned the page's plan to the primary key (postgres._AUDIT_BEGIN);
            # both lines are kept to show the two agree
            with psycopg.connect(make_conninfo(admin, dbname=name), autocommit=True) as conn:
                conn.execute("ANALYZE")

        try:
            report_verify("postgres", *verify_rates(w, runs, run_steps, repeat))
            report_verify("pg+stats", *verify_rates(w, 0, run_steps, repeat, analyze))
        finally:
            w.close()
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def instructions(tree: Path, sizes: tuple[int, int], admin: str | None = None, repeat: int = 1) -> None:
    """Instructions per journaled step, chain on and off, as ``bench.callcount
    step`` counts them in ``tree`` (two run sizes, the difference over the
    difference of steps: start-up and the run's own entries cancel out): on
    SQLite, and with ``admin`` (a PostgreSQL administration URL) on a fresh
    database of that server per count as well, the client's instructions
    only (the server's hash is the server's CPU, not counted). ``repeat``
    counts each pair that many times, on and off alternated."""
    from bench import callcount

    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("--instructions needs valgrind (callgrind and callgrind_control)")
    small, large = sizes
    backends: list[tuple[str, Callable[[], contextlib.AbstractContextManager[str | None]]]] = [
        ("sqlite", lambda: contextlib.nullcontext(None))]
    if admin is not None:
        backends.append(("postgres", lambda: fresh_database(admin)))
    with tempfile.TemporaryDirectory(prefix="cairn-bench-audit-ir-") as name:
        work = Path(name)
        for backend, database in backends:
            differences: list[float] = []
            for _ in range(repeat):
                counts = {}
                for n in (small, large):
                    for off in (False, True):
                        with database() as url:
                            counts[(off, n)] = callcount.count(tree, "step", n, work, chain_off=off, url=url)
                on, off = ((counts[(o, large)] - counts[(o, small)]) / (large - small) for o in (False, True))
                print(f"{backend:10} instructions per step ({tree}; callgrind, runs of {small} and {large} "
                      f"steps): chain on {on:,.0f}, off {off:,.0f}, difference {on - off:+,.0f} "
                      f"({on / off:.3f}x)", flush=True)
                differences.append(on - off)
            if repeat > 1:  # a count moves by about 1,000 a step from one process to the next (run ids,
                # times: the same code counted 164,270 and 165,776 "off" on 2026-12-07)
                print(f"{backend:10} instructions per step, chain on minus off: median "
                      f"{statistics.median(differences):+,.0f}, range {min(differences):+,.0f} to "
                      f"{max(differences):+,.0f} ({repeat} pairs of counts)", flush=True)


@contextlib.contextmanager
def fresh_database(admin: str) -> Iterator[str]:
    """A new database on ``admin``'s server, as a ``cairn.App`` URL; dropped after."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo
    from tests.engine.conftest import postgres_url

    name = f"cairn_bench_audit_ir_{os.getpid()}_{time.monotonic_ns()}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield postgres_url(make_conninfo(admin, dbname=name))
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def in_loop(url: str, backend: str, steps: int, rounds: int) -> None:
    """The chain's cost measured inside the engine's step loop, one app on one
    database (``url``), runs of ``steps`` steps with the chain on and off
    alternated run by run (ABBA), so drift and other processes' load fall on
    both within a fraction of a second:

    * the CPU per step of each run (``time.process_time``, nothing else
      timed in these runs), medians, and the spread of the differences of
      the runs side by side (``paired``: median, interquartile range, 95 %
      interval of the median) with the target's ``verdict``;
    * the wall time of each journaled write (``store.append``), a run's
      median, and the spread of the runs' on-minus-off pairs with the
      target's verdict: the whole of the chain's cost in the write (the
      link computed, stored, and on PostgreSQL checked by the server),
      robust to a preempted call; then the same by the thread's CPU
      (``thread_time_ns``), PostgreSQL's client side alone;
    * the wall time of each call of the store's chain function as the loop
      calls it (``postgres._linked_params``, ``sqlite._audited``; chain off:
      ``chain(False)``'s stand-ins), median over the calls: the chain's own
      work in place, caches and TLB as the step leaves them, which a loop of
      hashes in isolation does not see;
    * the link's SHA-256 in the loop, OpenSSL's (``hashlib.sha256``) against
      CPython's own, alternated run by run the same way.
    """
    module: Any = postgres if backend == "postgres" else sqlite
    name = "_linked_params" if backend == "postgres" else "_audited"
    calls: list[int] = []
    w = build_url(url)
    try:
        for state in (True, False):
            with chain(state):
                w.app.run(w.chain, steps)
        # first the step's CPU alone, no function timed (the timer's own cost left out of both
        # sides), ABBA; then the chain function's calls timed in place, ABBA again (issue 26,
        # 2026-12-07: before, both in one pass)
        cpu: dict[bool, list[float]] = {True: [], False: []}
        for i in range(rounds):
            for state in ((True, False) if i % 2 == 0 else (False, True)):
                with chain(state):
                    started = time.process_time()
                    w.app.run(w.chain, steps)
                    cpu[state].append((time.process_time() - started) / steps * 1e6)
        diffs = [a - b for a, b in zip(cpu[True], cpu[False], strict=True)]
        print(f"{backend:10} in loop, CPU per step: chain on {statistics.median(cpu[True]):.2f} us, off "
              f"{statistics.median(cpu[False]):.2f} us; on minus off, {paired(diffs)}; runs of {steps} "
              f"steps; target {verdict(diffs)}", flush=True)
        # the journaled write itself, each ``store.append`` timed, a run's median: a call the
        # scheduler preempted or another process's burst slowed is an outlier the median leaves
        # out, where a run's CPU total keeps it (issue 26, 2026-12-07: the pairs of CPU totals
        # spread over 15-20 us under load; these over 1-2)
        store: Any = w.app.store

        def append_medians(clock: Callable[[], int]) -> dict[bool, list[float]]:
            """Each run's median ``store.append`` call by ``clock``, chain on and off, ABBA."""
            medians: dict[bool, list[float]] = {True: [], False: []}
            for i in range(rounds):
                for state in ((True, False) if i % 2 == 0 else (False, True)):
                    with chain(state):
                        taken: list[int] = []
                        store.append = timed(type(store).append.__get__(store), taken, clock)
                        w.app.run(w.chain, steps)
                        del store.append
                        medians[state].append(statistics.median(taken) / 1e3)
            return medians

        # by wall time (on PostgreSQL the server's part too) and by the calling thread's CPU
        # (``thread_time_ns``: the client's alone on PostgreSQL, where the wall time holds the
        # server's answer and, under load, its waits on the CPU; a system call of about 3 us
        # here, on and off alike)
        for what, clock_of in (("wall", time.perf_counter_ns), ("thread CPU", time.thread_time_ns)):
            writes = append_medians(clock_of)
            diffs = [a - b for a, b in zip(writes[True], writes[False], strict=True)]
            print(f"{backend:10} in loop, store.append a call ({what}, runs' medians): chain on "
                  f"{statistics.median(writes[True]):.2f} us, off {statistics.median(writes[False]):.2f} us; "
                  f"on minus off, {paired(diffs)}; target {verdict(diffs)}", flush=True)
        per_call: dict[bool, list[int]] = {True: [], False: []}
        per_run: dict[bool, list[float]] = {True: [], False: []}
        for i in range(rounds):
            for state in ((True, False) if i % 2 == 0 else (False, True)):
                with chain(state):
                    function = getattr(module, name)
                    setattr(module, name, timed(function, calls))
                    calls.clear()
                    w.app.run(w.chain, steps)
                    setattr(module, name, function)
                    per_call[state].extend(calls)
                    per_run[state].append(statistics.median(calls) / 1e3)
        on, off = (statistics.median(per_call[s]) / 1e3 for s in (True, False))
        quartiles = {s: statistics.quantiles(per_call[s], n=4) for s in (True, False)}
        print(f"{backend:10} in loop, {name} a call: chain on {on:.2f} us (quartiles "
              f"{quartiles[True][0] / 1e3:.2f}-{quartiles[True][2] / 1e3:.2f}), off {off:.2f} us, difference "
              f"{on - off:+.2f} us (medians of {len(per_call[True])} calls); runs' medians on minus off, "
              f"{paired([a - b for a, b in zip(per_run[True], per_run[False], strict=True)])}", flush=True)
        hashes: dict[str, list[int]] = {"OpenSSL": [], "CPython": []}
        kept = auditlinks._SHA256, auditlinks._ONE_BLOCK

        class Hashed:
            __slots__ = ("value",)

            def __init__(self, value: bytes) -> None:
                self.value = value

            def digest(self) -> bytes:
                return self.value

        def timed_hash(sha: Callable[[bytes], Any]) -> Callable[[bytes], Hashed]:
            def call(data: bytes) -> Hashed:
                started = time.perf_counter_ns()
                value = sha(data).digest()
                calls.append(time.perf_counter_ns() - started)
                return Hashed(value)
            return call

        try:
            for i in range(rounds):
                for which in (("OpenSSL", "CPython") if i % 2 == 0 else ("CPython", "OpenSSL")):
                    sha = kept[0] if which == "OpenSSL" else auditlinks._builtin_sha256()
                    # every hash of the chain's writers (entry digest and link) by ``which``
                    auditlinks._SHA256 = auditlinks._ONE_BLOCK = timed_hash(sha)  # type: ignore[assignment]
                    calls.clear()
                    w.app.run(w.chain, steps)
                    hashes[which].extend(calls)
        finally:
            auditlinks._SHA256, auditlinks._ONE_BLOCK = kept
        # since links of version 3 (chain26) a journaled step hashes no SHA-256 without a keyring:
        # what is left is a run's entries the server links (its first after a claim, its finish)
        per_step = len(hashes["OpenSSL"]) / (rounds * steps)
        if len(hashes["OpenSSL"]) < 2 or len(hashes["CPython"]) < 2:
            print(f"{backend:10} in loop, a SHA-256 of the chain: {per_step:.3f} a step, none to time",
                  flush=True)
            return
        quartiles = {which: statistics.quantiles(v, n=4) for which, v in hashes.items()}
        print(f"{backend:10} in loop, a SHA-256 of the chain: " + ", ".join(
            f"{which} {statistics.median(v) / 1e3:.2f} us (quartiles {quartiles[which][0] / 1e3:.2f}"
            f"-{quartiles[which][2] / 1e3:.2f})" for which, v in hashes.items())
            + f"; {len(hashes['OpenSSL'])} hashes each, {per_step:.3f} a step (the writers' SHA-256 calls: "
            "plain entry digests of links of version 1 and 2, and links of version 1)", flush=True)
    finally:
        w.close()


def in_loop_both(steps: int, rounds: int, sqlite_only: bool) -> None:
    """``in_loop`` on a fresh SQLite file and (unless ``sqlite_only``) a fresh PostgreSQL database."""
    with fresh_dir("audit-in-loop") as d:
        in_loop(f"sqlite:///{d / 'cairn.sqlite'}", "sqlite", steps, rounds)
    if sqlite_only:
        return
    from tests import pgcluster

    try:
        with fresh_database(pgcluster.admin_url()) as url:
            assert url is not None
            in_loop(url, "postgres", steps, rounds)
    finally:
        pgcluster.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--sqlite-only", action="store_true")
    parser.add_argument("--postgres-only", action="store_true",
                        help="only the step's cost on PostgreSQL, chain on and off")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--verify-only", action="store_true",
                        help="Only verify's speed end to end (both backends unless --sqlite-only)")
    parser.add_argument("--passes", type=int, default=7, help="verify passes (the median is reported)")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per step under callgrind instead (SQLite, and PostgreSQL's "
                             "client unless --sqlite-only; needs valgrind)")
    parser.add_argument("--repeat", type=int, default=1, help="with --instructions: counts per backend")
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="with --instructions: the source tree counted (default: this one)")
    parser.add_argument("--raw", action="store_true", help="print every round's figures too")
    parser.add_argument("--shown", action="store_true",
                        help="issue 26's figure: instructions per step chain on and off (callgrind, --repeat "
                             "counts each) beside the step's CPU in the loop (--in-loop: --rounds runs of "
                             "--steps, the pairs' median, IQR and 95 %% interval against 5 us)")
    parser.add_argument("--in-loop", action="store_true",
                        help="the chain's cost inside the step loop: runs of --steps alternated on one app "
                             "(--rounds each), the chain function's calls timed in place, OpenSSL's SHA-256 "
                             "against CPython's there")
    args = parser.parse_args()
    global RAW
    RAW = args.raw
    if args.shown:
        print(f"bench.audit --shown {time.strftime('%Y-%m-%d %H:%M:%S')}, load {os.getloadavg()[0]:.2f}, "
              f"tree {args.tree.resolve()}", flush=True)
        sizes = (10, 60) if args.quick else (20, 220)
        if args.sqlite_only:
            instructions(args.tree.resolve(), sizes, repeat=args.repeat)
        else:
            from tests import pgcluster

            instructions(args.tree.resolve(), sizes, pgcluster.admin_url(), args.repeat)
        print(f"load {os.getloadavg()[0]:.2f}", flush=True)
        in_loop_both(args.steps, args.rounds, args.sqlite_only)
        print(f"load {os.getloadavg()[0]:.2f}", flush=True)
        return
    if args.instructions:
        # not larger: with the collector off, runs of 100 and 1100 steps grew the heap past what
        # valgrind's brk segment holds ("brk segment overflow"), and the same "off" code counted
        # 160,646 and 171,901 a step in two trees; runs of 20 and 220 repeat within 0.1 %
        sizes = (10, 60) if args.quick else (20, 220)
        if args.sqlite_only:
            instructions(args.tree.resolve(), sizes, repeat=args.repeat)
            return
        from tests import pgcluster

        try:
            instructions(args.tree.resolve(), sizes, pgcluster.admin_url(), args.repeat)
        finally:
            pgcluster.shutdown()
        return
    if args.verify_only:
        runs, run_steps = (5, 200) if args.quick else (20, 1000)
        verify_sqlite(runs, run_steps, args.passes)
        if not args.sqlite_only:
            from tests import pgcluster

            try:
                verify_postgres(pgcluster.admin_url(), runs, run_steps, args.passes)
            finally:
                pgcluster.shutdown()
        return
    steps, rounds = (300, 3) if args.quick else (args.steps, args.rounds)
    print(f"bench.audit {time.strftime('%Y-%m-%d %H:%M:%S')}, load {os.getloadavg()[0]:.2f}")
    if args.in_loop:
        in_loop_both(steps, rounds, args.sqlite_only)
        return
    if args.postgres_only:
        postgres_side_by_side(steps, rounds)
        return
    rows, tenants = rows_of(5 if args.quick else 20, 200 if args.quick else 1000)
    work = chain_work(rows, 3)
    print(f"chain work alone: {work:.2f} us CPU per entry (digest + link), {len(rows)} entries")
    for digests in (False, True):
        what = "links and digests" if digests else "links only"
        print(f"verify ({what}): {verify_speed(rows, tenants, digests, 3):,.0f} entries/s CPU")
    plain, keyed_us = digest_work(rows, 5)
    print(f"entry digest alone: plain SHA-256 {plain:.2f} us, keyed (HMAC-SHA-256) {keyed_us:.2f} us CPU, "
          f"difference {keyed_us - plain:+.2f} us per entry")
    side_by_side("sealed", sealed_step, steps, rounds, ("keyed", "plain"))
    side_by_side("append", store_append, steps * 5, rounds)
    side_by_side("sqlite", sqlite_step, steps, rounds)
    if not args.sqlite_only:
        postgres_side_by_side(steps, rounds)


def postgres_side_by_side(steps: int, rounds: int) -> None:
    """The step's cost on PostgreSQL, chain on and off, on a throwaway cluster."""
    from tests import pgcluster

    try:
        side_by_side("postgres", pg_step(pgcluster.admin_url()), steps, rounds)
    finally:
        pgcluster.shutdown()


if __name__ == "__main__":
    main()
