"""SIGTERM drains a worker whatever its main thread was doing when it came.

Python runs a signal handler in the main thread between two of its bytecodes,
so a handler that takes a lock the main thread may hold waits for itself
forever. An idle worker's main thread is nearly always inside its wake-up
event's ``wait`` or ``clear``, which hold that event's lock, and the handler
used to set that very event: now and then (once in CI) a worker logged that it
was draining and never drained. The handler now takes no lock
(``cairn.worker.stopsignal``); these tests land the signal exactly inside that
lock, and check the second signal's way out.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests import processes

ROOT = Path(__file__).resolve().parents[2]


def spawn(mode: str, tmp_path: Path) -> subprocess.Popen[str]:
    return processes.spawn("tests.worker.signalled_worker", [mode, str(tmp_path / "cairn.db")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[int | None, str, str]:
    """The exit code (``None``: still running after ``timeout``, then killed) and the output."""
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return None, out, err


@pytest.mark.slow
def test_a_signal_landing_inside_the_wakeup_lock_still_drains_the_worker(tmp_path: Path) -> None:
    code, out, err = finish(spawn("held", tmp_path), timeout=30)
    assert code is not None, (
        f"the worker was still running 30 s after SIGTERM came inside its wake-up lock (the handler "
        f"waits for a lock its own thread holds); stdout:\n{out}\nstderr:\n{err}")
    assert code == 0, f"exit {code}; stderr:\n{err}"
    assert "received SIGTERM: draining" in err, err
    assert "drained restored=True" in out, f"the worker did not drain, or kept its handler:\n{out}"


@pytest.mark.slow
def test_a_second_signal_while_draining_leaves_at_once(tmp_path: Path) -> None:
    proc = spawn("busy", tmp_path)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "running"
        assert proc.stdout.readline().strip() == "napping"  # the minute-long step is under way
        proc.send_signal(signal.SIGTERM)  # drain: waits for the step
        time.sleep(1.0)
        assert proc.poll() is None, "the first SIGTERM did not wait for the step in progress"
        proc.send_signal(signal.SIGTERM)
        code, out, err = finish(proc, timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert code == 128 + signal.SIGTERM, f"exit {code} after a second SIGTERM; stderr:\n{err}"
    assert "draining" in err, err
    assert "drained" not in out
