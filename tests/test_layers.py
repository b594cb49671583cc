"""Layers point down only: the import contract in pyproject.toml holds.

``lint-imports`` (import-linter, a dev dependency) reads the layers from
``[tool.importlinter]`` and fails on any import from a lower layer into a
higher one, directly or through a chain. Running it here makes
``python -m pytest`` (and so CI) enforce the layering of docs/design.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def lint_imports(*args: str) -> subprocess.CompletedProcess[str]:
    # The checked-out tree's src/, not whatever ``cairn`` an editable install points at.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    script = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    return subprocess.run([sys.executable, "-c", script, "--no-cache", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_layers_point_down_only() -> None:
    done = lint_imports()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Layers point down only KEPT" in done.stdout
    assert "The CLI never reaches a store directly KEPT" in done.stdout


@pytest.mark.slow
def test_the_contract_catches_an_upward_import(tmp_path: Path) -> None:
    """The contract is not vacuous: the same layers, given a config that puts
    the store above the CLI, must be broken (the CLI imports the store)."""
    text = (ROOT / "pyproject.toml").read_text()
    start = text.index("[tool.importlinter]")
    end = text.index("\n[[tool.importlinter.contracts]]", text.index("layers = [", start))
    contract = text[start:end].replace('"store",', '"STORE",').replace('"cli",', '"store",\n    "cli",')
    contract = contract.replace('    "STORE",\n', "")
    config = tmp_path / "importlinter.toml"
    config.write_text(contract)
    done = lint_imports("--config", str(config))
    assert done.returncode != 0, done.stdout
    assert "cairn.cli" in done.stdout
    assert "cairn.store" in done.stdout
