"""A process killed at a store commit boundary: the transition happened
entirely or not at all, and after recovery the run finishes exactly once.

A child process holds a run through the store and finishes it with a fault
point armed (``CAIRN_FAULTS``), so it SIGKILLs itself inside the finishing
transaction (``before_commit``) or right after its commit (``after_commit``).
The parent then looks at what survived and recovers the run as a worker
would: takes it over once the dead holder's lease expired, and finishes it.
Real processes, real SIGKILL, real SQLite and PostgreSQL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cairn.store.contract import Store
from cairn.store.postgres import PostgresStore
from cairn.store.records import EventType, HistoryEvent, NewRun, Payload, RunStatus
from cairn.store.sqlite import SQLiteStore

REPO_ROOT = Path(__file__).resolve().parents[2]
LEASE = 0.5

# The child: create a run it holds, journal one step, finish it. The opener
# is the same expression the parent uses, so both open the same database.
CHILD = textwrap.dedent(
    """
    import sys
    from cairn.store.records import EventType, HistoryEvent, NewRun, Payload, RunStatus
    from cairn.store.sqlite import SQLiteStore
    from cairn.store.postgres import PostgresStore

    kind, where = sys.argv[1], sys.argv[2]
    store = SQLiteStore(where) if kind == "sqlite" else PostgresStore(where)
    claim = store.create_claimed_run(
        NewRun("r1", "wf", "1", "t", None, Payload(b"in")), "child", {lease})
    epoch = claim.run.epoch
    step = HistoryEvent(run_id="r1", seq=claim.next_seq, event=EventType.STEP_COMPLETED, at=0.0,
                        epoch=epoch, worker="child", position=0, step_kind="step", name="s",
                        payload=Payload(b"1"))
    store.append("r1", epoch, [step])
    end = HistoryEvent(run_id="r1", seq=step.seq + 1, event=EventType.RUN_COMPLETED, at=0.0,
                       epoch=epoch, worker="child")
    print("finishing", flush=True)
    store.finish_run("r1", epoch, end, RunStatus.COMPLETED, Payload(b"out"), None)
    print("finished", flush=True)
    """
).format(lease=LEASE)


@pytest.fixture(params=["sqlite", "postgres"])
def database(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, str, Callable[[], Store]]]:
    if request.param == "sqlite":
        path = str(tmp_path / "cairn.db")
        yield "sqlite", path, lambda: SQLiteStore(path)
    else:
        url: str = request.getfixturevalue("pg_url")
        yield "postgres", url, lambda: PostgresStore(url)


def _run_child(kind: str, where: str, faults: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CAIRN_FAULTS": faults,
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", CHILD, kind, where], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)


def _finishes(history: list[HistoryEvent]) -> int:
    return sum(1 for e in history if e.event in (EventType.RUN_COMPLETED, EventType.RUN_FAILED))


def _recover(store: Store) -> None:
    """What a worker does with a run whose holder died: take it over once the
    lease expired, then finish it from its journal."""
    time.sleep(LEASE + 0.2)
    claims = store.claim_runs("rescuer", ["wf"], 1, 30.0, max_recoveries=5)
    assert [c.run.run_id for c in claims] == ["r1"]
    claim = claims[0]
    assert [e.position for e in claim.history if e.event is EventType.STEP_COMPLETED] == [0]
    end = HistoryEvent(run_id="r1", seq=claim.next_seq, event=EventType.RUN_COMPLETED, at=0.0,
                       epoch=claim.run.epoch, worker="rescuer")
    store.finish_run("r1", claim.run.epoch, end, RunStatus.COMPLETED, Payload(b"out"), None)


@pytest.mark.slow
def test_killed_before_the_finish_commits_finishes_once_after_recovery(
    database: tuple[str, str, Callable[[], Store]],
) -> None:
    kind, where, opener = database
    child = _run_child(kind, where, "store.finish.before_commit")
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert "finishing" in child.stdout
    assert "finished" not in child.stdout
    store = opener()
    try:
        run = store.get_run("r1")
        assert run is not None
        assert run.status is RunStatus.RUNNING
        assert _finishes(store.history("r1")) == 0
        _recover(store)
        run = store.get_run("r1")
        assert run is not None
        assert run.status is RunStatus.COMPLETED
        history = store.history("r1")
        assert _finishes(history) == 1
        assert [e.seq for e in history] == list(range(1, len(history) + 1))
    finally:
        store.close()


@pytest.mark.slow
def test_killed_after_the_finish_committed_stays_finished(
    database: tuple[str, str, Callable[[], Store]],
) -> None:
    kind, where, opener = database
    child = _run_child(kind, where, "store.finish.after_commit")
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert "finished" not in child.stdout  # died before the caller learnt of it
    store = opener()
    try:
        run = store.get_run("r1")
        assert run is not None
        assert run.status is RunStatus.COMPLETED
        assert run.result == Payload(b"out")
        time.sleep(LEASE + 0.2)
        assert store.claim_runs("rescuer", ["wf"], 1, 30.0, max_recoveries=5) == []  # nothing to recover
        assert _finishes(store.history("r1")) == 1
    finally:
        store.close()


CLAIMER = textwrap.dedent(
    """
    import sys
    from cairn.store.sqlite import SQLiteStore
    from cairn.store.postgres import PostgresStore

    kind, where = sys.argv[1], sys.argv[2]
    store = SQLiteStore(where) if kind == "sqlite" else PostgresStore(where)
    assert store.claim_runs("idle", ["other"], 1, {lease}, 5) == []  # an idle poll is no commit boundary
    print("claiming", flush=True)
    store.claim_runs("child", ["wf"], 1, {lease}, 5)
    print("claimed", flush=True)
    """
).format(lease=LEASE)


@pytest.mark.parametrize(("moment", "status", "holder"), [("before_commit", RunStatus.PENDING, None),
                                                          ("after_commit", RunStatus.RUNNING, "child")])
@pytest.mark.slow
def test_killed_at_the_claim_commit_boundary(
    database: tuple[str, str, Callable[[], Store]], moment: str, status: RunStatus, holder: str | None,
) -> None:
    kind, where, opener = database
    store = opener()
    try:
        store.create_run(NewRun("r1", "wf", "1", "t", None, Payload(b"in")))
        env = {**os.environ, "CAIRN_FAULTS": f"store.claim.{moment}",
               "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
        child = subprocess.run([sys.executable, "-c", CLAIMER, kind, where], env=env, cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=60)
        assert child.returncode == -signal.SIGKILL, child.stderr
        assert "claiming" in child.stdout
        assert "claimed" not in child.stdout
        run = store.get_run("r1")
        assert run is not None
        assert (run.status, run.owner) == (status, holder)  # all of the claim, or none of it
        time.sleep(LEASE + 0.2)
        (claim,) = store.claim_runs("rescuer", ["wf"], 1, 30.0, max_recoveries=5)
        events = [e.event for e in claim.history]
        started = [EventType.RUN_CREATED, EventType.LEASE_CLAIMED, EventType.RUN_STARTED]
        rescued = [EventType.LEASE_LOST, EventType.LEASE_TAKEN_OVER] if holder else started[1:]
        assert events == ([*started, *rescued] if holder else started)
    finally:
        store.close()
