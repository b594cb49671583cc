"""A run that kills its worker every time is quarantined, not retried forever."""

from __future__ import annotations

import pytest

from cairn.store.records import EventType, RunStatus
from tests.acceptance.harness import Cluster, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

MAX_RECOVERIES = 2


def test_poison_run_is_quarantined_and_others_complete(cluster: Cluster) -> None:
    app = cluster.app(lease_seconds=0.5, max_recoveries=MAX_RECOVERIES)
    app.start("poisoned", run_id="poison", priority=10)  # first in line every time
    for k in range(5):
        app.start("short", k, 0.0, run_id=f"ok-{k}")
    deaths = 0
    for attempt in range(MAX_RECOVERIES + 3):
        # the same worker id each time: a restarted worker reclaims its dead
        # incarnation's run at once, which is a takeover like any other
        worker = cluster.spawn("w", lease=0.5, max_recoveries=MAX_RECOVERIES)
        wait_until(
            lambda w=worker: w.popen.poll() is not None or app.get_run("poison").status.terminal,
            20, f"worker {attempt} to die or the poison run to be quarantined",
        )
        if worker.popen.poll() is not None:
            assert worker.popen.returncode == -9, cluster.describe_workers()
            deaths += 1
            continue
        break
    run = app.get_run("poison")
    assert run.status is RunStatus.QUARANTINED, cluster.describe_workers()
    assert run.error is not None
    assert run.error["type"] == "Quarantined"
    assert deaths == MAX_RECOVERIES + 1  # claimed once, taken over twice, then refused
    assert run.recoveries == MAX_RECOVERIES + 1
    events = [e.event for e in app.history("poison")]
    assert events.count(EventType.LEASE_TAKEN_OVER) == MAX_RECOVERIES
    assert events[-1] is EventType.RUN_QUARANTINED
    # the surviving worker goes on with the other runs
    wait_until(lambda: all(app.get_run(f"ok-{k}").status is RunStatus.COMPLETED for k in range(5)),
               20, "the healthy runs to complete")
    # an operator can release it (it will die again: that is the operator's call)
    assert app.retry("poison").status is RunStatus.PENDING
