"""A git import SIGKILLed between storing the tree's objects and recording
its root (fault point ``workspace.import.after_objects``), on SQLite and
PostgreSQL: the run it left never runs on a missing tree (the worker that
recovers it fails it, naming why), starting it again under the same id is
refused with that reason, and an import under a new id is clean.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from cairn import EventType, RunStatus
from cairn.api.wsimport import IMPORT_POSITION, GitImportError
from cairn.engine.workspace import DETAIL_KEY
from tests import processes
from tests.backends import StoreBackend
from tests.workspace.test_git_import import build, expected_root, repo  # noqa: F401 - a fixture

pytestmark = pytest.mark.slow


def test_a_killed_import_leaves_no_run_on_a_partial_tree(backend: StoreBackend, repo: Path,  # noqa: F811
                                                         tmp_path: Path) -> None:
    app = build(backend.url, tmp_path / "ws")
    try:
        args = [backend.worker_url("importer"), str(tmp_path / "importer-ws"), str(repo), "g1"]
        child = processes.spawn("tests.workspace.git_importer", args,
                                env={"CAIRN_FAULTS": "workspace.import.after_objects"},
                                log=tmp_path / "importer.log")
        assert child.wait(timeout=120) == -signal.SIGKILL, (tmp_path / "importer.log").read_text()[-2000:]
        root = expected_root(tmp_path, "v1")
        assert app.store.workspace_objects("default", [root])  # killed after storing the tree...
        history = app.history("g1")
        assert not [e for e in history if e.position == IMPORT_POSITION]  # ...before recording it

        # starting it again under the same id: refused, saying why
        with pytest.raises(GitImportError, match="never recorded"):
            app.start("ws-git", run_id="g1", workspace_from=repo, workspace_ref="v1")

        # once the dead import's lease is over, a worker meets the run: it fails it, running nothing
        time.sleep(5.5)
        app.worker(concurrency=1).run(max_idle=1.0)
        run = app.get_run("g1")
        assert run.status is RunStatus.FAILED
        assert "import never finished" in str(run.error)
        assert not [e for e in app.history("g1")
                    if e.event is EventType.STEP_COMPLETED and e.position is not None and e.position >= 0]

        # a new id imports cleanly
        handle = app.start("ws-git", run_id="g2", workspace_from=repo, workspace_ref="v1")
        app.worker(concurrency=1).run(max_idle=0.5)
        assert handle.result(timeout=10)["root"] == root
        imported = [e for e in app.history("g2") if e.position == IMPORT_POSITION]
        assert imported[0].detail is not None
        assert imported[0].detail[DETAIL_KEY] == root
    finally:
        app.close()
