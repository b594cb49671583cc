"""Real worker processes for the acceptance tests, and ways to read what they did.

This is the one crash harness of the project: the acceptance tier (the
workflows of ``tests.acceptance.apps``) and the distributed tier (bank
transfers, ``tests.distributed.cluster``) both build on it, on SQLite and on
PostgreSQL alike (``tests/backends.py`` holds what differs).

* ``WorkerPool`` owns a store and an effects file, launches worker
  subprocesses on them, and kills every child it spawned when the test ends
  (``cleanup``, called by the fixtures' finalizers). ``Cluster`` runs the
  acceptance workflows. Nothing here simulates death: ``kill`` is a real
  SIGKILL, ``stop``/``cont`` real SIGSTOP/SIGCONT.
* ``stop_outside_transaction`` freezes a worker at a moment it holds no
  write transaction open, on either backend.
* ``wait_until`` polls a condition against a deadline; no wait is unbounded.
* ``read_effects`` parses the effects file written by the step bodies of
  ``tests.acceptance.apps``; ``audit_history`` checks a run's history for the
  fencing rules (gap-free ``seq``, every entry written under the current lease).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import cairn
from cairn.store.records import EventType, HistoryEvent
from tests import processes
from tests.acceptance.apps import DB_ENV, EFFECTS_ENV, build_app
from tests.backends import SqliteBackend, StoreBackend
from tests.backends import write_locked as write_locked  # tests/payments uses it from here
from tests.timing import SLACK

REPO_ROOT = processes.REPO_ROOT

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T],
    timeout: float,
    what: str | Callable[[], str],
    interval: float = 0.02,
) -> T:
    """Poll ``condition`` until it returns something truthy (returned), or fail
    with an ``AssertionError`` naming ``what`` once ``timeout`` seconds passed
    ``SLACK`` times over: ``timeout`` is what a quiet machine needs, the slack
    what a loaded one does (``tests.timing``); either way a hang ends."""
    limit = timeout * SLACK
    deadline = time.monotonic() + limit
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            description = what() if callable(what) else what
            raise AssertionError(
                f"timed out after {limit:.1f}s ({timeout:g}s x {SLACK:g}) waiting for {description}")
        time.sleep(interval)


@dataclass
class WorkerProcess:
    """One worker subprocess and what the test did to it."""

    worker_id: str
    #: a child of the test process, or of a ``processes.Zygote`` (``WorkerPool._launch``'s ``preload``)
    popen: subprocess.Popen[bytes] | processes.Forked
    log_path: Path
    spawned_at: float
    #: when the test saw the process gone (after a kill, or an exit it waited for)
    ended_at: float | None = None
    #: set once the test SIGKILLed it
    killed: bool = False
    signals: list[tuple[float, str]] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def send(self, sig: signal.Signals) -> float:
        """Send ``sig``; return the time it was sent."""
        at = time.time()
        self.popen.send_signal(sig)
        self.signals.append((at, sig.name))
        return at

    def kill(self, timeout: float = 10.0) -> float:
        """SIGKILL the process and reap it; return the time of the kill."""
        at = self.send(signal.SIGKILL)
        self.popen.wait(timeout=timeout * SLACK)
        self.killed = True
        self.ended_at = time.time()
        return at

    def wait_exit(self, timeout: float) -> int:
        """The exit code, waiting at most ``timeout`` seconds (on a quiet machine:
        ``SLACK`` times that) before an AssertionError."""
        try:
            code = self.popen.wait(timeout=timeout * SLACK)
        except subprocess.TimeoutExpired:
            # the worker modules dump every thread's stack to their log on SIGUSR1
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGUSR1)
                time.sleep(1.0)
            raise AssertionError(
                f"worker {self.worker_id} (pid {self.pid}) still running {timeout * SLACK:g}s after "
                f"{self.signals[-1][1] if self.signals else 'start'}; log tail with its threads' "
                f"stacks:\n{self.log_tail(80)}"
            ) from None
        self.ended_at = time.time()
        return code

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 25) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


class FakeClock:
    """A clock that moves only when told to (for stores built with ``clock=``)."""

    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def process_state(pid: int) -> str:
    """The one-letter state of ``pid`` from /proc (``T`` when stopped)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


#: nanosleep and clock_nanosleep: where SQLite's busy handler waits for a lock
_SLEEP_SYSCALLS = {"x86_64": {35, 230}, "aarch64": {101, 115}}


def sleeping_in_syscall(pid: int) -> bool:
    """Whether the main thread of ``pid`` is in nanosleep (an idle worker waits
    on a futex instead, so this means: waiting in SQLite's busy handler)."""
    with open(f"/proc/{pid}/task/{pid}/syscall") as f:
        fields = f.read().split()
    return fields[0].isdigit() and int(fields[0]) in _SLEEP_SYSCALLS.get(os.uname().machine, set())


def any_thread_sleeping_in_syscall(pid: int) -> bool:
    """Whether some thread of ``pid`` is in nanosleep: a worker's claim waiting
    in SQLite's busy handler, whichever thread makes it."""
    sleeps = _SLEEP_SYSCALLS.get(os.uname().machine, set())
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/syscall") as f:
                fields = f.read().split()
        except OSError:  # the thread ended meanwhile
            continue
        if fields and fields[0].isdigit() and int(fields[0]) in sleeps:
            return True
    return False


def thread_syscalls(pid: int) -> str:
    """Each thread of ``pid`` with the system call it is in (or ``running``):
    for the message of a test that waited in vain for ``sleeping_in_syscall``."""
    shown = []
    for task in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
        try:
            where = f"/proc/{pid}/task/{task}"
            with open(f"{where}/comm") as comm, open(f"{where}/syscall") as call:
                shown.append(f"{task} {comm.read().strip()}: {call.read().split()[0]}")
        except OSError:
            continue
    return "; ".join(shown)


def can_see_syscalls() -> bool:
    return sys.platform == "linux" and os.uname().machine in _SLEEP_SYSCALLS


def stop_outside_transaction(worker: WorkerProcess, backend: StoreBackend, attempts: int = 25) -> float:
    """SIGSTOP ``worker`` at a moment it holds no write transaction open (a
    process frozen inside one would block the takeover on the database's
    locks, SQLite's write lock or PostgreSQL's row locks: a property of the
    database, not what a fencing test is about). Returns the time of the
    SIGSTOP that stuck."""
    for _ in range(attempts):
        stopped_at = worker.send(signal.SIGSTOP)
        wait_until(lambda: process_state(worker.pid) == "T", 5, f"pid {worker.pid} to stop")
        if not backend.in_transaction(worker.worker_id):
            return stopped_at
        worker.send(signal.SIGCONT)
        time.sleep(0.01)
    raise AssertionError(f"worker {worker.worker_id} was inside a transaction at each of {attempts} stops")


class WorkerPool:
    """Worker subprocesses on one store, and an effects file they append to.

    Subclasses say which worker module to run and how (``spawn``) and which
    app the test process uses (``app``); this base launches, describes and
    reaps the processes: every child is SIGKILLed and reaped at ``cleanup``
    (the fixtures' finalizers), stopped ones included.
    """

    def __init__(self, directory: Path, backend: StoreBackend) -> None:
        self.directory = directory
        self.backend = backend
        self.effects_path = directory / "effects.jsonl"
        self.effects_path.touch()
        self.workers: list[WorkerProcess] = []
        self._apps: list[cairn.App] = []
        self._zygotes: dict[str, processes.Zygote] = {}

    @property
    def db_url(self) -> str:
        return self.backend.url

    def _launch(self, module: str, worker_id: str, args: list[str], env: Mapping[str, str], *,
                preload: Sequence[str] | None = None) -> WorkerProcess:
        """Start ``python -m module --worker-id worker_id *args`` in its own
        session, from the repository root, its output in a log file. With
        ``preload`` it is forked from this pool's zygote of ``module``, which
        imported ``module`` and ``preload`` once (``processes.Zygote``): a test
        that starts a worker again after each of dozens of kills waits for no
        imports."""
        log_path = self.directory / f"worker-{len(self.workers):03d}-{worker_id}.log"
        arguments = ["--worker-id", worker_id, *args]
        popen: subprocess.Popen[bytes] | processes.Forked
        if preload is None:
            spawned_at = time.time()
            # (a fault plan of the test process is not the worker's unless the test passes one)
            popen = processes.spawn(module, arguments, env=env, log=log_path)
        else:
            zygote = self._zygotes.get(module)
            if zygote is None:
                zygote = processes.Zygote(module, preload=preload,
                                          log=self.directory / f"zygote-{module}.log")
                self._zygotes[module] = zygote
            spawned_at = time.time()
            popen = zygote.spawn(arguments, env=env, log=log_path)
        worker = WorkerProcess(worker_id, popen, log_path, spawned_at)
        self.workers.append(worker)
        return worker

    def _keep(self, app: cairn.App) -> cairn.App:
        self._apps.append(app)
        return app

    def close_app(self, app: cairn.App) -> None:
        app.close()
        with contextlib.suppress(ValueError):
            self._apps.remove(app)

    def effects(self) -> list[dict[str, Any]]:
        return read_effects(self.effects_path)

    def describe_workers(self, tail: int = 15) -> str:
        parts = []
        for w in self.workers:
            state = "alive" if w.alive() else f"exit={w.popen.returncode}"
            parts.append(f"--- {w.worker_id} pid={w.pid} {state} killed={w.killed} ---\n{w.log_tail(tail)}")
        return "\n".join(parts)

    def cleanup(self) -> None:
        """SIGKILL and reap every child still alive (stopped ones included); close apps."""
        for worker in self.workers:
            if worker.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.popen.send_signal(signal.SIGKILL)
            try:
                worker.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - would leak a process
                print(f"could not reap worker pid {worker.pid}", file=sys.stderr)
        for zygote in self._zygotes.values():  # after its children: a poll asks the zygote
            zygote.close()
        self._zygotes.clear()
        for app in self._apps:
            with contextlib.suppress(Exception):
                app.close()
        self._apps.clear()


class Cluster(WorkerPool):
    """Workers running ``tests.acceptance.apps`` on the test's store (SQLite
    or PostgreSQL, see ``tests/backends.py``)."""

    @property
    def db_path(self) -> Path:
        """The SQLite file (tests that reach into SQLite itself run on SQLite only)."""
        assert isinstance(self.backend, SqliteBackend), f"not a SQLite store: {self.backend.name}"
        return self.backend.path

    def app(self, lease_seconds: float = 1.0, max_recoveries: int = 50) -> cairn.App:
        """An App in this process on the shared database (closed at cleanup)."""
        return self._keep(build_app(self.db_url, self.effects_path, lease_seconds=lease_seconds,
                                    max_recoveries=max_recoveries))

    def spawn(
        self,
        worker_id: str,
        *,
        concurrency: int = 1,
        lease: float = 1.0,
        poll_interval: float = 0.02,
        max_recoveries: int = 50,
        env: dict[str, str] | None = None,
        forked: bool = False,
    ) -> WorkerProcess:
        """Start ``python -m tests.acceptance.run_worker`` in its own session
        (``forked``: from a zygote that imported Cairn once, see ``_launch``)."""
        environment = {DB_ENV: self.backend.worker_url(worker_id), EFFECTS_ENV: str(self.effects_path)}
        environment.update(env or {})
        args = ["--concurrency", str(concurrency), "--lease", str(lease),
                "--poll-interval", str(poll_interval), "--max-recoveries", str(max_recoveries)]
        preload = processes.WORKER_PRELOAD if forked else None
        return self._launch("tests.acceptance.run_worker", worker_id, args, environment, preload=preload)


# -- reading what happened ---------------------------------------------------------


def read_effects(path: Path) -> list[dict[str, Any]]:
    """Every line of the effects file, parsed; a torn line is an error."""
    text = path.read_text()
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            raise AssertionError(f"effects file line {number} is not JSON: {line!r}") from None
    if text and not text.endswith("\n"):
        raise AssertionError(f"effects file ends with a torn line: {text.splitlines()[-1]!r}")
    return records


Key = tuple[str, int]


def by_key(effects: Iterable[dict[str, Any]], kind: str) -> dict[Key, list[dict[str, Any]]]:
    """Effects of ``kind`` ("begin" or "end") grouped by (run_id, position), in t0 order."""
    grouped: dict[Key, list[dict[str, Any]]] = defaultdict(list)
    for record in effects:
        if record["kind"] == kind:
            grouped[(record["run_id"], record["position"])].append(record)
    for records in grouped.values():
        records.sort(key=lambda r: r["t0"])
    return dict(grouped)


def journal(history: Iterable[HistoryEvent]) -> dict[int, HistoryEvent]:
    """position -> its ``step.completed`` entry (an AssertionError if one repeats)."""
    out: dict[int, HistoryEvent] = {}
    for event in history:
        if event.event is EventType.STEP_COMPLETED:
            assert event.position is not None
            if event.position in out:
                raise AssertionError(
                    f"run {event.run_id}: position {event.position} journaled twice "
                    f"(seq {out[event.position].seq} and {event.seq})"
                )
            out[event.position] = event
    return out


_HOLDER_EVENTS = frozenset({
    EventType.RUN_STARTED, EventType.RUN_WOKEN, EventType.RUN_SUSPENDED, EventType.RUN_RELEASED,
    EventType.RUN_COMPLETED, EventType.RUN_FAILED, EventType.STEP_COMPLETED, EventType.STEP_FAILED,
    EventType.STEP_RETRIED,
})
#: written without a lease: creation, and operator actions that bump the epoch
_NO_LEASE = frozenset({EventType.RUN_CREATED, EventType.RUN_CANCELLED, EventType.RUN_RETRIED,
                       EventType.RUN_QUARANTINED})
_ENDS_LEASE = frozenset({EventType.RUN_SUSPENDED, EventType.RUN_RELEASED, EventType.RUN_COMPLETED,
                         EventType.RUN_FAILED})


def audit_history(history: list[HistoryEvent]) -> list[str]:
    """Problems with one run's history under the fencing rules (empty if none).

    ``seq`` runs 1..n without gaps; each claim or takeover raises the epoch;
    every entry a lease holder writes carries the epoch and worker id of the
    lease current at that point; ``lease.lost`` names the previous holder.
    """
    problems: list[str] = []
    for index, event in enumerate(history, 1):
        if event.seq != index:
            problems.append(f"seq {event.seq} at index {index}: history has a gap or is out of order")
            break
    holder: tuple[int, str | None] | None = None  # (epoch, worker) of the live lease
    top_epoch = 0
    previous: EventType | None = None
    for event in history:
        kind = event.event
        where = f"seq {event.seq} {kind.value} (epoch {event.epoch}, worker {event.worker})"
        if kind in (EventType.LEASE_CLAIMED, EventType.LEASE_TAKEN_OVER):
            if event.epoch <= top_epoch:
                problems.append(f"{where}: claim did not raise the epoch above {top_epoch}")
            if kind is EventType.LEASE_TAKEN_OVER and previous is not EventType.LEASE_LOST:
                problems.append(f"{where}: takeover not preceded by lease.lost")
            if kind is EventType.LEASE_CLAIMED and holder is not None:
                problems.append(f"{where}: claimed while {holder} still held the lease")
            holder = (event.epoch, event.worker)
            top_epoch = max(top_epoch, event.epoch)
        elif kind is EventType.LEASE_LOST:
            if holder is None:
                problems.append(f"{where}: lease lost on a run nobody held")
            elif (event.epoch, event.worker) != holder:
                problems.append(f"{where}: does not name the current holder {holder}")
            holder = None
        elif kind in _HOLDER_EVENTS:
            if holder is None:
                problems.append(f"{where}: written while no lease was held")
            elif (event.epoch, event.worker) != holder:
                problems.append(f"{where}: written outside the current lease {holder}")
            if kind in _ENDS_LEASE:
                holder = None
        elif kind in _NO_LEASE:
            top_epoch = max(top_epoch, event.epoch)
        else:
            problems.append(f"{where}: unexpected entry for these workflows")
        previous = kind
    return problems


def format_history(history: Iterable[HistoryEvent]) -> str:
    return "\n".join(
        f"  seq={e.seq:<4} {e.event.value:<17} pos={e.position!s:<4} epoch={e.epoch:<3} "
        f"worker={e.worker} at={e.at:.3f}"
        for e in history
    )
