"""The audit chain under SIGKILL (issue 26): a link is written in the
transaction of its entry, so a worker process killed at random points, on
either backend, never leaves an entry without its link or a link without
its entry; after the runs complete under the next workers (takeovers and
reclaims included), every chain verifies, and a checkpoint anchors them all
(VERIFIED)."""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import pytest

from cairn import RunStatus
from cairn.api import auditanchor
from cairn.api.audit import Verdict
from tests.acceptance.harness import Cluster, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

RUNS = 3
STEPS = 30
PAUSE = 0.02
KILLS = 6
LEASE = 1.0


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
def test_sigkilled_workers_leave_every_entry_linked(cluster: Cluster, tmp_path: Path) -> None:
    rng = random.Random(26)
    app = cluster.app(lease_seconds=LEASE)
    run_ids = [f"audit-kill-{i}" for i in range(RUNS)]
    for run_id in run_ids:
        app.start("fifty", STEPS, PAUSE, run_id=run_id)

    def all_completed() -> bool:
        return all(app.get_run(r).status is RunStatus.COMPLETED for r in run_ids)

    def begun(pid: int) -> bool:
        return any(e["kind"] == "begin" and e["pid"] == pid for e in cluster.effects())

    for k in range(KILLS):
        worker = cluster.spawn(f"ak-{k % 2}", lease=LEASE)  # the same id: a reclaim; the other: a takeover
        wait_until(lambda w=worker: begun(w.pid) or all_completed(), LEASE + 15,
                   f"worker {k} to begin a step")
        time.sleep(rng.uniform(0.0, 0.2))  # the random kill point itself
        worker.kill()
        report = app.audit.verify()  # between kills: whatever was committed is linked
        assert report.problems == [], f"after kill {k}: {report.summary()}"
    final = cluster.spawn("ak-final", lease=LEASE)
    wait_until(all_completed, 60, "every run to complete after the last kill")
    final.send(signal.SIGTERM)
    assert final.wait_exit(10) == 0

    report = app.audit.verify()
    assert report.problems == [], report.summary()
    assert report.verdict is Verdict.UNANCHORED  # no anchor yet: never a plain pass
    assert report.runs == RUNS
    assert report.entries == sum(len(app.history(r)) for r in run_ids)
    key, anchor = tmp_path / "audit.key", tmp_path / "anchor.jsonl"
    auditanchor.generate_key(key)
    app.audit.checkpoint(key, anchor=anchor)
    assert app.audit.verify(anchor=anchor, key=key).verdict is Verdict.VERIFIED
