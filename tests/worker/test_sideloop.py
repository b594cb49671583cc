"""The side loops of ``cairn worker`` (scheduler, indexer, item tiering) share
``cairn.sideloop.SideLoop``: a store outage backs off and is retried, a bug in
a pass is logged with its traceback and never ends the loop, ``stop`` lets the
pass in progress finish."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest

from cairn.errors import StoreError
from cairn.sideloop import FIRST_BACKOFF, SideLoop

log = logging.getLogger("cairn.test.sideloop")


class Scripted(SideLoop):
    """A loop whose passes do what ``script`` says, one entry a pass."""

    def __init__(self, script: list[Callable[[], float]], *, max_wait: float = 1.0) -> None:
        super().__init__("scripted", log, max_wait=max_wait)
        self.script = script
        self.passes = 0

    def cycle(self) -> float:
        self.passes += 1
        return self.script.pop(0)() if self.script else 0.0


def outage() -> float:
    raise StoreError("database is locked")


def bug() -> float:
    raise ZeroDivisionError("a bug in the pass")


def test_an_outage_backs_off_doubling_up_to_max_wait_and_the_recovery_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="cairn.test.sideloop")
    loop = Scripted([outage] * 6 + [lambda: 0.3, outage], max_wait=1.0)
    waits = [loop.cycle_guarded() for _ in range(8)]
    assert waits == [FIRST_BACKOFF, 0.2, 0.4, 0.8, 1.0, 1.0, 0.3, FIRST_BACKOFF]  # reset after a good pass
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "scripted cannot reach the store: database is locked; again in 0.1s"
    assert messages.count("scripted: the store answers again") == 1
    assert all(r.exc_info is None for r in caplog.records)  # an outage is not a traceback


def test_a_bug_in_a_pass_is_logged_with_its_traceback_and_the_loop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = Scripted([bug, lambda: 0.0])
    assert loop.cycle_guarded() == FIRST_BACKOFF
    assert loop.cycle_guarded() == 0.0
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    # the traceback: as exc_info, or as exc_text where Cairn's redaction filter
    # (installed by any test that opened a worker before) has already scrubbed it
    trace = record.exc_text or ""
    if record.exc_info:
        trace = logging.Formatter().formatException(record.exc_info)
    assert trace.startswith("Traceback")
    assert "ZeroDivisionError: a bug in the pass" in trace
    assert loop.passes == 2


def test_the_wait_a_pass_asks_for_is_kept_within_zero_and_max_wait() -> None:
    loop = Scripted([lambda: 50.0, lambda: -3.0], max_wait=2.0)
    assert [loop.cycle_guarded(), loop.cycle_guarded()] == [2.0, 0.0]


def test_a_loop_needs_a_positive_max_wait() -> None:
    with pytest.raises(ValueError, match="max_wait must be a positive number of seconds, not 0"):
        Scripted([], max_wait=0)


def test_the_thread_runs_passes_until_stop_and_stop_lets_the_pass_in_progress_end() -> None:
    inside, release = threading.Event(), threading.Event()
    finished: list[bool] = []

    def slow_pass() -> float:
        inside.set()
        release.wait(10)
        finished.append(True)
        return 0.0

    loop = Scripted([bug, outage, slow_pass], max_wait=0.05)  # survives both failures on its thread
    loop.start()
    loop.start()  # a second start is a no-op, not a second thread
    assert inside.wait(10), "the loop's thread never reached its third pass"
    assert [t.name for t in threading.enumerate()].count("cairn-scripted") == 1
    stopper = threading.Thread(target=loop.stop)
    stopper.start()
    stopper.join(0.2)
    assert stopper.is_alive(), "stop returned while a pass was still running"
    release.set()
    stopper.join(10)
    assert not stopper.is_alive()
    assert finished == [True]
    assert loop.stopping
    assert "cairn-scripted" not in [t.name for t in threading.enumerate()]
    passes = loop.passes
    loop.run()  # stopped: returns at once, runs no pass
    assert loop.passes == passes
