"""SIGTERM and SIGINT turned into a worker's drain, with no lock taken in the handler.

Python runs a signal handler in the main thread, between two bytecodes of
whatever that thread was doing. The worker's main thread spends its idle time
in ``Event.wait`` and ``Event.clear`` of its wake-up event, and both hold the
event's lock, which is not reentrant: a handler that sets that event (or takes
any lock the main thread may hold: logging's, a pool's, ``Thread.start``'s)
can wait for itself forever. The worker then logs that it is draining and
never drains (seen in CI: an idle worker still running 10 s after SIGTERM).

So the handler does two things that take no lock: it remembers that a signal
came, and it writes the signal's number to a pipe. A watcher thread reads the
pipe and does the rest (the log line, ``Worker.stop``) as any other thread
would. A second signal while draining still leaves at once (``os._exit``):
the leases expire and other workers take the runs over.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

#: the signals that ask a worker to drain
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopOnSignal:
    """While installed, the first of ``signals`` calls ``on_signal(signum)`` on
    a thread of its own; one more while ``stopping()`` exits the process.

    ``stopping`` is read inside the handler, so it must take no lock either
    (``threading.Event.is_set`` takes none)."""

    def __init__(
        self,
        on_signal: Callable[[int], None],
        stopping: Callable[[], bool],
        signals: Sequence[signal.Signals] = STOP_SIGNALS,
    ) -> None:
        self._on_signal = on_signal
        self._stopping = stopping
        self._signals = tuple(signals)
        self._received = False
        self._previous: dict[signal.Signals, Any] = {}
        self._pipe: tuple[int, int] | None = None
        self._watcher: threading.Thread | None = None

    @property
    def received(self) -> bool:
        """Whether a signal came (set in the handler itself, before the
        watcher thread runs): a loop may stop at once on it."""
        return self._received

    def install(self) -> None:
        """Take over the signals (from the main thread only, as ``signal.signal`` requires)."""
        if self._pipe is not None:
            return
        self._received = False
        self._pipe = os.pipe()
        self._watcher = threading.Thread(target=self._watch, args=(self._pipe[0],),
                                         name="cairn-stop-signal", daemon=True)
        self._watcher.start()
        self._previous = {sig: signal.signal(sig, self._handle) for sig in self._signals}

    def uninstall(self) -> None:
        """Give the signals back to their previous handlers and end the watcher."""
        if self._pipe is None:
            return
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}
        read_end, write_end = self._pipe
        self._pipe = None
        os.close(write_end)  # the watcher reads the end of the pipe and returns
        if self._watcher is not None:
            self._watcher.join(timeout=5)
            self._watcher = None
        os.close(read_end)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Runs in the main thread wherever it was: no lock, no logging, no Event.set.
        if self._received or self._stopping():
            os._exit(128 + signum)
        self._received = True
        if self._pipe is not None:
            with contextlib.suppress(OSError):
                os.write(self._pipe[1], bytes([signum]))

    def _watch(self, read_end: int) -> None:
        while True:
            try:
                data = os.read(read_end, 16)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                self._on_signal(signum)


__all__ = ["STOP_SIGNALS", "StopOnSignal"]
