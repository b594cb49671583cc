"""Frozen and clock-skewed workers on PostgreSQL (issue 9, items 12 and 13).

Each test runs the attacker in a process of its own, as a worker would be:

* frozen (SIGSTOP) at the worst instant of a claim or a finish, with row
  locks taken on the server; another worker must still take its runs within
  a bounded time (the server ends the frozen session, its locks go);
* with a wall clock 120 s ahead of the server's; it must not take over a
  lease that is live by the server's clock.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cairn.store.postgres import PostgresStore
from cairn.store.records import EventType, HistoryEvent, RunStatus
from tests import processes
from tests.store.contract import WF, FakeClock, new_run
from tests.timing import SLACK

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The server's idle_in_transaction_session_timeout is 5 s: a frozen
#: worker's locks must be gone well within this.
BOUND = 15.0

#: Freezes itself (SIGSTOP) right after the claim read locked its runs, before
#: the claim commits: in the old code, between the lane walk and the Sync of
#: its pipeline, where the server reports the session "active" and no
#: timeout applies.
FREEZE_IN_CLAIM = """
import os, signal, sys
from cairn.store.postgres import PostgresStore
store = PostgresStore(sys.argv[1])
select_lanes = PostgresStore._select_lanes
def freezing(self, tx, params):
    result = select_lanes(self, tx, params)
    if any(lane.candidates for lane in result[0]):
        print("locked", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    return result
PostgresStore._select_lanes = freezing
store.claim_runs("frozen", [sys.argv[2]], 1, 2.0, 5)
"""

#: Claims the run with a 2 s lease, then freezes itself inside its finish,
#: just before the commit (in the old code, inside the finish pipeline, after
#: the server locked the run row).
FREEZE_IN_FINISH = """
import os, signal, sys
import cairn.store.postgres as pg
from cairn.store.records import EventType, HistoryEvent, Payload, RunStatus
store = pg.PostgresStore(sys.argv[1])
[claim] = store.claim_runs("frozen", [sys.argv[2]], 1, 2.0, 5)
def freezing(name):
    if name == "store.finish.before_commit":
        print("locked", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
pg.fault_point = freezing
end = HistoryEvent(run_id=claim.run.run_id, seq=claim.next_seq, event=EventType.RUN_COMPLETED, at=0.0,
                   epoch=claim.run.epoch, worker="frozen")
store.finish_run(claim.run.run_id, claim.run.epoch, end, RunStatus.COMPLETED, Payload(b"1"), None)
"""

#: A worker whose wall clock runs 120 s ahead of the server's (set before
#: Cairn is imported, so every default clock reads it), trying to claim.
SKEWED_CLAIM = """
import sys, time
real = time.time
time.time = lambda: real() + 120.0
from cairn.store.postgres import PostgresStore
store = PostgresStore(sys.argv[1])
claims = store.claim_runs("skewed", [sys.argv[2]], 10, 30.0, 5)
print(" ".join(c.run.run_id for c in claims) or "none", flush=True)
"""


def _child(code: str, url: str) -> subprocess.Popen[str]:
    env = {"PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), str(REPO_ROOT),
                                          os.environ.get("PYTHONPATH", "")])}
    return processes.start([sys.executable, "-c", code, url, WF], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)


def _stopped(pid: int) -> bool:
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state == "T"


@pytest.mark.parametrize("script", [FREEZE_IN_CLAIM, FREEZE_IN_FINISH], ids=["claim", "finish"])
@pytest.mark.slow
def test_a_worker_frozen_mid_transaction_does_not_wedge_its_runs(pg_url: str, script: str) -> None:
    store = PostgresStore(pg_url)
    frozen = _child(script, pg_url)
    try:
        store.create_run(new_run("r1"))
        assert frozen.stdout is not None
        assert frozen.stdout.readline().strip() == "locked", frozen.stderr.read() if frozen.stderr else ""
        deadline = time.monotonic() + 5 * SLACK
        while not _stopped(frozen.pid):
            assert time.monotonic() < deadline, "the child never froze"
            time.sleep(0.01)
        frozen_at = time.monotonic()
        claims = []
        while not claims and time.monotonic() - frozen_at < BOUND:
            claims = store.claim_runs("rescuer", [WF], 1, 30.0, 5)
            time.sleep(0.2)
        assert [c.run.run_id for c in claims] == ["r1"], f"run still wedged after {BOUND}s"
        claim = claims[0]
        end = HistoryEvent(run_id="r1", seq=claim.next_seq, event=EventType.RUN_COMPLETED, at=0.0,
                           epoch=claim.run.epoch, worker="rescuer")
        store.finish_run("r1", claim.run.epoch, end, RunStatus.COMPLETED, None, None)
        run = store.get_run("r1")
        assert run is not None
        assert run.status is RunStatus.COMPLETED
        history = store.history("r1")
        assert sum(e.event is EventType.RUN_COMPLETED for e in history) == 1
    finally:
        frozen.kill()
        frozen.communicate()  # reaps it and closes its pipes
        store.close()


@pytest.mark.slow
def test_a_worker_with_a_clock_ahead_does_not_take_over_a_live_lease(pg_url: str) -> None:
    store = PostgresStore(pg_url)  # the server's clock
    try:
        store.create_run(new_run("r1"))
        [held] = store.claim_runs("honest", [WF], 1, 30.0, 5)
        skewed = _child(SKEWED_CLAIM, pg_url)
        out, err = skewed.communicate(timeout=60)
        assert skewed.returncode == 0, err
        assert out.strip() == "none"
        run = store.get_run("r1")
        assert run is not None
        assert (run.owner, run.epoch) == ("honest", held.run.epoch)
        # and its lease was judged by the server's clock, not the honest worker's
        assert store.renew_leases("honest", {"r1": held.run.epoch}, 30.0) == set()
    finally:
        store.close()


#: A worker whose wall clock runs 120 s behind the server's claims a run.
SKEWED_BEHIND_CLAIM = """
import sys, time
real = time.time
time.time = lambda: real() - 120.0
from cairn.store.postgres import PostgresStore
store = PostgresStore(sys.argv[1])
claims = store.claim_runs("behind", [sys.argv[2]], 10, 30.0, 5)
print(" ".join(c.run.run_id for c in claims) or "none", flush=True)
"""


@pytest.mark.slow
def test_a_worker_with_a_clock_behind_does_not_write_a_lease_already_expired(pg_url: str) -> None:
    """The other side of skew: a lease written by a worker whose clock is
    behind would have expired at once, and every other worker would take the
    live run over (and re-send its in-flight write)."""
    store = PostgresStore(pg_url)
    # runnable since long ago, so that even a worker 120 s behind sees it due
    creator = PostgresStore(pg_url, clock=FakeClock(1000.0))
    try:
        creator.create_run(new_run("r1"))
        behind = _child(SKEWED_BEHIND_CLAIM, pg_url)
        out, err = behind.communicate(timeout=60)
        assert behind.returncode == 0, err
        assert out.strip() == "r1"
        assert store.claim_runs("honest", [WF], 10, 30.0, 5) == []
        run = store.get_run("r1")
        assert run is not None
        assert run.owner == "behind"
        assert run.lease_expires_at is not None
        assert run.lease_expires_at > store.clock() + 20
    finally:
        creator.close()
        store.close()
