"""The README's LangGraph example runs as written (in this process, on a SQLite file of the test's own)."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_langgraph_example_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    text = README.read_text()
    section = text[text.index("### LangGraph on Cairn workers\n"):text.index("\n## Workers\n")]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found is not None, "no python block under 'LangGraph on Cairn workers'"
    script = tmp_path / "langgraph_example.py"
    script.write_text(found.group(1))
    monkeypatch.setenv("CAIRN_DB", f"sqlite:///{tmp_path}/cairn.db")
    monkeypatch.chdir(tmp_path)
    namespace = runpy.run_path(str(script), run_name="__main__")
    namespace["app"].close()
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["{'order': 'A-17', 'question': 'refund how much?'}",
                       "{'log': ['triaged A-17', 'refunded 25 on A-17'], 'order': 'A-17'}"]
