"""A worker process for ``test_stop_signal``: ``python -m tests.worker.signalled_worker MODE DB``.

``held``: SIGTERM arrives while the main thread holds its wake-up event's
lock (``Event.clear`` sends it to this process from inside the lock, so the
handler runs right there, as it does when a real signal lands at that
instant). The worker must drain and print ``drained`` and whether its
previous SIGTERM handler is back.

``busy``: a run whose step sleeps for a minute keeps the drain waiting; the
test sends a second SIGTERM, which must end the process at once.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

import cairn


class SignalledWhileHeld(threading.Event):
    """The first ``clear`` signals the process while holding the event's lock."""

    signalled = False

    def clear(self) -> None:
        with self._cond:  # type: ignore[attr-defined]
            if not self.signalled:
                self.signalled = True
                os.kill(os.getpid(), signal.SIGTERM)
                # the handler runs at the next check between bytecodes, in this thread
                deadline = time.monotonic() + 0.5
                while time.monotonic() < deadline:
                    pass
            self._flag = False  # type: ignore[attr-defined]


def main(mode: str, db: str) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    app = cairn.App(f"sqlite:///{db}")

    @app.step()
    def nap(seconds: float) -> str:
        print("napping", flush=True)  # the test signals once the step is under way
        time.sleep(seconds)
        return "rested"

    @app.workflow(name="napping")
    def napping(ctx: cairn.Context, seconds: float) -> str:
        return nap(seconds)

    previous = signal.getsignal(signal.SIGTERM)
    worker = app.worker(concurrency=1, poll_interval=0.02, schedules=False)
    if mode == "held":
        worker._wakeup = SignalledWhileHeld()
    else:
        app.start(napping, 60.0)
    print("running", flush=True)
    worker.run()
    restored = signal.getsignal(signal.SIGTERM) is previous
    print(f"drained restored={restored}", flush=True)
    app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
