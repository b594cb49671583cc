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


def lint_imports(*args: str, path: Path = ROOT / "src") -> subprocess.CompletedProcess[str]:
    # The checked-out tree's src/, not whatever ``cairn`` an editable install points at.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(path), os.environ.get("PYTHONPATH", "")])}
    script = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    return subprocess.run([sys.executable, "-c", script, "--no-cache", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_layers_point_down_only() -> None:
    done = lint_imports()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Layers point down only KEPT" in done.stdout
    assert "The CLI never reaches a store directly KEPT" in done.stdout
    assert "Each package's modules form a DAG KEPT" in done.stdout


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


@pytest.mark.slow  # runs lint-imports in a process of its own
def test_a_cycle_through_type_only_imports_breaks_the_dag(tmp_path: Path) -> None:
    """The DAG contract counts ``if TYPE_CHECKING:`` imports (the engine's
    cycle ran through them): given the repository's settings, a package
    whose two modules import each other, one of them only for a type, is a
    broken contract."""
    text = (ROOT / "pyproject.toml").read_text()
    start = text.index("[tool.importlinter]")
    settings = text[start:text.index("\n[[tool.importlinter.contracts]]", start)]
    package = tmp_path / "cyclic" / "inner"
    package.mkdir(parents=True)
    (tmp_path / "cyclic" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from cyclic.inner.high import High\n")
    (package / "high.py").write_text("import cyclic.inner.low\n\n\nclass High:\n    pass\n")
    config = tmp_path / "importlinter.toml"
    config.write_text(settings.replace('root_package = "cairn"', 'root_package = "cyclic"') +
                      '\n[[tool.importlinter.contracts]]\nname = "DAG"\ntype = "acyclic_siblings"\n'
                      'ancestors = ["cyclic.inner"]\n')
    done = lint_imports("--config", str(config), path=tmp_path)
    assert done.returncode != 0, done.stdout
    assert "DAG BROKEN" in done.stdout
    assert ".low -> .high" in done.stdout or ".high -> .low" in done.stdout
