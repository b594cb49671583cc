"""A retention controller SIGKILLed in the middle of its deletions, on both
backends: what it committed is whole, what it did not is untouched, nothing
dangles and the audit chain holds; the next controller (once the dead one's
lease expires) finishes exactly the plan, and deletes nothing a policy keeps.

One child per backend, killed at a different point: SQLite inside a
deleting transaction (memory and bodies: it must roll back), PostgreSQL
between two committed batches of whole run trees."""

from __future__ import annotations

import time

import pytest

from cairn.store.retention import DataClass
from cairn.worker.retention import ORDER, Controller
from tests.processes import run
from tests.retention.test_controller import aged, policies
from tests.retention.world import dangling, verified


@pytest.mark.slow
def test_a_controller_killed_midway_leaves_everything_whole_and_the_next_pass_finishes(place: str) -> None:
    world = aged(place)
    policies(world)
    plan = world.app.operator.retention.plan()
    if place.startswith("sqlite"):
        fault = "retention.delete.before_commit@3"  # the third batch (one unit each), open: rolled back
    else:  # after the first run tree's batch: bodies and memory went a unit per batch before it
        before_history = sum(plan.count(cls) for cls in ORDER[:ORDER.index(DataClass.HISTORY)])
        fault = f"retention.after_batch@{before_history + 1}"
    offset = world.clock() - time.time()
    child = run("tests.retention.controller_child", [place, str(offset)], timeout=120,
                env={"CAIRN_FAULTS": fault})
    assert child.returncode == -9, child.stdout + child.stderr  # SIGKILLed, not a clean exit
    assert "pass complete" not in child.stdout

    # what the dead controller left: whole units only
    assert dangling(world) == {}
    verified(world)
    for name, run_id in world.runs.items():
        record = world.store.get_run(run_id)
        history = world.app.operator.history(run_id)
        if record is None:
            assert history == [], name
            assert (run_id,) in plan.units[DataClass.HISTORY], name
        else:
            assert [e.seq for e in history] == list(range(1, len(history) + 1)), name
    left = world.app.operator.retention.plan()
    planned = sum(len(keys) for keys in plan.units.values())
    gone_runs = [name for name in ("a-chat", "a-chat2") if world.store.get_run(world.runs[name]) is None]
    if place.startswith("sqlite"):  # two batches committed, the third rolled back
        assert sum(len(keys) for keys in left.units.values()) == planned - 2
        assert gone_runs == []
    else:  # every body and memory unit, and one of the two run trees
        assert sum(len(keys) for keys in left.units.values()) == 1
        assert len(gone_runs) == 1

    # the lease is the dead controller's until it expires: then the next pass finishes the plan
    assert Controller(world.store, "next").run() is None
    world.clock.now = time.time() + offset + 31  # the child's clock went on with the wall clock's
    done = Controller(world.store, "next").run()
    assert done is not None
    assert done.fenced is None
    for cls in DataClass:
        assert set(left.units[cls]) == set(done.units[cls]), cls
    assert all(not keys for keys in world.app.operator.retention.plan().units.values())
    for kept in ("a-other", "b-chat", "a-new", "b-new"):
        assert world.store.get_run(world.runs[kept]) is not None
    for gone in ("a-chat", "a-chat2"):
        assert world.store.get_run(world.runs[gone]) is None
    assert dangling(world) == {}
    assert verified(world).expired == 3
