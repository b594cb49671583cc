"""The demos' children run this copy of the package (``cairn.demo.children``).

A worker or bank started from a checkout must import the code the demo runs,
not another copy of ``cairn`` installed in the environment (an editable
install of another checkout, a wheel): so ``child_env`` puts this copy's
root on ``PYTHONPATH``, ahead of everything installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import cairn
from cairn.demo.children import child_env


@pytest.mark.slow
def test_a_child_finds_this_copy_of_the_package_before_any_installed_one(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("PYTHONPATH", raising=False)
    root = str(Path(cairn.__file__).resolve().parents[1])
    shown = subprocess.run([sys.executable, "-c", "import json, sys; print(json.dumps(sys.path))"],
                           env=child_env(), cwd=tmp_path, capture_output=True, text=True, check=True)
    path = json.loads(shown.stdout)
    installed = min(i for i, p in enumerate(path) if p.endswith("site-packages"))
    assert root in path[:installed], path


def test_a_child_is_not_handed_what_the_demo_drops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAIRN_FAULTS", "store.append.before_commit")
    assert "CAIRN_FAULTS" not in child_env(drop=("CAIRN_FAULTS",))
    assert child_env()["CAIRN_FAULTS"] == "store.append.before_commit"
