"""The README's "Writing an agent" example runs as written (issue 9 item 17):
the code block is taken from the README itself, so the two cannot drift."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def example() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Writing an agent"):]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found is not None, "no python block under 'Writing an agent'"
    return found.group(1)


@pytest.mark.slow
def test_the_readme_example_runs_as_written(tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(example(), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "CAIRN_DB"}  # the example's own default database
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["T-42: closed", "T-43: closed"]
    assert (tmp_path / ".cairn" / "cairn.db").exists()  # the default: ./.cairn/cairn.db


def quick_start() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Quick start"):text.index("## Writing an agent")]
    found = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert found is not None, "no sh block under 'Quick start'"
    return found.group(1).splitlines()


def test_ci_runs_the_readme_test_command() -> None:
    """The quick start is two commands, install-and-demo then the tests, and
    ``.ci/run`` runs that same test command, so what CI passes is what a
    reader runs."""
    install, tests = quick_start()
    assert install.startswith("python3 -m venv .venv && ")
    assert tests.startswith(".venv/bin/python -m pytest")
    command = tests.removeprefix(".venv/bin/")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert command in ci, f"{command!r} is not a line of .ci/run"
