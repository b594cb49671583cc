"""The inline driver: execute one run in the calling thread until it ends.

``app.run`` and ``app.resume`` use it (the embedded mode). It is a worker
serving one run: it claims that run under a lease like any worker (so a crash
of this process is recovered elsewhere), waits out timers, and drives the
run's children here too, since nobody else may be running.

A run waiting for a signal (``ctx.wait_for_signal``) is waited for here like
a timer, up to its timeout or without end: a signal comes from outside this
call by nature (another thread's ``app.signal``, ``cairn signal``, another
run), and the run is suspended meanwhile, so a worker elsewhere may equally
take it on. The wait sleeps on the store's wake-ups (``Notifier``: PostgreSQL's
LISTEN, SQLite's datagram sockets) with a poll once a second as the safety
net, so a delivery resumes it within milliseconds and an idle wait costs
nothing. Waits for anything else that only a person moves on (a budget, an
uncertain effect) raise ``RunBlocked`` instead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from cairn.engine.bundles import BundleNotServed
from cairn.engine.executor import EventLoops, Outcome, execute
from cairn.engine.messaging import SIGNAL_PREFIX
from cairn.engine.runtime import Runtime
from cairn.errors import RunBlocked, RunNeedsAttention, RunNotFound, RunSuspended
from cairn.store.contract import Notifier
from cairn.store.records import Claim, EventType, RunRecord, RunStatus
from cairn.worker.leases import LeaseKeeper


class InlineDriver:
    """Executes runs in the caller's thread under the worker id ``worker_id``."""

    def __init__(self, runtime: Runtime, worker_id: str, lease_seconds: float) -> None:
        #: event loops of the threads that execute async runs here, closed with the driver
        self.loops = EventLoops()
        self.runtime = runtime
        self.worker_id = worker_id
        self.lease_seconds = lease_seconds
        self._keeper: LeaseKeeper | None = None
        self._keeper_lock = threading.Lock()
        #: set by the store's wake-ups while a run here waits for a signal
        self._woken = threading.Event()
        self._stop_listening: Callable[[], None] | None = None

    def drive(self, run_id: str, claim: Claim | None) -> Outcome | None:
        """Execute ``run_id`` until it is terminal, driving its children too.

        Returns the outcome when this driver completed the run (it carries the
        result as replay decoded it), ``None`` when the run ended any other
        way (failed, cancelled, or finished elsewhere): the caller reads it.
        Raises ``RunNeedsAttention`` or ``RunSuspended`` when the run (or a
        child it waits for) stopped where nothing but an operator moves it on:
        waiting here would block forever.
        """
        store = self.runtime.store
        keeper = self._lease_keeper()
        delay = 0.0
        refused = 0  # claims in a row that found the run pending and did not get it
        while True:
            if claim is None:
                claim = store.claim_run(run_id, self.worker_id, self.lease_seconds,
                                        self.runtime.max_recoveries)
            if claim is not None:
                refused = 0
                claim_bundle = claim.run.bundle
                outcome = execute(self.runtime, claim, self.worker_id, keeper, self.loops)
                claim = None
                if outcome.status == "completed":
                    return outcome
                if outcome.status in ("failed", "lost"):
                    return None
                if outcome.status == "refused":  # its bundle is not this process's code: waiting would spin
                    raise BundleNotServed(run_id, claim_bundle or "?", outcome.error or "")
                delay = self._after_suspension(outcome, run_id)
                continue
            record = store.get_run(run_id)
            if record is None:
                raise RunNotFound(run_id)
            if record.status.terminal:
                return None
            self._check_blocked(record)
            if record.status is RunStatus.SUSPENDED and record.waiting_on:
                self._drive_child(record.waiting_on, run_id)
                continue
            if record.status is RunStatus.SUSPENDED and _waits_for_signal(record):
                self._wait_for_wakeup(record)
                continue
            if record.status is RunStatus.PENDING:
                # Not admitted by its queue yet (a tenant's role on PostgreSQL:
                # store.postgres, migration 0027): wait for a slot to free (the
                # store's wake-ups) or a token, polling less and less often.
                refused += 1
                self._wait_for_queue(min(0.01 * 2 ** min(refused, 6), 0.5))
                continue
            time.sleep(delay or 0.01)  # held elsewhere, or a timer not yet due

    def _after_suspension(self, outcome: Outcome, run_id: str) -> float:
        if outcome.waiting_on is not None:
            self._drive_child(outcome.waiting_on, run_id)
            return 0.0
        if outcome.waiting_for is not None and outcome.waiting_for.startswith(SIGNAL_PREFIX):
            return 0.0  # the loop sees the suspension and waits for the wake-up
        if outcome.wake_at is not None:
            return max(0.0, min(outcome.wake_at - time.time(), 1.0))
        return 0.01

    def _wait_for_wakeup(self, record: RunRecord) -> None:
        """Sleep until the store says a run became runnable, the run's
        timeout, or a second (the safety-net poll), whichever is first."""
        self._listen()
        limit = 1.0
        if record.wake_at is not None:
            limit = max(0.0, min(limit, record.wake_at - time.time()))
        self._woken.wait(limit)
        self._woken.clear()

    def _wait_for_queue(self, limit: float) -> None:
        """Sleep until the store says a run became runnable or a slot freed,
        or ``limit`` seconds."""
        self._listen()
        self._woken.wait(limit)
        self._woken.clear()

    def _listen(self) -> None:
        store = self.runtime.store
        if self._stop_listening is None and isinstance(store, Notifier):
            self._stop_listening = store.listen(self._woken.set)

    def _check_blocked(self, record: RunRecord) -> None:
        """Raise if ``record`` waits for nobody but an operator: in
        ``needs_attention``, or suspended with no timer and no child (a budget)."""
        waits = record.wake_at is not None or record.waiting_on is not None or _waits_for_signal(record)
        if record.status is RunStatus.NEEDS_ATTENTION:
            raise RunNeedsAttention(record.run_id, record.status.value, self._reason(record.run_id))
        if record.status is RunStatus.INCOMPATIBLE:
            raise RunSuspended(record.run_id, record.status.value, self._reason(record.run_id))
        if record.status is RunStatus.SUSPENDED and not waits:
            raise RunSuspended(record.run_id, record.status.value, self._reason(record.run_id))

    def _reason(self, run_id: str) -> str:
        """Why the run stopped, from its latest suspension entry."""
        for event in reversed(self.runtime.store.history(run_id)):
            if event.event in (EventType.RUN_NEEDS_ATTENTION, EventType.RUN_SUSPENDED,
                               EventType.RUN_INCOMPATIBLE):
                detail = event.detail or {}
                return str(detail.get("why") or detail.get("reason") or event.event.value)
        return "waiting for an operator"

    def _drive_child(self, child_id: str, parent_id: str) -> None:
        child = self.runtime.store.get_run(child_id)
        if child is not None and not child.status.terminal:
            # the parent observes the child's failure itself, through the journal;
            # a child that waits for an operator blocks its parent with it
            try:
                self.drive(child_id, None)
            except RunBlocked as blocked:
                raise type(blocked)(parent_id, RunStatus.SUSPENDED.value,
                                    f"it waits for child run {blocked.run_id!r}, which is {blocked.status}: "
                                    f"{blocked.reason}") from None
            except Exception:  # reported by the parent's journal
                pass

    def _lease_keeper(self) -> LeaseKeeper:
        with self._keeper_lock:
            if self._keeper is None:
                self._keeper = LeaseKeeper(self.runtime.store, self.worker_id, self.lease_seconds)
            return self._keeper

    def close(self) -> None:
        if self._stop_listening is not None:
            self._stop_listening()
            self._stop_listening = None
        if self._keeper is not None:
            self._keeper.close()
        self.loops.close()


def _waits_for_signal(record: RunRecord) -> bool:
    return record.waiting_for is not None and record.waiting_for.startswith(SIGNAL_PREFIX)
