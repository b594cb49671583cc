"""Run ``tests.effects.ledger_app`` in a child that SIGKILLs itself at a fault point."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    env = {
        "CAIRN_TEST_DB": f"sqlite:///{tmp_path}/effects.db",
        "CAIRN_TEST_LEDGER": str(tmp_path / "ledger.jsonl"),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    sys.modules.pop("tests.effects.ledger_app", None)  # rebuild the app on this test's database
    yield env
    module = sys.modules.pop("tests.effects.ledger_app", None)
    if module is not None:
        module.app.close()


@pytest.fixture
def crash_at(world: dict[str, str]) -> Callable[..., None]:
    """Run the pay workflow in a child process armed to die at ``point``."""

    def run(point: str, run_id: str, tool: str, amount: int) -> None:
        env = {**os.environ, **world, "CAIRN_FAULTS": point}
        child = subprocess.run(
            [sys.executable, "-m", "tests.effects.ledger_app", run_id, tool, str(amount)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        )
        assert child.returncode == -signal.SIGKILL, f"child did not die at {point}: {child.stderr[-2000:]}"

    return run
