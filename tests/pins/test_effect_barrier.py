"""Issue 10 item 12: the effect barrier, observed from outside the process.

A write tool may touch the outside world only once its intent is on stable
storage. SIGKILL tests cannot see a missing sync (the page cache survives a
process death), so this runs a real worker process under
``strace -f -y`` and reads the order of its system calls: on the thread that
calls the tool, the last write to the SQLite write-ahead log before the
tool's first syscall (``os.stat`` of a marker file) must be followed by an
``fsync``/``fdatasync`` of that log, before the tool runs.

Both durability modes provide it differently (``process``: an explicit
``fdatasync`` after the commit; ``power``: ``synchronous=FULL`` syncs every
commit), so both are pinned: dropping ``barrier=True`` on the intent, the
sync in ``SQLiteStore._sync_wal``, or ``FULL`` in the power mode each fails
a case here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.acceptance.harness import REPO_ROOT
from tests.pins.barrier_worker import build

#: the syncs, the WAL writes, and the stat calls (os.stat is newfstatat or statx) that mark the tool
SYSCALLS = "trace=fsync,fdatasync,pwrite64,newfstatat,statx"
LINE = re.compile(r"^(?P<tid>\d+)\s+(?:<\.\.\. )?(?P<call>\w+)(?:\(| resumed>)(?P<rest>.*)$")


def _strace_usable() -> str | None:
    if shutil.which("strace") is None:
        return "strace is not installed (apt-get install strace)"
    probe = subprocess.run(["strace", "-f", "-o", os.devnull, "true"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        return f"strace cannot trace here (ptrace refused?): {probe.stderr.decode(errors='replace').strip()}"
    return None


SKIP = _strace_usable()


def traced_run(tmp_path: Path, durability: str) -> list[tuple[str, str, str]]:
    """Start one run, execute it in a worker process under strace, and
    return its syscalls as (thread id, call, rest of line)."""
    db = f"sqlite:///{tmp_path / 'barrier.db'}"
    marker = str(tmp_path / "TOOL-CALLED-MARKER")
    app = build(db, durability, marker)
    handle = app.start("barrier", 7, run_id="paid")
    app.close()
    trace = tmp_path / "trace.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), str(REPO_ROOT)])}
    subprocess.run(
        ["strace", "-f", "-y", "-qq", "-o", str(trace), "-e", SYSCALLS,
         sys.executable, "-m", "tests.pins.barrier_worker", db, durability, marker],
        cwd=REPO_ROOT, env=env, check=True, timeout=120, capture_output=True,
    )
    app = build(db, durability, marker)
    try:
        assert app.handle(handle.run_id).result(timeout=5) == 7, "the worker did not finish the run"
    finally:
        app.close()
    calls = []
    for line in trace.read_text().splitlines():
        match = LINE.match(line)
        if match:
            calls.append((match["tid"], match["call"], match["rest"]))
    return calls


@pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
@pytest.mark.parametrize("durability", ["process", "power"])
@pytest.mark.slow
def test_the_intent_is_synced_before_the_tool_runs(tmp_path: Path, durability: str) -> None:
    calls = traced_run(tmp_path, durability)
    tool = next((i for i, (_, call, rest) in enumerate(calls)
                 if "stat" in call and "TOOL-CALLED-MARKER" in rest), None)
    assert tool is not None, "the trace never shows the tool's marker syscall"
    tid = calls[tool][0]
    mine = [(i, call, rest) for i, (t, call, rest) in enumerate(calls[:tool]) if t == tid]
    wal_writes = [i for i, call, rest in mine if call == "pwrite64" and "-wal>" in rest]
    assert wal_writes, "the tool's thread wrote nothing to the WAL before the tool ran (no intent?)"
    intent_commit = wal_writes[-1]
    synced = [i for i, call, rest in mine
              if i > intent_commit and call in ("fsync", "fdatasync") and "-wal>" in rest]
    window = "\n".join(f"{calls[i][0]} {calls[i][1]}{calls[i][2][:90]}"
                        for i in range(intent_commit, tool + 1))
    assert synced, f"no fsync/fdatasync of the WAL between the intent's commit and the tool call:\n{window}"
