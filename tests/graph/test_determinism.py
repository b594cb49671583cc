"""Reducers and the merge order of parallel nodes are deterministic across
runs and processes: the same graph, its nodes finishing in random orders,
writes byte-identical checkpoints in this process and in another process
with another hash seed; and a finished graph run passes the replay check."""

from __future__ import annotations

from pathlib import Path

import pytest

import cairn
from cairn.graph.checkpoints import KIND
from tests import processes
from tests.graph import determinism_app


def stored(app: cairn.App, run_id: str) -> list[bytes]:
    """The run's checkpoints as stored, but for the run each names (its last key)."""
    found = [app.runtime.payloads.raw(e.payload, what="a checkpoint") for e in app.history(run_id)
             if e.step_kind == KIND and e.payload is not None]
    own = f',"run":"{run_id}"}}'.encode()
    assert all(raw.endswith(own) for raw in found)
    return [raw[:-len(own)] for raw in found]


def test_parallel_merges_are_the_same_in_every_run(app: cairn.App) -> None:
    workflow = determinism_app.build(app)
    finals = [app.run(workflow, determinism_app.START, run_id=f"r{i}") for i in range(3)]
    assert finals[0] == finals[1] == finals[2]
    assert finals[0]["seen"]["all"][:4] == ["p", "q", "r", "s"]
    assert stored(app, "r0") == stored(app, "r1") == stored(app, "r2")


def test_a_finished_graph_run_passes_the_replay_check(app: cairn.App) -> None:
    workflow = determinism_app.build(app)
    app.run(workflow, determinism_app.START, run_id="checked")
    report = app.replay_check("checked")
    assert report.compatible, report.describe()


@pytest.mark.slow
@pytest.mark.parametrize("app", ["sqlite"], indirect=True)  # the other process opens the same file
def test_another_process_writes_the_same_checkpoints(app: cairn.App, tmp_path: Path) -> None:
    workflow = determinism_app.build(app)
    app.run(workflow, determinism_app.START, run_id="here")
    done = processes.run("tests.graph.determinism_app", [f"sqlite:///{tmp_path}/cairn.db", "there"],
                         env={"PYTHONHASHSEED": "12345"}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert stored(app, "here") == stored(app, "there")
    assert app.handle("there").result() == app.handle("here").result()
