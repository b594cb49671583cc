"""A worker SIGKILLed while a sandboxed command runs in the run's workspace,
on SQLite and PostgreSQL.

Worker A starts ``sbx-kill``'s sandboxed command, which writes
``partial.txt`` and sleeps; A is SIGKILLed then. Its sandbox dies with it
(``--die-with-parent``: no process of it is left on the host). Worker B
takes the run over and runs the command again on the restored workspace:
the command's own listing shows no ``partial.txt`` (the killed attempt's
file was undone before it), and the run ends with the files of the
complete attempt.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cairn import RunStatus
from tests import processes
from tests.backends import StoreBackend
from tests.sandbox.sbxapps import DB_ENV, build
from tests.sandbox.test_escape import _survivors

pytestmark = pytest.mark.slow


def _spawn(backend: StoreBackend, tmp_path: Path, worker_id: str,
           workspaces: Path) -> subprocess.Popen[bytes]:
    # TMPDIR: the worker's copy of /etc (bwrap.etc_view) goes in the test's directory, since a
    # SIGKILLed worker never removes it
    env = {DB_ENV: backend.worker_url(worker_id), "CAIRN_WORKSPACES": str(workspaces),
           "TMPDIR": str(tmp_path)}
    return processes.spawn("tests.sandbox.sbx_worker", ["--worker-id", worker_id], env=env,
                           log=tmp_path / f"{worker_id}.log")


def _wait(condition: object, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout}s; worker log:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)


def test_sigkill_mid_command_reruns_it_on_the_restored_workspace(
    backend: StoreBackend, tmp_path: Path, ws: Path  # ws: the host's controls are checked
) -> None:
    app = build(backend.url, str(tmp_path / "test-process"))
    shared = tmp_path / "machine-1"
    marker = f"cairn-sbx-kill-{os.getpid()}-{time.monotonic_ns()}"
    workers: list[subprocess.Popen[bytes]] = []
    try:
        handle = app.start("sbx-kill", run_id="k1", marker=marker)
        workers.append(_spawn(backend, tmp_path, "a", shared))
        on_disk = shared / app.runtime.workspaces.path_for("default", "k1").name
        _wait(lambda: (on_disk / "partial.txt").exists() and _survivors(marker), 120,
              "worker a's sandboxed command never started", tmp_path / "a.log")
        workers[0].send_signal(signal.SIGKILL)
        workers[0].wait(timeout=10)
        _wait(lambda: not _survivors(marker), 5, "the sandbox outlived its worker", tmp_path / "a.log")

        workers.append(_spawn(backend, tmp_path, "b", shared))
        result = handle.result(timeout=120)
        assert result["exit_code"] == 0
        files = result["files"]
        # the re-run found the recorded tree only (`ls > seen.txt` lists the file it writes to)
        assert files["seen.txt"].split() == ["input.txt", "seen.txt"]
        assert files["done.txt"] == "done\n"
        assert app.get_run("k1").status is RunStatus.COMPLETED
    finally:
        for worker in workers:
            if worker.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.send_signal(signal.SIGKILL)
            worker.wait(timeout=10)
        app.close()
