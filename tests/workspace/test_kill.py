"""A worker process SIGKILLed while a step writes into the run's workspace.

Worker A runs ``ws-kill``: ``fill`` commits a snapshot, then ``slow_write``
deletes a file, adds one and streams a large file; A is SIGKILLed in the
middle of that write. Worker B (same workspaces directory, as a restarted
worker on the same machine would have: the half-written tree is on its
disk) takes the run over: the re-run body must find the tree exactly as the
last committed snapshot, and the run ends with the tree its last entry
records. Then a worker C with a directory of its own restores that final
snapshot from the store. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cairn import RunStatus
from cairn.workspace import TreeCache, restore
from tests import processes
from tests.backends import StoreBackend
from tests.workspace.test_run_workspace import roots
from tests.workspace.wsapps import DB_ENV, MARKER_ENV, build, root_of

pytestmark = pytest.mark.slow


def _spawn(
    backend: StoreBackend, tmp_path: Path, worker_id: str, workspaces: Path
) -> subprocess.Popen[bytes]:
    env = {DB_ENV: backend.worker_url(worker_id), "CAIRN_WORKSPACES": str(workspaces),
           MARKER_ENV: str(tmp_path / "marker")}
    return processes.spawn("tests.workspace.ws_worker", ["--worker-id", worker_id, "--lease", "1.0"],
                           env=env, log=tmp_path / f"{worker_id}.log")


def _wait(condition: object, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout}s; worker log:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)


def test_sigkill_mid_write_leaves_the_last_committed_snapshot(backend: StoreBackend, tmp_path: Path) -> None:
    app = build(backend.url, tmp_path / "test-process")
    shared = tmp_path / "machine-1"
    workers: list[subprocess.Popen[bytes]] = []
    try:
        handle = app.start("ws-kill", run_id="k1")
        workers.append(_spawn(backend, tmp_path, "a", shared))
        _wait(lambda: (tmp_path / "marker").exists(), 120, "worker a never started writing",
              tmp_path / "a.log")
        workers[0].send_signal(signal.SIGKILL)
        workers[0].wait(timeout=10)
        committed = roots(app, "k1")
        assert set(committed) == {"fill"}  # slow_write recorded nothing
        ws = app.runtime.workspaces.path_for("default", "k1")
        on_disk = shared / ws.name
        assert (on_disk / "big-output.bin").exists()  # the half-written tree is there
        assert root_of(on_disk) != committed["fill"]

        workers.append(_spawn(backend, tmp_path, "b", shared))
        result = handle.result(timeout=120)
        final = roots(app, "k1")
        assert result["slow"] == committed["fill"]  # the re-run body found the last committed snapshot
        assert result["after"] == final["slow_write"]
        assert final["look"] == final["slow_write"]
        assert not on_disk.exists()  # the run ended: its directory was removed
        assert app.get_run("k1").status is RunStatus.COMPLETED

        class Source:
            def fetch(self, oids: list[str]) -> dict[str, bytes]:
                return app.store.workspace_objects("default", oids)

        elsewhere = tmp_path / "machine-2"
        restore(elsewhere, final["look"], Source(), TreeCache())
        assert root_of(elsewhere) == final["look"]
    finally:
        for worker in workers:
            if worker.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.send_signal(signal.SIGKILL)
            worker.wait(timeout=10)
        app.close()
