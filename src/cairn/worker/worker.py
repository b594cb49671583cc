"""The worker: claims runnable runs under a lease and executes them.

A worker is a loop over ``claim_runs`` feeding a thread pool of
``concurrency`` slots. It holds nothing while idle: suspended runs live only
in the database. On SIGTERM it *drains*: it stops claiming, lets every
running step finish and be recorded, then gives the runs back so another
worker continues them at once (no lease has to expire).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from cairn.engine.executor import EventLoops, Outcome, execute
from cairn.engine.runtime import Runtime
from cairn.errors import StoreError
from cairn.memory.indexer import Indexer
from cairn.memory.tiering import ItemTiering
from cairn.store.contract import Notifier
from cairn.store.oplog import acting
from cairn.store.records import Claim
from cairn.worker.leases import LeaseKeeper
from cairn.worker.retention import RetentionLoop
from cairn.worker.scheduler import Scheduler
from cairn.worker.stopsignal import StopOnSignal

log = logging.getLogger("cairn.worker")

#: The longest wait between claims while the store keeps failing, and how
#: many times in a row a claim is tried before the worker backs off.
MAX_BACKOFF = 5.0
CLAIM_ATTEMPTS = 3


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    concurrency: int = 4
    lease_seconds: float = 30.0
    poll_interval: float = 0.1
    queues: tuple[str, ...] | None = None
    #: whether this worker fires the app's schedules (``cairn.worker.scheduler``)
    schedules: bool = True
    #: whether this worker runs the retention controller's side loop (``cairn.worker.retention``;
    #: every worker may: one at a time holds its lease), and how often
    retention: bool = True
    retention_interval: float = 300.0


class Worker:
    """Executes runs of the workflows registered in ``runtime``."""

    def __init__(
        self,
        runtime: Runtime,
        settings: WorkerSettings | None = None,
        worker_id: str | None = None,
        on_outcome: Callable[[Claim, Outcome], None] | None = None,
    ) -> None:
        self.runtime = runtime
        self.settings = settings or WorkerSettings()
        if self.settings.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.worker_id = worker_id or default_worker_id()
        self.keeper = LeaseKeeper(runtime.store, self.worker_id, self.settings.lease_seconds)
        self.on_outcome = on_outcome
        self._stopping = threading.Event()
        self._wakeup = threading.Event()
        self._active = 0
        self._active_lock = threading.Lock()
        self._next_timer: float | None = None
        self._backoff = 0.0  # seconds between claims while the store fails (0: it answers)
        self.claimed = 0
        #: the event loops of the pool threads, closed once they are done (on drain)
        self.loops = EventLoops()
        #: fires the app's schedules on a thread of this worker while it runs
        fired = list(runtime.schedules.values()) if self.settings.schedules else []
        self.scheduler = Scheduler(runtime, fired, worker_id=self.worker_id)
        #: embeds long-term memory items on a thread of this worker, if the app has an embedder
        embedder = runtime.memory.embedder
        self.indexer = None if embedder is None else Indexer(
            runtime.store, embedder, worker_id=self.worker_id, cold_after=runtime.memory.cold_after)
        #: keeps the cold tier of long-term item values, if the app has ``cold_after``
        cold_after = runtime.memory.cold_after
        self.tiering = None if cold_after is None else ItemTiering(
            runtime.store, cold_after, name=f"tiering-{self.worker_id}")

        #: enforces the stored retention policies, one worker at a time (its lease)
        self.retention = None if not self.settings.retention else RetentionLoop(
            runtime.store, self.worker_id, interval=self.settings.retention_interval)

        #: the bundles this worker claims runs of (``engine.bundles``), and when it last looked
        self.bundles: set[str] = set()
        self._bundles_at = -float("inf")

    @property
    def workflows(self) -> Collection[str]:
        return tuple(self.runtime.workflows)

    def refresh_bundles(self, *, force: bool = False) -> set[str]:
        """Store this worker's bundles, find the stored ones it serves (same
        workflow, version and code: see ``Registry.refresh``; code that drifted
        is refused with one log line) and say it serves them. At most every
        ``Registry.REFRESH_SECONDS``; a store failure keeps the last set."""
        now = time.monotonic()
        registry = self.runtime.registry
        if not force and now - self._bundles_at < registry.REFRESH_SECONDS:
            return self.bundles
        self._bundles_at = now
        store = self.runtime.store
        try:
            scoped = getattr(store, "tenant", None) or ""  # a tenant's role appends to its own log only
            with acting(store, f"worker:{self.worker_id}", scoped, "bundle", "", "bundle.publish"):
                registry.publish(store)  # each bundle new to the store is recorded
            self.bundles = registry.refresh(store)
            store.serve_bundles(self.bundles)
        except StoreError as exc:
            log.warning("worker %s cannot refresh its bundles: %s", self.worker_id, exc)
            self.bundles = registry.served_ids() if not self.bundles else self.bundles
        return self.bundles

    def run(self, *, install_signals: bool = True, max_idle: float | None = None) -> None:
        """Claim and execute until ``stop()`` (or SIGTERM/SIGINT); then drain.

        ``max_idle`` stops the worker after that many seconds with nothing to
        do (handy for scripts and tests).
        """
        signals = None
        if install_signals and threading.current_thread() is threading.main_thread():
            signals = StopOnSignal(self._on_signal, self._stopping.is_set)
            signals.install()
        try:
            self._run(max_idle, signals)
        finally:
            if signals is not None:
                signals.uninstall()

    def _run(self, max_idle: float | None, signals: StopOnSignal | None) -> None:
        reclaimed = self.runtime.store.reclaim_owned(self.worker_id)
        if reclaimed:
            log.info("worker %s reclaimed %d run(s) from its previous incarnation", self.worker_id, reclaimed)
        pool = ThreadPoolExecutor(self.settings.concurrency, thread_name_prefix=f"cairn-{self.worker_id}")
        # Stores that can push wake-ups (PostgreSQL LISTEN/NOTIFY, SQLite's
        # datagram sockets) shorten the wait for new work (a new run, a
        # signal delivered, a child finished) to the notification latency;
        # polling stays on as the safety net.
        store = self.runtime.store
        stop_listening = store.listen(self._wakeup.set) if isinstance(store, Notifier) else None
        idle_since = time.monotonic()
        self.scheduler.start()
        if self.indexer is not None:
            self.indexer.start()
        if self.tiering is not None:
            self.tiering.start()
        if self.retention is not None:
            self.retention.start()
        try:
            # ``signals.received`` is set by the handler itself: no claim starts
            # after a signal, even before its watcher thread has called ``stop``
            while not self._stopping.is_set() and not (signals is not None and signals.received):
                # Idle is read before the claim pass: an execution that ends during the pass may
                # have made work the pass did not see (a child's end readies its parent), so only
                # a pass that began with nothing running may end the loop (tests/worker/test_max_idle.py)
                idle = self._idle()
                claims = self._claim()
                for claim in claims:
                    pool.submit(self._execute, claim)
                if claims:
                    idle_since = time.monotonic()
                    continue
                if max_idle is not None and idle and time.monotonic() - idle_since > max_idle:
                    break
                self._wakeup.wait(self._poll_delay())
                self._wakeup.clear()
        finally:
            # Flag the drain first: stopping LISTEN joins a thread that may
            # wait up to half a second for a notification, and steps must not
            # keep starting meanwhile.
            self.keeper.flag_all("draining")
            self.scheduler.stop()
            if self.indexer is not None:
                self.indexer.stop()
            if self.tiering is not None:
                self.tiering.stop()
            if self.retention is not None:
                self.retention.stop()
            if stop_listening is not None:
                stop_listening()
            self._drain(pool)

    def stop(self) -> None:
        """Ask the worker to drain and return from ``run``."""
        self._stopping.set()
        self._wakeup.set()

    # -- internals ---------------------------------------------------------------

    def _on_signal(self, signum: int) -> None:
        """SIGTERM or SIGINT came (called on ``StopOnSignal``'s thread, never in the handler)."""
        log.info("worker %s received %s: draining", self.worker_id, signal.Signals(signum).name)
        self.stop()

    def _idle(self) -> bool:
        with self._active_lock:
            return self._active == 0

    def _claim(self) -> list[Claim]:
        with self._active_lock:
            free = self.settings.concurrency - self._active
        if free <= 0:
            return []
        for attempt in range(1, CLAIM_ATTEMPTS + 1):
            try:
                if self._backoff or self.keeper.giving_back():
                    # The store failed until now, or an execution could not
                    # record and waits to give its run back: renew this worker's
                    # leases first, so that claiming cannot take over one of its
                    # own runs (its lease expired meanwhile) as if its worker
                    # had crashed. Best effort: a renewal that fails must not
                    # stop the claims of a store that answers again.
                    with contextlib.suppress(StoreError):
                        self.keeper.renew_now()
                claims = self.runtime.store.claim_runs(
                    self.worker_id, self.workflows, free, self.settings.lease_seconds,
                    self.runtime.max_recoveries, self.settings.queues, bundles=self.refresh_bundles(),
                )
                break
            except StoreError as exc:
                # A pooled connection the server dropped fails once and is
                # replaced: try again at once before backing off.
                if attempt == CLAIM_ATTEMPTS:
                    self._store_failed(exc)
                    return []
            except Exception as exc:
                self._store_failed(exc)
                return []
        if self._backoff:  # the store answers again
            self._store_recovered()
        with self._active_lock:
            self._active += len(claims)
        self.claimed += len(claims)
        return claims

    def _store_failed(self, exc: Exception) -> None:
        """Back off after a failed claim: one line per attempt, each wait
        twice the last (up to ``MAX_BACKOFF``), instead of a traceback every
        poll while the store is down or full. (A run the store failed is
        parked by its executor: ``executor.give_back``.)"""
        self._backoff = min(max(self._backoff * 2, self.settings.poll_interval, 0.05), MAX_BACKOFF)
        if isinstance(exc, StoreError):
            log.warning("worker %s cannot claim runs: %s; again in %.1fs", self.worker_id, exc, self._backoff)
        else:
            log.exception("worker %s could not claim runs; again in %.1fs", self.worker_id, self._backoff)

    def _store_recovered(self) -> None:
        log.warning("worker %s: the store answers again; claiming as usual", self.worker_id)
        self._backoff = 0.0

    def _poll_delay(self) -> float | None:
        """How long to sleep before claiming again; ``None``: until woken.

        A worker whose every slot is busy sleeps until an execution ends (it
        sets ``_wakeup``) or ``stop``: nothing could be claimed, and each
        periodic wake-up would only take the GIL from the threads executing
        steps. A due timer waits for a free slot like any other run."""
        with self._active_lock:
            if self._active >= self.settings.concurrency:
                return None
        if self._backoff:  # the store failed: its timers can wait for it too
            return self._backoff
        delay = self.settings.poll_interval
        timer = self._next_timer
        if timer is not None:
            remaining = timer - time.time()
            if remaining <= 0:
                self._next_timer = None  # due now: poll once more at once, then as usual
                return 0.0
            delay = min(delay, remaining)
        return delay

    def _execute(self, claim: Claim) -> None:
        try:
            outcome = execute(self.runtime, claim, self.worker_id, self.keeper, self.loops)
            wake_at, timer = outcome.wake_at, self._next_timer
            if wake_at is not None and (timer is None or wake_at < timer):
                self._next_timer = wake_at
            if self.on_outcome is not None:
                self.on_outcome(claim, outcome)
        except BaseException:
            log.exception("worker %s crashed executing run %s", self.worker_id, claim.run.run_id)
        finally:
            with self._active_lock:
                self._active -= 1
            self._wakeup.set()

    def _drain(self, pool: ThreadPoolExecutor) -> None:
        self.keeper.flag_all("draining")
        pool.shutdown(wait=True)
        self.loops.close()
        self.keeper.close()
