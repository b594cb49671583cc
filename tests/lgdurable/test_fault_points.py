"""A LangGraph run's workers killed at each hit of one fault point in turn (both backends).

``test_kill.py`` kills at random moments; this test kills at exact ones, so
a crash window that breaks resumption fails here every time. For each point
a chain of worker processes runs the agent (``agent_app``), each armed with
``CAIRN_FAULTS=<point>@n``: it SIGKILLs itself at its n-th hit. ``n`` is 1,
or one more than the last worker's when that one died without the run
moving on (a resumed worker passes the same point again first: the redone
``put`` of the checkpoint whose commit was killed, ``_catch_up``'s journal
entry of the checkpoint stored before the kill), so the chain dies once at
each hit of the point, from the first to the last. An unarmed worker then
finishes the run, which must end COMPLETED with each payment made once and
the final state of an uninterrupted run. The workers alternate between the
two ways a run leaves a dead worker: a new worker id takes it over once the
dead one's lease expired, the dead one's own id (a restarted worker)
reclaims it at start-up, at once.

Regression test of issue 24's "a resumed run ends before its last nodes
ran": killed at ``langgraph.put.before_commit`` or ``langgraph.after_writes``
once every task of a super-step had stored its writes, the next worker took
the graph for finished (``get_state().next`` leaves those tasks out)."""

from __future__ import annotations

import itertools
import time
from collections import Counter
from pathlib import Path

import pytest

import cairn
from cairn.store.records import EventType, RunStatus
from tests import processes
from tests.backends import StoreBackend
from tests.lgdurable import agent_app

#: the points a LangGraph run passes, from its checkpoints to its tools' effects, and the
#: backends each is killed on: the two windows of the bug on both; the other four, whose code
#: is the same above either store, on one each, alternating (each case runs 20-30 worker
#: processes, forked from one pre-loaded parent: all twelve would add minutes to CI for no window
#: the eight do not cover)
CASES = (("langgraph.put.before_commit", "sqlite"), ("langgraph.put.before_commit", "postgres"),
         ("langgraph.after_writes", "sqlite"), ("langgraph.after_writes", "postgres"),
         ("langgraph.after_checkpoint", "postgres"), ("tool.after_intent", "sqlite"),
         ("tool.after_effect", "postgres"), ("tool.after_record", "sqlite"))
#: more workers than any point has hits in one run (the agent makes 21 payments, 23 checkpoints)
MOST_WORKERS = 80
#: the workers' lease: a worker with a new id takes the killed one's run over once its lease
#: expired (up to a lease after the kill, the renewals coming every third of it); at 1 s that
#: wait was most of each worker's life, and at 0.5 s it still was (a worker reaches its fault
#: point some 20 ms after its takeover), hence every other worker restarts under the dead one's
#: id (``worker_id``), which reclaims the run without waiting
LEASE = 0.5


def worker_id(k: int) -> str:
    """The id of the chain's ``k``-th worker: a new id after an even number of
    kills, the killed worker's own id (a restart: ``reclaim_owned``) after an
    odd number, so half the takeovers wait out a lease and half do not."""
    return f"w{k - k % 2}"


def _progress(app: cairn.App) -> int:
    """How far the run got: its journaled entries (calls, intents, restore points)."""
    return sum(1 for e in app.history("agent") if e.position is not None)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("point", "backend"), CASES, indirect=["backend"])
def test_a_worker_killed_at_each_hit_of_a_point(tmp_path: Path, backend: StoreBackend, point: str) -> None:
    app, workflow = agent_app.build(backend.url, tmp_path, lease_seconds=LEASE)
    app.start(workflow, agent_app.START_STATE, run_id="agent")
    env = {"CAIRN_TEST_DIR": str(tmp_path), agent_app.LEASE_ENV: f"{LEASE:g}"}
    kills, nth, worker = 0, 1, None
    # every worker is forked from one that imported the agent (LangGraph) and Cairn once
    zygote = processes.Zygote("tests.lgdurable.agent_app", log=tmp_path / "zygote.log",
                              preload=agent_app.PRELOAD)
    try:
        for k in range(MOST_WORKERS + 1):
            armed = k < MOST_WORKERS
            before = _progress(app)
            worker = zygote.spawn(
                ["--worker-id", worker_id(k)],
                env={**env, "CAIRN_TEST_DB": backend.worker_url(worker_id(k)),
                     **({"CAIRN_FAULTS": f"{point}@{nth}"} if armed else {})},
                log=tmp_path / f"w{k}.log")
            deadline = time.monotonic() + 120
            while worker.poll() is None and not app.get_run("agent").status.terminal \
                    and time.monotonic() < deadline:
                time.sleep(0.02)
            if worker.poll() is None:  # the run settled (or hangs: the assertion below says which)
                worker.kill()
                worker.wait(10)
                break
            kills += 1
            nth = 1 if _progress(app) > before else nth + 1
        run = app.get_run("agent")
        assert run.status is RunStatus.COMPLETED, f"{run.status.value}, {kills} kills at {point}: {run.error}"
        paid = Counter(e["what"] for e in agent_app.lines(tmp_path / "bank.jsonl"))
        assert paid == Counter(agent_app.PAYMENTS), paid
        assert kills >= 3, f"{point} fired {kills} time(s)"
        holders = [e.worker for e in app.history("agent")
                   if e.event in (EventType.LEASE_CLAIMED, EventType.LEASE_TAKEN_OVER)]
        same_id = Counter(held == took for held, took in itertools.pairwise(holders))
        assert same_id[True], f"no run taken back by a restarted worker's own id: {holders}"
        assert same_id[False], f"no run taken over by a new id once the lease expired: {holders}"
        final = app.handle("agent").result()
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait(10)
        zygote.close()
        app.close()
    clean_dir = tmp_path / "clean"
    clean_dir.mkdir()
    clean, clean_workflow = agent_app.build(f"sqlite:///{clean_dir}/cairn.db", clean_dir)
    try:
        assert final == clean.run(clean_workflow, agent_app.START_STATE, run_id="agent")
    finally:
        clean.close()
    print(f"{point}: {kills} workers killed")
