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

import time

#: seconds of a ``ctx.sleep`` that must suspend the run (never due before its own entry is committed)
NAP = 0.5


def wait_out_nap() -> None:
    """Sleep until a ``NAP`` timer set before this call is due (with a margin
    for the clock's resolution), so the next execution finds it passed."""
    time.sleep(NAP + 0.05)
