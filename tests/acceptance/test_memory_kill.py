"""SIGKILL workers at random points while steps write memory (issue 14).

For every recorded step its memory writes exist exactly once (one item of
version 1, one run-memory key, one thread message), and they are the writes
of the execution that was recorded (the same process id as the recorded
result); for every step not recorded (yet) there is none. Checked after
every kill, with no worker alive, and again once the runs completed: on
SQLite and PostgreSQL, sync and async workflows.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from typing import Any

import pytest

import cairn
from cairn import EventType, RunStatus
from tests.acceptance.apps import SLOW_ENV
from tests.acceptance.harness import (
    Cluster,
    audit_history,
    format_history,
    stop_outside_transaction,
    wait_until,
)

pytestmark = pytest.mark.slow

STEPS = 100
PAUSE = 0.03
KILLS = 8
LEASE = 1.0
#: the kill test's lease: each kill's successor has a new id and takes the run over once the
#: dead worker's lease expired, so each kill waits out up to one lease (a worker that lost its
#: lease on a loaded machine without a kill is fenced like a killed one: still the guarantee)
KILL_LEASE = 0.5
SEED = int(os.environ.get("CAIRN_KILL_SEED", "1414"))


def _recorded(app: cairn.App, run_id: str) -> dict[int, dict[str, Any]]:
    """The recorded result of each step of the run, by its ``i``."""
    found: dict[int, dict[str, Any]] = {}
    for entry in app.history(run_id):
        if entry.event is EventType.STEP_COMPLETED and entry.step_kind == "step":
            assert entry.payload is not None
            assert entry.payload.data is not None
            mark = json.loads(entry.payload.data)
            assert mark["i"] not in found, f"step {mark['i']} recorded twice"
            found[mark["i"]] = mark
    return found


def _check(app: cairn.App, run_id: str, context: str) -> int:
    """Memory is exactly what the journal recorded; returns how many steps are."""
    recorded = _recorded(app, run_id)
    items = {item.key: item for item in app.operator.memory_items("default", ("mem", run_id), limit=1000)}
    assert set(items) == {f"s{i}" for i in recorded}, (
        f"items {sorted(items)} but recorded steps {sorted(recorded)} {context}")
    for i, mark in recorded.items():
        item = items[f"s{i}"]
        assert item.version == 1, f"s{i} written {item.version} times {context}"
        assert item.value == mark, f"s{i} holds {item.value}, the recorded execution was {mark} {context}"
    scratch = app.operator.run_memory(run_id)
    assert scratch == {f"s{i}": mark for i, mark in recorded.items()}, f"run memory {scratch} {context}"
    messages = [m.value for m in app.operator.thread_messages("default", run_id)]
    assert sorted(messages, key=lambda m: m["i"]) == [recorded[i] for i in sorted(recorded)], (
        f"thread messages {messages} {context}")
    assert [m["i"] for m in messages] == sorted(recorded), f"messages out of order {context}"
    workflow_items = app.operator.memory_items("default", ("wf", run_id), limit=1000)
    assert all(item.version == 1 for item in workflow_items), f"a workflow write repeated {context}"
    return len(recorded)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("workflow", ["memfifty", "amemfifty"], ids=["sync", "async"])
def test_memory_writes_exist_once_per_recorded_step_under_sigkill(cluster: Cluster, workflow: str) -> None:
    rng = random.Random(SEED + len(workflow))
    app = cluster.app(lease_seconds=KILL_LEASE)
    run_id = f"mem-{workflow}"
    app.start(workflow, STEPS, PAUSE, run_id=run_id)
    context = f"(seed {SEED}, {workflow}; set CAIRN_KILL_SEED to replay)"

    def begun(pid: int) -> bool:
        return any(e["kind"] == "begin" and e["pid"] == pid for e in cluster.effects())

    progress = []
    for k in range(KILLS):
        worker = cluster.spawn(f"mk-{k}", lease=KILL_LEASE, forked=True)  # (a zygote's child: no imports)
        wait_until(lambda w=worker: begun(w.pid), KILL_LEASE + 15, f"worker mk-{k} to begin a step {context}")
        time.sleep(rng.uniform(0.0, 0.3))  # the random kill point itself, not a synchronisation
        worker.kill()
        progress.append(_check(app, run_id, f"after kill {k} {context}"))
        status = app.get_run(run_id).status
        assert status is not RunStatus.COMPLETED, f"too short for {KILLS} kills {context}"
    final = cluster.spawn("mk-final", lease=KILL_LEASE, forked=True)
    wait_until(lambda: app.get_run(run_id).status is RunStatus.COMPLETED, 60,
               f"the run to complete {context}")
    final.send(signal.SIGTERM)
    assert final.wait_exit(10) == 0
    history = app.history(run_id)
    assert not audit_history(history), format_history(history)
    assert _check(app, run_id, f"at the end {context}") == STEPS
    assert len(app.operator.memory_items("default", ("wf", run_id))) == STEPS // 5
    assert progress == sorted(progress), f"recorded steps went back: {progress}"
    begins = [e for e in cluster.effects() if e["kind"] == "begin"]
    print(f"{KILLS} kills, {len(begins) - STEPS} step executions lost to them; progress {progress}")


@pytest.mark.timeout(120)
def test_a_frozen_workers_buffered_writes_never_land(cluster: Cluster) -> None:
    """A worker frozen (SIGSTOP) inside a step body that has already buffered
    its memory writes, past its lease; a second worker takes over and records
    the step; the first wakes up (SIGCONT), finishes the body and is fenced
    out: only the second worker's writes exist."""
    app = cluster.app(lease_seconds=LEASE)
    run_id = "mem-fenced"
    app.start("memfenced", 7, run_id=run_id)
    first = cluster.spawn("mf-w1", lease=LEASE, poll_interval=0.2, env={SLOW_ENV: "3.0"})
    wait_until(lambda: any(e["kind"] == "begin" and e["pid"] == first.pid for e in cluster.effects()), 15,
               "the first worker to enter the step")
    stop_outside_transaction(first, cluster.backend)
    wait_until(lambda: (app.get_run(run_id).lease_expires_at or 0) < time.time(), LEASE + 5,
               "the frozen worker's lease to expire")
    second = cluster.spawn("mf-w2", lease=LEASE, env={SLOW_ENV: "0"})
    wait_until(lambda: app.get_run(run_id).status is RunStatus.COMPLETED, 15, "the second worker to finish")
    first.send(signal.SIGCONT)
    wait_until(lambda: any(e["kind"] == "end" and e["pid"] == first.pid for e in cluster.effects()), 10,
               "the resumed worker to finish its step body")
    wait_until(lambda: "no longer held" in first.log_text(), 10,
               lambda: f"the resumed worker to report its rejected write; log:\n{first.log_tail()}")
    [item] = app.operator.memory_items("default", ("mem", run_id))
    assert (item.version, item.value["pid"]) == (1, second.pid), item
    messages = app.operator.thread_messages("default", run_id)
    assert [m.value["pid"] for m in messages] == [second.pid]
    assert app.operator.run_memory(run_id) == {"s7": item.value}
