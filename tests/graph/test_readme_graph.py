"""The README's graph example runs as written (in this process, on a
SQLite file of the test's own)."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_graph_example_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    text = README.read_text()
    section = text[text.index("### Graph workflows\n"):text.index("### Graph workflows: time travel")]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found is not None, "no python block under 'Graph workflows'"
    script = tmp_path / "graph_example.py"
    script.write_text(found.group(1))
    monkeypatch.setenv("CAIRN_DB", f"sqlite:///{tmp_path}/cairn.db")
    monkeypatch.chdir(tmp_path)
    namespace = runpy.run_path(str(script), run_name="graph_example")
    namespace["app"].close()
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "[6, 5, 4]"
    assert printed[1] == "{'question': 'durable agents', 'notes': [], 'sources': {}, 'rounds': 1}"
