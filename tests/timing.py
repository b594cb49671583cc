"""Durations for tests that must not depend on a quiet machine.

A test that suspends a run on a timer (``ctx.sleep``) to make the next
execution a replay, and asserts that the first one ``suspended``, needs the
timer not to be due yet when the engine checks it. The engine takes the
deadline before it commits the timer's entry and checks it after: a 10 ms
timer is already due behind one slow commit (PostgreSQL's fsync on a loaded
machine, several test processes at once), and then the run runs on instead of
suspending. ``NAP`` is long against one commit, short enough to wait out.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

import cairn
from cairn.store.records import JOURNAL_EVENTS, EventType, HistoryEvent, RunStatus

#: seconds of a ``ctx.sleep`` that must suspend the run (never due before its own entry is committed)
NAP = 0.5


def wait_out_nap() -> None:
    """Sleep until a ``NAP`` timer set before this call is due (with a margin
    for the clock's resolution), so the next execution finds it passed."""
    time.sleep(NAP + 0.05)


def wait_until_due(app: cairn.App, *run_ids: str) -> None:
    """Return once the timer each run is suspended on is due by the store's
    clock (the one a worker compares a run's ``wake_at`` with), so the next
    drain finds it runnable. A fixed ``time.sleep`` had to cover the whole
    timer and a margin; this waits only for what is left of it when called."""
    for run_id in run_ids:
        record = app.get_run(run_id)
        assert record.status is RunStatus.SUSPENDED, f"run {run_id} is {record.status}, not suspended"
        assert record.wake_at is not None, f"run {run_id} is suspended on no timer"
        _until_store_time(app, record.wake_at)


def wait_until_lease_lapsed(app: cairn.App, run_id: str) -> None:
    """Return once the lease of a running run (its holder killed) has run out
    by the store's clock, so another holder may take the run over: what a
    fixed sleep of the lease's length and a margin stood for."""
    record = app.get_run(run_id)
    assert record.status is RunStatus.RUNNING, f"run {run_id} is {record.status}, not running"
    assert record.lease_expires_at is not None, f"run {run_id} is running without a lease"
    _until_store_time(app, record.lease_expires_at)


def _until_store_time(app: cairn.App, when: float) -> None:
    """Sleep until ``app``'s store clock reads ``when`` or later."""
    while (left := when - app.store.clock()) > 0:
        time.sleep(left)


def napped(history: Sequence[HistoryEvent]) -> tuple[list[HistoryEvent], list[HistoryEvent]]:
    """The journal entries a run wrote before and after its one ``NAP`` timer
    suspended it, once the history shows that it did: a ``sleep`` suspension,
    then a new claim that woke the run. A test that says the rest of its run is
    a replay calls this, so that it fails if the timer was already due when the
    engine checked it and the first execution simply ran on (every assertion
    about the result would hold either way)."""
    sleeps = [i for i, e in enumerate(history)
              if e.event is EventType.RUN_SUSPENDED and (e.detail or {}).get("reason") == "sleep"]
    kinds = [str(e.event) for e in history]
    assert len(sleeps) == 1, f"expected the run to suspend once on its timer, history: {kinds}"
    [at] = sleeps
    woken = [e.event for e in history[at + 1:] if e.event in (EventType.LEASE_CLAIMED, EventType.RUN_WOKEN)]
    assert woken[:2] == [EventType.LEASE_CLAIMED, EventType.RUN_WOKEN], \
        f"the timer's suspension was not followed by a new execution, history: {kinds}"
    journal = [e for e in history if e.event in JOURNAL_EVENTS]
    return ([e for e in journal if e.seq < history[at].seq],
            [e for e in journal if e.seq > history[at].seq])


# -- waiting on a busy machine: progress, not wall clock ----------------------------------------
#
# A crash test waits for worker processes: to start, to claim, to finish the runs. How long that
# takes is a property of the machine (a worker process takes ~1 s to start alone, 10 s and more
# beside seven other test sessions on two cores), not of the behaviour under test, so no such wait
# may fail on elapsed time alone. They wait while something progresses and fail only after
# ``STALL`` seconds in which nothing did (a hang: a deadlock, a lost wake-up, a stopped process),
# or past a ceiling far above any need (a livelock that keeps "progressing" forever).

#: how many times its quiet-machine timeout a plain ``wait_until`` waits (``CAIRN_TEST_SLACK``):
#: a worker process's start, a claim poll, a commit all run some ten times slower at load ~15 on
#: two cores, and a wait's timeout is a bound against a hang, not a judgement of speed
SLACK = float(os.environ.get("CAIRN_TEST_SLACK", "10"))
#: likewise for the pytest-timeout marks of the tests (``tests/conftest.py`` scales them): each
#: test's own waits already have ``SLACK``, this only ends a test that hangs outright
TIMEOUT_SLACK = float(os.environ.get("CAIRN_TEST_TIMEOUT_SLACK", "4"))
#: seconds without any progress after which a wait fails; ``CAIRN_TEST_STALL`` overrides it
STALL = float(os.environ.get("CAIRN_TEST_STALL", "120"))


class StallWatch:
    """Fails a loop that stopped progressing: ``check(progress)`` with any
    comparable fingerprint of the work done so far (runs completed, history
    length, effects written) raises once it has not changed for ``stall``
    seconds, or once ``ceiling`` seconds passed since the watch began."""

    def __init__(
        self, what: str | Callable[[], str], stall: float = STALL, ceiling: float | None = None
    ) -> None:
        self.what = what
        self.stall = stall
        self.ceiling = ceiling
        self.began = self.since = time.monotonic()
        self.last: object = None

    def touch(self) -> None:
        """Count now as progress (after a wait bounded by a condition of its own)."""
        self.since = time.monotonic()

    def check(self, progress: object, state: str | Callable[[], str] = "") -> None:
        now = time.monotonic()
        if progress != self.last:
            self.last, self.since = progress, now
            return
        over = self.ceiling is not None and now - self.began > self.ceiling
        if now - self.since > self.stall or over:
            what = self.what() if callable(self.what) else self.what
            detail = state() if callable(state) else state
            why = (f"nothing progressed for {now - self.since:.0f}s" if not over
                   else f"still going after the ceiling of {self.ceiling:.0f}s")
            raise AssertionError(f"{why} waiting for {what} (last progress {progress!r}) {detail}")


def slowness(wall: float, cpu: float) -> float:
    """How many times slower than when alone the machine runs a process: the
    wall time some CPU-bound work took (a worker process's start-up: the
    interpreter, the imports) over the CPU time it used. About 1 on a quiet
    machine, 7 and more at load ~15 on two cores; never below 1. A schedule in
    seconds multiplied by it keeps its proportion to the work (how many kills
    land per step done) on any machine."""
    return max(1.0, wall / max(cpu, 0.01))
