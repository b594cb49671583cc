"""The warm pool's own guarantees (the escape tests run against pooled
sandboxes too, tests/sandbox/test_escape.py): one sandbox per command,
never reused; a pooled sandbox serves only the directory it was launched
for, never another workspace nor a directory that replaced its own at the
same path; and no pooled process outlives its worker (SIGKILLed)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cairn.sandbox.pool import Pool
from tests import processes
from tests.sandbox.test_escape import _survivors

pytestmark = pytest.mark.slow

LOOK = ["sh", "-c", "readlink /proc/self/ns/pid; echo $(ls -A /tmp); echo $(ls -A /workspace); "
                    "echo left > /tmp/left; echo more > /workspace/more.txt"]


@pytest.fixture
def pool() -> Iterator[Pool]:
    found = Pool(size=2, refill=False)
    yield found
    found.close()


def test_each_command_gets_a_sandbox_of_its_own(pool: Pool, ws: Path) -> None:
    (ws / "mine.txt").write_text("x")
    seen = []
    for _ in range(2):
        pool.prepare(ws)
        assert pool.ready() == 1, pool.last_failure
        result = pool.run(LOOK, ws)
        assert result.warm, pool.last_failure
        assert result.exit_code == 0, result
        assert pool.ready() == 0  # handed over: no longer the pool's
        seen.append(result.stdout.splitlines())
    (first_ns, first_tmp, first_ws), (second_ns, second_tmp, second_ws) = seen
    assert first_ns.startswith("pid:[")
    assert first_ns != second_ns  # a new PID namespace each time
    assert first_tmp == second_tmp == ""  # the second /tmp holds nothing of the first
    assert (first_ws, second_ws) == ("mine.txt", "mine.txt more.txt")  # the workspace is what lasts


def test_a_pooled_sandbox_serves_only_its_own_workspace(pool: Pool, tmp_path: Path, ws: Path) -> None:
    other = tmp_path / "other-run"
    other.mkdir()
    (ws / "a.txt").write_text("run a")
    (other / "b.txt").write_text("run b")
    pool.prepare(ws)
    result = pool.run(["ls", "/workspace"], other)
    assert not result.warm  # the ready sandbox is a's: b's command launched its own
    assert result.stdout.split() == ["b.txt"]
    assert pool.ready() == 1
    assert pool.run(["ls", "/workspace"], ws).stdout.split() == ["a.txt"]


def test_a_workspace_replaced_at_its_path_is_not_served_by_the_old_bind(pool: Pool, tmp_path: Path,
                                                                        ws: Path) -> None:
    """A run's directory removed or restored into a new directory at the
    same path: the sandbox bound to the old one is discarded, never handed
    the new one's command."""
    (ws / "old.txt").write_text("before")
    pool.prepare(ws)
    ws.rename(tmp_path / "moved")
    ws.mkdir()
    (ws / "new.txt").write_text("after")
    result = pool.run(["ls", "/workspace"], ws)
    assert result.stdout.split() == ["new.txt"], result
    assert not result.warm


def test_no_pooled_process_outlives_its_worker(tmp_path: Path, ws: Path) -> None:
    marker = f"cairn-pooled-{time.monotonic_ns()}"
    spaces = [tmp_path / f"{marker}-{i}" for i in range(2)]
    for path in spaces:
        path.mkdir()
    log = tmp_path / "holder.log"
    holder = processes.spawn("tests.sandbox.pool_holder", [str(p) for p in spaces], log=log)
    try:
        deadline = time.monotonic() + 60
        while "ready" not in log.read_text() and holder.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert log.read_text().startswith("ready 2 "), log.read_text()
        held = _survivors(marker)
        assert len(held) >= 4, held  # bwrap and the stub of each, at least
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        deadline = time.monotonic() + 5
        while _survivors(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _survivors(marker) == []
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        for pid in _survivors(marker):  # only after a failure: nothing of this test stays behind
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGKILL)


def test_the_pool_refills_the_workspace_it_served(ws: Path) -> None:
    """A run's first command is cold; once it is done the pool launches the
    workspace's next sandbox by itself, so the next command is warm."""
    pool = Pool(size=1)
    try:
        assert not pool.run(["true"], ws).warm
        deadline = time.monotonic() + 30
        while pool.ready() == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert pool.ready() == 1, pool.last_failure
        assert pool.run(["true"], ws).warm
    finally:
        pool.close()
