"""A worker process SIGKILLed in the middle of a parallel super-step whose
branches each work in a directory of their own.

Worker A runs ``ws-branches``: ``setup`` commits a snapshot, then ``left``
records its change while ``right`` is killed mid-write (its branch directory
holds a half-written file). Worker B, on the same machine's directories,
takes the run over: ``left``'s step replays, ``right``'s runs again and must
find exactly the super-step's starting snapshot, and the merged checkpoint
holds both branches' recorded changes and nothing of the killed attempt. On
SQLite and PostgreSQL.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from pathlib import Path

import pytest

from cairn import RunStatus
from cairn.workspace import TreeCache, restore
from tests.backends import StoreBackend
from tests.workspace.test_branches import checkpoint_roots, step_roots
from tests.workspace.test_kill import _spawn, _wait
from tests.workspace.wsapps import build

pytestmark = pytest.mark.slow


def test_sigkill_mid_superstep_resumes_from_the_committed_snapshots(backend: StoreBackend,
                                                                   tmp_path: Path) -> None:
    app = build(backend.url, tmp_path / "test-process")
    shared = tmp_path / "machine-1"
    workers: list[subprocess.Popen[bytes]] = []
    edits = {"setup": {"writes": {"base.txt": "base", "sub/keep.txt": "keep"}},
             "left": {"writes": {"left.txt": "l"}},
             "right": {"writes": {"right.txt": "r", "sub/r.txt": "r"}, "removes": ["base.txt"], "hang": True}}
    try:
        handle = app.start("ws-branches", {"edits": edits, "seen": []}, run_id="k2")
        workers.append(_spawn(backend, tmp_path, "a", shared))
        _wait(lambda: (tmp_path / "marker").exists(), 120, "worker a never started writing",
              tmp_path / "a.log")
        workers[0].send_signal(signal.SIGKILL)
        workers[0].wait(timeout=10)
        assert checkpoint_roots(app, "k2") == {}  # the super-step did not commit
        setup_root = step_roots(app, "k2")[0][1]
        main = app.runtime.workspaces.path_for("default", "k2")
        right_dir = shared / f"{main.name}.b1"
        assert (right_dir / "half-written.bin").exists()  # the killed attempt's files are on disk

        workers.append(_spawn(backend, tmp_path, "b", shared))
        handle.result(timeout=120)
        seen = dict(app.graph_state("k2")["seen"])
        assert seen["right"] == setup_root  # the re-run body found the super-step's base, exactly
        (merged,) = checkpoint_roots(app, "k2").values()
        assert seen["join"] == merged
        assert app.get_run("k2").status is RunStatus.COMPLETED

        class Source:
            def fetch(self, oids: list[str]) -> dict[str, bytes]:
                return app.store.workspace_objects("default", oids)

        out = tmp_path / "restored"
        restore(out, merged, Source(), TreeCache())
        files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
        assert files == ["left.txt", "right.txt", "sub/keep.txt", "sub/r.txt"]
    finally:
        for worker in workers:
            if worker.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.send_signal(signal.SIGKILL)
            worker.wait(timeout=10)
        app.close()
