"""Heartbeats: keep the leases of running executions alive, and notice loss.

One daemon thread per worker renews every held lease each third of the lease
period. A lease it fails to renew (taken over, cancelled, killed) marks the
execution so it stops at its next step boundary; the fenced write is the hard
guarantee, this is the early warning that saves a wasted step.
"""

from __future__ import annotations

import logging
import threading

from cairn.engine.execution import Execution
from cairn.engine.executor import GIVING_BACK
from cairn.errors import StoreError
from cairn.store.contract import Store

log = logging.getLogger("cairn.leases")


class LeaseKeeper:
    """Renews leases of the executions it watches, for one worker id."""

    def __init__(self, store: Store, worker: str, lease_seconds: float) -> None:
        self.store = store
        self.worker = worker
        self.lease_seconds = lease_seconds
        self._watched: dict[str, Execution] = {}
        #: set by ``flag_all``: executions that register later are flagged too,
        #: so a run claimed just as the worker starts draining is given back
        self._standing_reason: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, execution: Execution) -> None:
        with self._lock:
            self._watched[execution.run_id] = execution
            if self._standing_reason is not None:
                execution.stop_reason = self._standing_reason
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=f"cairn-leases-{self.worker}",
                                                daemon=True)
                self._thread.start()

    def unwatch(self, execution: Execution) -> None:
        with self._lock:
            if self._watched.get(execution.run_id) is execution:
                del self._watched[execution.run_id]

    def flag_all(self, reason: str) -> None:
        """Ask every watched execution, and every one watched from now on, to
        stop at its next step boundary."""
        with self._lock:
            self._standing_reason = reason
            for execution in self._watched.values():
                execution.stop_reason = reason

    def giving_back(self) -> bool:
        """Whether an execution is giving its run back after a store failure
        (``executor.give_back``): its lease may have expired meanwhile, so
        its worker renews before claiming (``Worker._claim``)."""
        with self._lock:
            return any(ex.stop_reason == GIVING_BACK for ex in self._watched.values())

    def renew_now(self) -> None:
        """Renew every watched lease once; flag executions whose lease is gone."""
        with self._lock:
            held = {run_id: ex.epoch for run_id, ex in self._watched.items()}
        if not held:
            return
        lost = self.store.renew_leases(self.worker, held, self.lease_seconds)
        with self._lock:
            for run_id in lost:
                execution = self._watched.get(run_id)
                if execution is not None and execution.epoch == held[run_id]:
                    log.warning("worker %s lost its lease on run %s", self.worker, run_id)
                    execution.stop_reason = "lease lost"

    def _loop(self) -> None:
        interval = max(0.05, self.lease_seconds / 3)
        while not self._stop.wait(interval):
            try:
                self.renew_now()
            except StoreError as exc:  # a passing store failure: try again next beat, one line each
                log.warning("worker %s cannot renew its leases: %s", self.worker, exc)
            except Exception:
                log.exception("lease renewal failed for worker %s", self.worker)

    def close(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
