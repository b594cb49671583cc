"""The inline driver: execute one run in the calling thread until it ends.

``app.run`` and ``app.resume`` use it (the embedded mode). It is a worker
serving one run: it claims that run under a lease like any worker (so a crash
of this process is recovered elsewhere), waits out timers, and drives the
run's children here too, since nobody else may be running.
"""

from __future__ import annotations

import contextlib
import threading
import time

from cairn.engine.executor import EventLoops, Outcome, execute
from cairn.engine.runtime import Runtime
from cairn.errors import RunNotFound
from cairn.store.records import Claim, RunStatus
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

    def drive(self, run_id: str, claim: Claim | None) -> Outcome | None:
        """Execute ``run_id`` until it is terminal, driving its children too.

        Returns the outcome when this driver completed the run (it carries the
        result as replay decoded it), ``None`` when the run ended any other
        way (failed, cancelled, or finished elsewhere): the caller reads it.
        """
        store = self.runtime.store
        keeper = self._lease_keeper()
        delay = 0.0
        while True:
            if claim is None:
                claim = store.claim_run(run_id, self.worker_id, self.lease_seconds,
                                        self.runtime.max_recoveries)
            if claim is not None:
                outcome = execute(self.runtime, claim, self.worker_id, keeper, self.loops)
                claim = None
                if outcome.status == "completed":
                    return outcome
                if outcome.status in ("failed", "lost"):
                    return None
                delay = self._after_suspension(outcome)
                continue
            record = store.get_run(run_id)
            if record is None:
                raise RunNotFound(run_id)
            if record.status.terminal:
                return None
            if record.status is RunStatus.SUSPENDED and record.waiting_on:
                self._drive_child(record.waiting_on)
                continue
            time.sleep(delay or 0.01)  # held elsewhere, or a timer not yet due

    def _after_suspension(self, outcome: Outcome) -> float:
        if outcome.waiting_on is not None:
            self._drive_child(outcome.waiting_on)
            return 0.0
        if outcome.wake_at is not None:
            return max(0.0, min(outcome.wake_at - time.time(), 1.0))
        return 0.01

    def _drive_child(self, child_id: str) -> None:
        child = self.runtime.store.get_run(child_id)
        if child is not None and not child.status.terminal:
            # the parent observes the child's failure itself, through the journal
            with contextlib.suppress(Exception):
                self.drive(child_id, None)

    def _lease_keeper(self) -> LeaseKeeper:
        with self._keeper_lock:
            if self._keeper is None:
                self._keeper = LeaseKeeper(self.runtime.store, self.worker_id, self.lease_seconds)
            return self._keeper

    def close(self) -> None:
        if self._keeper is not None:
            self._keeper.close()
        self.loops.close()
