"""Versions side by side with real worker processes (``tests.bundles.run_worker``),
SIGKILLed in between, on SQLite and PostgreSQL (the root ``backend`` fixture).

v1 runs suspended at their timers; workers serving only v2 never take them,
and ``cairn show`` says they wait for a worker serving their bundle; a
worker whose version 1 is other code refuses them with one log line; a v1
worker finishes them on v1 code. With both versions served and workers
killed mid-run, each run still executes only its own version's code."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import cairn
from cairn.cli.main import main
from cairn.store.records import RunStatus
from tests.acceptance.harness import WorkerPool, WorkerProcess, read_effects, wait_until
from tests.backends import StoreBackend
from tests.bundles import apps


class Deployments(WorkerPool):
    """Worker processes of the deployments of ``tests.bundles.apps``."""

    def spawn(self, deployment: str, worker_id: str) -> WorkerProcess:
        env = {"CAIRN_DB": self.backend.worker_url(worker_id), "BUNDLES_EFFECTS": str(self.effects_path)}
        return self._launch("tests.bundles.run_worker", worker_id, [deployment], env)

    def app(self, deployment: str) -> cairn.App:
        return self._keep(apps.APP_MODULES[deployment](self.backend.url))


@pytest.fixture
def pool(tmp_path: Path, backend: StoreBackend, call_failed: Callable[[], bool]) -> Iterator[Deployments]:
    deployments = Deployments(tmp_path, backend)
    try:
        yield deployments
    finally:
        if call_failed():
            print(f"\nworker logs (in {tmp_path}):\n{deployments.describe_workers()}")
        deployments.cleanup()


def _statuses(app: cairn.App, run_ids: list[str]) -> set[RunStatus]:
    return {app.get_run(r).status for r in run_ids}


def _show(url: str, run_id: str) -> str:
    result = CliRunner().invoke(main, ["show", run_id, "--db", url])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.slow
def test_v1_runs_wait_for_a_v1_worker_then_finish_on_v1_code(pool: Deployments) -> None:
    v1, v2 = pool.app("v1"), pool.app("v2")
    old = [v1.start("order", 2, 1.5).run_id for _ in range(3)]
    first = pool.spawn("v1", "v1-a")
    wait_until(lambda: _statuses(v1, old) == {RunStatus.SUSPENDED}, 30, "v1 runs at their timers")
    first.kill()
    v1_bundle = v1.get_run(old[0]).bundle
    newer = [pool.spawn("v2", f"v2-{i}") for i in range(2)]
    drifted = pool.spawn("drifted", "drifted")
    fresh = [v2.start("order", 1, 0.0).run_id for _ in range(2)]
    wait_until(lambda: _statuses(v2, fresh) == {RunStatus.COMPLETED}, 30, "v2 runs on the v2 workers")
    # the v1 runs are due, and nobody that is alive serves them: they wait, and say so
    wait_until(lambda: f"waiting for a worker serving bundle {v1_bundle}" in _show(pool.db_url, old[0]),
               30, "cairn show to say the run waits for a v1 worker")
    assert _statuses(v1, old) == {RunStatus.SUSPENDED}
    wait_until(lambda: "code drift" in drifted.log_text(), 30, "the drifted worker to refuse v1")
    refusals = [line for line in drifted.log_text().splitlines() if "code drift" in line]
    assert len(refusals) == 1
    assert v1_bundle is not None
    assert v1_bundle in refusals[0]
    assert "register the new code as a new version" in refusals[0]
    assert all(w.alive() for w in [*newer, drifted])
    pool.spawn("v1", "v1-b")
    wait_until(lambda: _statuses(v1, old) == {RunStatus.COMPLETED}, 30, "v1 runs on the new v1 worker")
    for run_id in old:
        assert v1.handle(run_id).result() == "v1 hello v1:0,v1:1,v1:2"
    for run_id in fresh:
        assert v2.handle(run_id).result() == "v2 hello v2:0,v2:1,v2:2"
    versions = {(e["run"], e["version"]) for e in read_effects(pool.effects_path)}
    assert {version for run, version in versions if run in old} == {"v1"}
    assert {version for run, version in versions if run in fresh} == {"v2"}


@pytest.mark.slow
def test_both_versions_served_each_run_on_its_own_code_across_kills(pool: Deployments) -> None:
    v1, v2 = pool.app("v1"), pool.app("v2")
    runs = {v1.start("order", 3, 0.4).run_id: "v1" for _ in range(3)}
    runs |= {v2.start("order", 3, 0.4).run_id: "v2" for _ in range(3)}
    for round_ in range(3):  # a worker serving both is killed mid-way, twice
        worker = pool.spawn("both", f"both-{round_}")
        wait_until(lambda: read_effects(pool.effects_path), 30, "some step to run")
        time.sleep(0.3)
        if round_ < 2:
            worker.kill()
    wait_until(lambda: _statuses(v1, list(runs)) == {RunStatus.COMPLETED}, 60, "every run to finish")
    for run_id, version in runs.items():
        expected = "v1 hello v1:0,v1:1,v1:2,v1:3" if version == "v1" else \
            "v2 hello v2:0,v2:1,v2:2,v2:3,v2:4"
        assert v1.handle(run_id).result() == expected
    for effect in read_effects(pool.effects_path):
        assert effect["version"] == runs[effect["run"]], effect
