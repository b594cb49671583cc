"""The README's approvals example runs as written: the code block is taken
from the README itself, so the two cannot drift."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def example() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### Approvals and protected tools"):]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found is not None, "no python block under 'Approvals and protected tools'"
    return found.group(1)


@pytest.mark.slow
def test_the_readme_approvals_example_runs_as_written(tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(example(), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("CAIRN_DB", "CAIRN_FAULTS")}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    assert line.startswith("paid 12500 {")
    assert line.endswith(": 12500}")
