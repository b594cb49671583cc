"""The side loops of ``cairn worker``: a pass repeated on a thread until stopped.

Besides running steps, a worker fires schedules (``worker.scheduler``),
embeds memory items (``memory.indexer``) and moves item values between tiers
(``memory.tiering``). Each is a pass that is safe to repeat and to cut short
(one store transaction, or several idempotent ones), so they share one loop:

* ``cycle`` (the pass) says how long to wait before the next one;
* a store that does not answer (``StoreError``) is logged and the pass is
  tried again after a backoff that doubles from 0.1 s up to the loop's
  ``max_wait``, and the recovery is logged once;
* any other exception is a bug in the pass, never a reason for a worker to
  lose the loop: it is logged with its traceback and handled like an outage;
* ``stop`` lets the pass in progress end (its transaction commits or not at
  all) and joins the thread.

This module is a layer of its own just above the leaves (it knows only
``cairn.errors``), so the memory layer and the worker layer can both build on it.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod

from cairn.errors import StoreError

#: the first wait after a failed pass; each failure in a row doubles it, up to ``max_wait``
FIRST_BACKOFF = 0.1


class SideLoop(ABC):
    """Calls ``cycle`` on a daemon thread named ``cairn-<name>`` until ``stop``."""

    def __init__(self, name: str, log: logging.Logger, *, max_wait: float) -> None:
        if not max_wait > 0:
            raise ValueError(f"max_wait must be a positive number of seconds, not {max_wait!r}")
        self.name = name
        self.max_wait = max_wait
        self._log = log
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._backoff = 0.0

    @abstractmethod
    def cycle(self) -> float:
        """Do one pass; return how many seconds to wait before the next one
        (0 for at once; capped at ``max_wait``)."""

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def run(self) -> None:
        """Passes until ``stop``, in the calling thread."""
        while not self._stopping.is_set():
            self._stopping.wait(self.cycle_guarded())

    def cycle_guarded(self) -> float:
        """One ``cycle`` with the loop's handling of failures; the seconds to wait next."""
        try:
            wait = self.cycle()
        except StoreError as exc:
            wait = self._failed()
            self._log.warning("%s cannot reach the store: %s; again in %.1fs", self.name, exc, wait)
            return wait
        except Exception:  # a side loop of cairn worker must not die of a bug: say so, go on
            wait = self._failed()
            self._log.exception("%s: a pass failed; again in %.1fs", self.name, wait)
            return wait
        if self._backoff:
            self._log.warning("%s: the store answers again", self.name)
            self._backoff = 0.0
        return min(max(wait, 0.0), self.max_wait)

    def _failed(self) -> float:
        self._backoff = min(max(self._backoff * 2, FIRST_BACKOFF), self.max_wait)
        return self._backoff

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self.run, name=f"cairn-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop after the pass in progress; wait up to ``timeout`` seconds for it."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None


__all__ = ["FIRST_BACKOFF", "SideLoop"]
