"""``cairn demo approval`` runs offline in seconds and proves its claim from
the bank's own ledger: exactly one refund, of the edited amount."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_approval_demo_pays_the_edited_amount_once(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    done = subprocess.run([sys.executable, "-m", "cairn", "demo", "approval", "--db", str(db)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    out = " ".join(done.stdout.split())
    assert "verdict: the bank holds exactly one refund to acct_ana_lima, of the edited 124.75" in out
    assert "it holds no worker, no slot" in out
    assert "SIGKILL approval-worker-1" in out
    assert "edited by cli:" in out
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_the_approval_demo_needs_a_file_database(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "cairn", "demo", "approval", "--db", "memory://"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "needs a SQLite database file" in done.stderr
