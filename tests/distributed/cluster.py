"""Real worker processes on a real PostgreSQL server, and ways to judge what they did.

* ``PgServer`` restarts, stops and starts the session's private PostgreSQL
  cluster with ``pg_ctl`` (a real server restart: every connection dies) and
  waits, boundedly, for it to accept connections again.
* ``DistCluster`` (a ``WorkerPool`` of the one crash harness,
  ``tests/acceptance/harness.py``) owns a bank process, an effects file and
  the worker subprocesses (``python -m tests.distributed.run_worker``) on a
  store (``tests/backends.py``: this tier's is a fresh PostgreSQL database per
  test), and kills every child when the test ends (``cleanup``).
* ``Observer`` reads the database outside Cairn, across restarts.
* ``verify_runs`` compares the bank's ledger with the runs' journals and
  audits every history; it returns counts for the test's report.
"""

from __future__ import annotations

import contextlib
import functools
import re
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

import cairn
from cairn.demo.bank import BankProcess, Transfer
from cairn.store.records import EventType, HistoryEvent, RunStatus
from tests.acceptance.harness import (
    WorkerPool,
    WorkerProcess,
    audit_history,
    journal,
    wait_until,
)
from tests.backends import PostgresBackend, StoreBackend, application_name, with_query
from tests.distributed.bank_app import (
    BANK_ENV,
    DB_ENV,
    EFFECTS_ENV,
    TOOL,
    account,
    amount_cents,
    build_app,
    expected_total,
    memo,
)
from tests.pgcluster import PrivateCluster

#: the schema the tests' stores use (exercises ``?schema=``)
SCHEMA = "cairn_dist"


# -- the server --------------------------------------------------------------------------------


@dataclass
class Outage:
    """One restart (or stop and start) of the server, as the test saw it."""

    action: str
    mode: str
    began: float
    #: when the server was down (the stop returned)
    down: float | None = None
    #: when it accepted connections again
    up: float | None = None

    @property
    def seconds(self) -> float:
        """How long the server refused connections."""
        return (self.up or self.began) - (self.down or self.began)

    def __str__(self) -> str:
        return f"{self.action} -m {self.mode}: connections refused for {self.seconds:.2f}s"


class PgServer:
    """The session's private PostgreSQL cluster (``tests/pgcluster.py``),
    restarted, stopped and started with ``pg_ctl``: only a server the tests
    started themselves is ever restarted."""

    def __init__(self, cluster: PrivateCluster) -> None:
        self.cluster = cluster
        self.admin_url = cluster.url
        self.outages: list[Outage] = []

    def is_up(self, timeout: int = 2) -> bool:
        return self.cluster.is_up(timeout)

    def wait_up(self, timeout: float = 60.0) -> float:
        wait_until(self.is_up, timeout, "PostgreSQL to accept connections", interval=0.05)
        return time.time()

    @contextlib.contextmanager
    def _probing(self, outage: Outage) -> Iterator[None]:
        """Probe the server on a thread while the block runs: ``outage.down``
        becomes the first probe that failed (if not set yet), ``outage.up``
        the first that succeeded after one failed (``pg_ctl`` itself
        returns a while after the server accepts connections again)."""
        done = threading.Event()

        def probe() -> None:
            while not done.is_set():
                ok = self.is_up(timeout=1)
                if not ok and outage.down is None:
                    outage.down = time.time()
                elif ok and outage.down is not None:
                    outage.up = time.time()
                    return
                time.sleep(0.02)

        prober = threading.Thread(target=probe, name="pg-outage-probe", daemon=True)
        prober.start()
        try:
            yield
        finally:
            done.set()
            prober.join(5)

    def restart(self, mode: str = "fast") -> Outage:
        """Restart the server (every connection dies); return once it accepts connections."""
        outage = Outage("restart", mode, time.time())
        self.outages.append(outage)
        with self._probing(outage):
            self.cluster.restart(mode)
            up = self.wait_up()
        if outage.down is None or outage.up is None:  # the probes missed the outage: too short to see
            outage.down = outage.down or outage.began
            outage.up = up
        return outage

    def stop(self, mode: str = "fast") -> Outage:
        """Stop the server; ``down`` is when the stop returned (it is down by then)."""
        outage = Outage("stop+start", mode, time.time())
        self.outages.append(outage)
        self.cluster.stop(mode)
        outage.down = time.time()
        return outage

    def start(self, outage: Outage) -> Outage:
        """Start the server again; ``up`` is when it first accepted a connection."""
        with self._probing(outage):
            self.cluster.start()
            up = self.wait_up()
        outage.up = outage.up or up
        return outage

    def ensure_running(self) -> None:
        """Start the server if a test left it stopped (finalizers call this)."""
        if self.is_up():
            return
        if not self.cluster.running():
            self.cluster.start()
        self.wait_up()


# -- reading the database outside Cairn -------------------------------------------------------


class Observer:
    """Reads the database outside Cairn, reconnecting across server restarts."""

    def __init__(self, database: PostgresBackend) -> None:
        self.database = database
        self._conn: psycopg.Connection[Any] | None = None

    def query(self, statement: str, params: Any = None) -> list[tuple[Any, ...]] | None:
        """The rows, or ``None`` while the server cannot be reached."""
        try:
            if self._conn is None or self._conn.closed:
                self._conn = self.database.connect(timeout=2)
            return list(self._conn.execute(statement, params).fetchall())
        except psycopg.Error:
            self.close()
            return None

    def statuses(self) -> Counter[str] | None:
        rows = self.query("SELECT status, count(*) FROM runs GROUP BY status")
        return None if rows is None else Counter({str(status): int(n) for status, n in rows})

    def sessions(self, application_name: str) -> list[tuple[int, str]] | None:
        """(pid, state) of the server sessions of ``application_name`` in this database."""
        rows = self.query(
            "SELECT pid, coalesce(state, '') FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s AND pid <> pg_backend_pid()",
            (application_name,))
        return None if rows is None else [(int(pid), str(state)) for pid, state in rows]

    def terminate(self, application_name: str) -> int:
        """Cut every connection of ``application_name`` to this database; how many were cut."""
        rows = self.query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s AND pid <> pg_backend_pid()",
            (application_name,))
        return sum(1 for (ok,) in rows or [] if ok)

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
        self._conn = None


# -- worker processes, the bank, the effects file ----------------------------------------------


def _launched(worker: WorkerProcess) -> bool:
    """Whether the launcher handles SIGTERM yet (or the process is gone)."""
    return not worker.alive() or f"worker {worker.worker_id} launching" in worker.log_text()


class DistCluster(WorkerPool):
    """A store, a bank, an effects file, and the worker processes moving money
    (``python -m tests.distributed.run_worker``) on them."""

    def __init__(self, directory: Path, backend: StoreBackend, bank: BankProcess) -> None:
        super().__init__(directory, backend)
        self.bank = bank
        self._observer: Observer | None = None

    @property
    def database(self) -> PostgresBackend:
        assert isinstance(self.backend, PostgresBackend), f"not a PostgreSQL store: {self.backend.name}"
        return self.backend

    @property
    def observer(self) -> Observer:
        """Reads the PostgreSQL database outside Cairn (PostgreSQL stores only)."""
        if self._observer is None:
            self._observer = Observer(self.database)
        return self._observer

    def app(self, lease_seconds: float = 2.0) -> cairn.App:
        """An App in this process on the shared database (closed at cleanup)."""
        url = self.db_url
        if isinstance(self.backend, PostgresBackend):
            url = with_query(url, application_name="cairn-dist-test")
        return self._keep(build_app(url, self.bank.url, self.effects_path, lease_seconds=lease_seconds))

    def spawn(
        self,
        worker_id: str,
        *,
        concurrency: int = 1,
        lease: float = 2.0,
        poll_interval: float = 0.02,
        max_recoveries: int = 1000,
        env: Mapping[str, str] | None = None,
    ) -> WorkerProcess:
        """Start ``python -m tests.distributed.run_worker`` in its own session;
        on PostgreSQL its connections carry ``application_name(worker_id)``."""
        environment = {DB_ENV: self.db_url, BANK_ENV: self.bank.url, EFFECTS_ENV: str(self.effects_path)}
        environment.update(env or {})
        args = ["--concurrency", str(concurrency), "--lease", f"{lease:g}", "--poll-interval",
                f"{poll_interval:g}", "--max-recoveries", str(max_recoveries)]
        if isinstance(self.backend, PostgresBackend):
            args += ["--application-name", application_name(worker_id)]
        return self._launch("tests.distributed.run_worker", worker_id, args, environment)

    def terminate_gracefully(self, workers: Iterable[WorkerProcess], timeout: float = 30.0) -> None:
        """SIGTERM (drain) every live worker of ``workers``; each must exit 0 in time."""
        live = [w for w in workers if w.alive()]
        for worker in live:  # a process still importing would die of the SIGTERM instead of draining
            wait_until(functools.partial(_launched, worker), timeout, f"worker {worker.worker_id} to launch")
            worker.send(signal.SIGTERM)
        for worker in live:
            code = worker.wait_exit(timeout)
            assert code == 0, f"worker {worker.worker_id} exited with {code}:\n{worker.log_tail()}"

    def describe_workers(self, tail: int = 12) -> str:
        return super().describe_workers(tail)

    def outcomes(self) -> list[Outcome]:
        return [o for w in self.workers for o in outcomes(w)]

    def cleanup(self) -> None:
        super().cleanup()
        if self._observer is not None:
            self._observer.close()


# -- judging the outcome -----------------------------------------------------------------------

_OUTCOME = re.compile(r"^(\d+\.\d+) pid=\d+ run_worker INFO outcome run=(\S+) epoch=(\d+) status=(\w+)$",
                      re.MULTILINE)


@dataclass(frozen=True)
class Outcome:
    """How one claim ended, from the worker's log (``run_worker`` reports each)."""

    at: float
    worker: str
    run_id: str
    epoch: int
    status: str  # completed, failed, suspended, released, lost, abandoned, halted


def outcomes(worker: WorkerProcess) -> list[Outcome]:
    return [Outcome(float(at), worker.worker_id, run_id, int(epoch), status)
            for at, run_id, epoch, status in _OUTCOME.findall(worker.log_text())]


def worked_after_giving_up(ended: Iterable[Outcome], effects: Iterable[dict[str, Any]]) -> list[str]:
    """Tool bodies that began under a lease after its execution had ended
    abandoned (a write failed) or lost (fenced out): work it could not record."""
    gave_up = {(o.run_id, o.epoch): o for o in ended if o.status in ("abandoned", "lost")}
    problems = []
    for effect in effects:
        o = gave_up.get((effect["run_id"], effect["epoch"]))
        if effect["kind"] == "begin" and o is not None and effect["t0"] > o.at:
            problems.append(f"run {o.run_id}: body at position {effect['position']} began at "
                            f"{effect['t0']:.3f} under epoch {o.epoch}, after that execution ended "
                            f"{o.status} at {o.at:.3f}")
    return problems

_LEASE_STARTS = frozenset({EventType.LEASE_CLAIMED, EventType.LEASE_TAKEN_OVER})
_LEASE_ENDS = frozenset({EventType.LEASE_LOST, EventType.RUN_SUSPENDED, EventType.RUN_RELEASED,
                         EventType.RUN_COMPLETED, EventType.RUN_FAILED, EventType.RUN_NEEDS_ATTENTION})
_OP_EVENTS = frozenset({EventType.OP_INTENT, EventType.OP_RECONCILED})


def audit(history: list[HistoryEvent]) -> list[str]:
    """The harness's fencing audit (``audit_history``), extended to the
    ``op.*`` entries of write tools, which it does not know: those too must be
    written by the holder of the lease current at that point."""
    op_entries = {f"seq {e.seq} {e.event.value} (epoch {e.epoch}, worker {e.worker}): "
                  "unexpected entry for these workflows" for e in history if e.event in _OP_EVENTS}
    problems = [p for p in audit_history(history) if p not in op_entries]
    holder: tuple[int, str | None] | None = None
    for event in history:
        if event.event in _LEASE_STARTS:
            holder = (event.epoch, event.worker)
        elif event.event in _LEASE_ENDS:
            holder = None
        elif event.event in _OP_EVENTS and (event.epoch, event.worker) != holder:
            problems.append(f"seq {event.seq} {event.event.value} (epoch {event.epoch}, worker "
                            f"{event.worker}): written outside the current lease {holder}")
    return problems


@dataclass
class Verdict:
    """What ``verify_runs`` counted (all checks passed if it returned one)."""

    runs: int = 0
    transfers: int = 0
    bodies: int = 0
    resent: int = 0  # (run, position)s whose body ran more than once (same key: the bank deduplicated)
    replayed_posts: int = 0  # POSTs the bank answered with an existing transfer
    stale_bodies: int = 0  # bodies of a superseded lease that began after the step was recorded
    reconciled: Counter[str] = field(default_factory=Counter)
    takeovers: int = 0
    claims: int = 0
    epochs_max: int = 0

    def __str__(self) -> str:
        return (f"{self.runs} runs, {self.transfers} transfers, {self.bodies} tool-body executions "
                f"({self.resent} positions sent more than once, {self.replayed_posts} POSTs answered with "
                f"the existing transfer, {self.stale_bodies} bodies of superseded leases after the record), "
                f"reconciliations {dict(self.reconciled)}, {self.claims} claims, "
                f"{self.takeovers} takeovers, highest epoch {self.epochs_max}")


def verify_runs(
    app: cairn.App,
    transfers: list[Transfer],
    effects: list[dict[str, Any]],
    runs: Mapping[str, int],
    steps: int,
    context: str = "",
) -> Verdict:
    """Every run completed with the right total; the bank holds exactly one
    transfer per (run, step), keyed by the operation id of that call's intent,
    with the right amount, account and memo; each ``step.completed`` records
    the very transfer the bank holds; no recorded step ran again; every tool
    body ran behind a durable intent of its own lease; every history passes
    the fencing audit. Raises ``AssertionError`` naming the first problems."""
    verdict = Verdict(runs=len(runs), transfers=len(transfers))
    problems: list[str] = []
    expected: dict[str, tuple[str, int, int]] = {}  # key -> (run id, run index, position)
    for run_id, index in runs.items():
        for position in range(steps):
            expected[cairn.operation_id(run_id, position)] = (run_id, index, position)

    # the bank's ledger on its own
    keys = Counter(t.idempotency_key for t in transfers)
    problems += [f"key {k} used by {n} transfers at the bank" for k, n in keys.items() if n > 1]
    memos = Counter(t.memo for t in transfers)
    problems += [f"{n} transfers with memo {m!r}: a step moved money more than once"
                 for m, n in memos.items() if n > 1]
    if len(transfers) != len(runs) * steps:
        problems.append(f"the bank holds {len(transfers)} transfers, expected {len(runs) * steps}")
    bank_by_key = {t.idempotency_key: t for t in transfers}
    for key, t in bank_by_key.items():
        if key not in expected:
            problems.append(f"transfer {t.id} ({t.memo!r}) has key {key}, no operation id of any step")
            continue
        _, index, position = expected[key]
        if (t.amount_cents, t.to_account, t.memo) != (amount_cents(index, position), account(index),
                                                       memo(index, position)):
            problems.append(f"transfer {t.id} under key {key} is {t.amount_cents} to {t.to_account} "
                            f"({t.memo!r}), not step {position} of run {index}")
    missing = sorted(set(expected) - set(bank_by_key))
    if missing:
        problems.append(f"{len(missing)} steps moved no money, e.g. {[expected[k] for k in missing[:3]]}")

    # the journals
    completed_at: dict[tuple[str, int], HistoryEvent] = {}
    covered: set[tuple[str, int, int]] = set()  # (run, position, epoch) with a durable intent/not_found
    intent_keys: set[str] = set()
    for run_id, index in runs.items():
        record = app.get_run(run_id)
        history = app.history(run_id)
        where = f"run {run_id} (index {index})"
        if record.status is not RunStatus.COMPLETED:
            problems.append(f"{where} is {record.status.value}: {record.error}")
            continue
        result = app.handle(run_id).result(timeout=5)
        if result != expected_total(index, steps):
            problems.append(f"{where} returned {result}, expected {expected_total(index, steps)}")
        problems += [f"{where}: {p}" for p in audit(history)]
        try:
            outcomes = journal(history)
        except AssertionError as exc:  # a position journaled twice
            problems.append(str(exc))
            continue
        if sorted(outcomes) != list(range(steps)):
            problems.append(f"{where} journaled positions {sorted(outcomes)}")
        verdict.epochs_max = max(verdict.epochs_max, record.epoch)
        for event in history:
            detail = event.detail or {}
            if event.event is EventType.LEASE_TAKEN_OVER:
                verdict.takeovers += 1
            if event.event in _LEASE_STARTS:
                verdict.claims += 1
            if event.position is None:
                continue
            if event.event is EventType.OP_INTENT:
                op_id = str(detail.get("operation_id"))
                intent_keys.add(op_id)
                if op_id != cairn.operation_id(run_id, event.position):
                    problems.append(f"{where}: intent at {event.position} has operation id {op_id}")
                covered.add((run_id, event.position, event.epoch))
            elif event.event is EventType.OP_RECONCILED:
                verdict.reconciled[str(detail.get("outcome"))] += 1
                if detail.get("outcome") == "not_found":
                    covered.add((run_id, event.position, event.epoch))
        for position, event in outcomes.items():
            completed_at[(run_id, position)] = event
            detail = event.detail or {}
            if detail.get("reconciled") == "done":
                verdict.reconciled["done"] += 1
            if event.event is not EventType.STEP_COMPLETED or event.name != TOOL or event.payload is None:
                problems.append(f"{where}: position {position} settled by {event.event.value} {event.name}")
                continue
            recorded = app.runtime.payloads.load(event.payload, Transfer, what=f"{where} position {position}")
            at_bank = bank_by_key.get(cairn.operation_id(run_id, position))
            if at_bank is None or recorded != at_bank:
                problems.append(f"{where}: position {position} recorded {recorded}, the bank holds {at_bank}")
    if intent_keys != set(bank_by_key):
        problems.append(f"bank keys and intents' operation ids differ: "
                        f"{len(set(bank_by_key) - intent_keys)} keys without intent, "
                        f"{len(intent_keys - set(bank_by_key))} intents without transfer")

    # what the tool bodies did (the effects file)
    bodies: defaultdict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for effect in effects:
        if effect["kind"] == "end" and effect.get("replayed"):
            verdict.replayed_posts += 1
        if effect["kind"] != "begin" or effect["run_id"] not in runs:
            continue
        verdict.bodies += 1
        spot = (effect["run_id"], effect["position"])
        bodies[spot].append(effect)
        if (effect["run_id"], effect["position"], effect["epoch"]) not in covered:
            problems.append(f"tool body at {spot} ran under epoch {effect['epoch']} ({effect['worker']}) "
                            "without a durable intent (or not_found reconciliation) of that lease")
        done = completed_at.get(spot)
        if done is None:
            continue
        # A lease claimed after the step was recorded (a higher epoch: a claim commits after every
        # append of the lease before it, or that append is refused) sees the record and must replay
        # it; the recording lease itself must not run it again either.
        if effect["epoch"] > done.epoch or (effect["epoch"] == done.epoch and effect["t0"] > done.at):
            problems.append(f"recorded step re-ran: body at {spot} began at {effect['t0']:.3f} under epoch "
                            f"{effect['epoch']} ({effect['worker']}), but it was recorded at {done.at:.3f} "
                            f"under epoch {done.epoch} ({done.worker})")
        elif effect["t0"] > done.at:
            # an older lease, frozen after its intent, woke up and ran its body after the takeover:
            # the bank deduplicates the key and the fence refuses its record (checked above)
            verdict.stale_bodies += 1
    verdict.resent = sum(1 for records in bodies.values() if len(records) > 1)
    if problems:
        shown = "\n  ".join(problems[:25])
        raise AssertionError(f"{len(problems)} problem(s) {context}:\n  {shown}")
    return verdict
