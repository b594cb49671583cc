"""Signals under SIGKILL, with real worker processes, on SQLite and PostgreSQL.

A worker is killed at each step of a wait: before the wait is recorded
(``store.suspend.before_commit``), while the run waits (a plain SIGKILL),
while the signal is being consumed (``store.take_delivery.*``), and after
the run resumed (``step.before_record``); a sender process is killed while
delivering (``store.deliver.*``); a run sending signals to another is killed
between the delivery and its record (``signal.after_deliver``). In every
case the signal is consumed exactly once, its data is what was sent, and no
journaled step before the wait runs again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn.store.records import EventType, RunStatus
from tests.acceptance.apps import DB_ENV, EFFECTS_ENV
from tests.acceptance.harness import WorkerPool, WorkerProcess, read_effects, wait_until
from tests.backends import StoreBackend
from tests.signals.crash_app import build_app

MODULE = "tests.signals.crash_app"


class SignalCluster(WorkerPool):
    def app(self) -> cairn.App:
        return self._keep(build_app(self.db_url, str(self.effects_path)))

    def _env(self, worker_id: str, faults: str | None) -> dict[str, str]:
        env = {DB_ENV: self.backend.worker_url(worker_id), EFFECTS_ENV: str(self.effects_path)}
        if faults:
            env["CAIRN_FAULTS"] = faults
        return env

    def spawn(self, worker_id: str, faults: str | None = None) -> WorkerProcess:
        return self._launch(MODULE, worker_id, [], self._env(worker_id, faults))

    def send(self, run_id: str, name: str, data: Any, faults: str | None = None) -> WorkerProcess:
        return self._launch(MODULE, "sender", ["--send", run_id, name, json.dumps(data)],
                            self._env("sender", faults))


@pytest.fixture
def cluster(
    tmp_path: Path, backend: StoreBackend, call_failed: Callable[[], bool]
) -> Iterator[SignalCluster]:
    pool = SignalCluster(tmp_path, backend)
    try:
        yield pool
    finally:
        if call_failed():
            print(f"\nworker logs (in {tmp_path}):\n{pool.describe_workers()}")
        pool.cleanup()


def _status(app: cairn.App, run_id: str, status: RunStatus) -> Callable[[], bool]:
    return lambda: app.get_run(run_id).status is status


def _labels(cluster: SignalCluster, run_id: str) -> list[str]:
    return [e["label"] for e in read_effects(cluster.effects_path) if e["run_id"] == run_id]


def _check_consumed_once(app: cairn.App, run_id: str, key: str = "signal:go") -> None:
    mailbox = app.operator.mailbox(run_id, key)
    assert all(m.taken_position is not None for m in mailbox)
    received = [e for e in app.history(run_id)
                if e.step_kind == "signal" and e.event is EventType.STEP_COMPLETED]
    assert sorted(e.detail["delivery"] for e in received if e.detail) == [m.seq for m in mailbox]


@pytest.mark.parametrize("workflow", ["receiver", "areceiver"])
@pytest.mark.slow
def test_killed_before_the_wait_is_recorded(cluster: SignalCluster, workflow: str) -> None:
    app = cluster.app()
    run_id = app.start(workflow).run_id
    first = cluster.spawn("w1", faults="store.suspend.before_commit")
    first.wait_exit(30)  # died with the suspension's transaction open: rolled back
    assert app.get_run(run_id).status is RunStatus.RUNNING
    app.signal(run_id, "go", {"n": 1})  # to a run whose holder is dead: kept in its mailbox
    cluster.spawn("w2")
    assert app.handle(run_id).result(timeout=30) == {"n": 1}
    assert _labels(cluster, run_id) == ["before", 'after {"n": 1}']  # "before" was journaled: not re-run
    _check_consumed_once(app, run_id)


@pytest.mark.parametrize("workflow", ["receiver", "areceiver"])
@pytest.mark.slow
def test_killed_while_waiting(cluster: SignalCluster, workflow: str) -> None:
    app = cluster.app()
    first = cluster.spawn("w1")
    run_id = app.start(workflow).run_id
    wait_until(_status(app, run_id, RunStatus.SUSPENDED), 30, "the run to suspend")
    first.kill()
    app.signal(run_id, "go", {"n": 2})
    cluster.spawn("w2")
    assert app.handle(run_id).result(timeout=30) == {"n": 2}
    assert _labels(cluster, run_id) == ["before", 'after {"n": 2}']
    _check_consumed_once(app, run_id)


@pytest.mark.parametrize("point", ["store.take_delivery.before_commit", "store.take_delivery.after_commit"])
@pytest.mark.slow
def test_killed_while_the_signal_is_consumed(cluster: SignalCluster, point: str) -> None:
    app = cluster.app()
    first = cluster.spawn("w1", faults=point)
    run_id = app.start("receiver").run_id
    wait_until(_status(app, run_id, RunStatus.SUSPENDED), 30, "the run to suspend")
    app.signal(run_id, "go", {"n": 3})
    first.wait_exit(30)
    cluster.spawn("w2")
    assert app.handle(run_id).result(timeout=30) == {"n": 3}
    assert _labels(cluster, run_id) == ["before", 'after {"n": 3}']
    _check_consumed_once(app, run_id)


@pytest.mark.slow
def test_killed_after_the_run_resumed(cluster: SignalCluster) -> None:
    app = cluster.app()
    first = cluster.spawn("w1")
    run_id = app.start("receiver").run_id
    wait_until(_status(app, run_id, RunStatus.SUSPENDED), 30, "the run to suspend")
    first.kill()
    second = cluster.spawn("w2", faults="step.before_record")  # its first step: the one after the wait
    app.signal(run_id, "go", {"n": 4})
    second.wait_exit(30)
    cluster.spawn("w3")
    assert app.handle(run_id).result(timeout=30) == {"n": 4}
    # the step after the wait ran again (it was not recorded), with the same data
    assert _labels(cluster, run_id) == ["before", 'after {"n": 4}', 'after {"n": 4}']
    _check_consumed_once(app, run_id)


@pytest.mark.slow
def test_the_timeout_fires_after_a_restart(cluster: SignalCluster) -> None:
    app = cluster.app()
    first = cluster.spawn("w1")
    run_id = app.start("receiver", timeout=1.5).run_id
    wait_until(_status(app, run_id, RunStatus.SUSPENDED), 30, "the run to suspend")
    first.kill()
    deadline = app.get_run(run_id).wake_at
    assert deadline is not None
    time.sleep(max(0.0, deadline - time.time()) + 0.1)  # every worker was down when it passed
    cluster.spawn("w2")
    assert app.handle(run_id).result(timeout=30) == {"timeout": True}
    assert _labels(cluster, run_id) == ["before", 'after {"timeout": true}']


@pytest.mark.parametrize("point", ["store.deliver.before_commit", "store.deliver.after_commit"])
@pytest.mark.slow
def test_a_sender_killed_while_delivering(cluster: SignalCluster, point: str) -> None:
    app = cluster.app()
    cluster.spawn("w1")
    run_id = app.start("receiver").run_id
    wait_until(_status(app, run_id, RunStatus.SUSPENDED), 30, "the run to suspend")
    sender = cluster.send(run_id, "go", {"n": 5}, faults=point)
    assert sender.wait_exit(30) == -9
    delivered = app.operator.mailbox(run_id)
    if point.endswith("before_commit"):
        assert delivered == []  # nothing half-written: the run still waits
        assert app.get_run(run_id).status is RunStatus.SUSPENDED
        app.signal(run_id, "go", {"n": 5})
    assert app.handle(run_id).result(timeout=30) == {"n": 5}
    _check_consumed_once(app, run_id)
    assert len(app.operator.mailbox(run_id)) == 1


@pytest.mark.slow
def test_signals_between_runs_are_delivered_exactly_once_under_kills(cluster: SignalCluster) -> None:
    app = cluster.app()
    count = 6
    target = app.start("counter", count).run_id
    sender = app.start("pinger", target, count).run_id
    # each worker dies at a different instant of a send: after delivering but
    # before the journal knows, and right after a delivery's commit
    for n, faults in enumerate(("signal.after_deliver@2", "store.deliver.after_commit@2",
                                "signal.after_deliver@3")):
        worker = cluster.spawn(f"w{n}", faults=faults)
        worker.wait_exit(60)
    cluster.spawn("last")
    assert app.handle(sender).result(timeout=60) == count
    assert app.handle(target).result(timeout=60) == list(range(count))
    mailbox = app.operator.mailbox(target, "signal:n")
    assert [json.loads(m.payload.data or b"null") for m in mailbox if m.payload] == list(range(count))
    assert len({m.dedupe for m in mailbox}) == count
    assert {m.sender for m in mailbox} == {f"run:{sender}"}
    _check_consumed_once(app, target, "signal:n")
