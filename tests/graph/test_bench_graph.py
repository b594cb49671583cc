"""The graph benchmark (``bench/graph.py``) runs at a small size on both
sides (in this process; and once as it is run, each system in an
interpreter of its own) and its output is complete: every figure of every system is
measured and every ratio computed. The figures themselves are not judged
here (tests assert behaviour, never speed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench import graph

STEPS = 25
#: figures only Cairn has (LangGraph has no diff, nor a code-free JSON reader)
CAIRN_ONLY = {"diff_p50_ms", "diff_p99_ms", "read_diff_p50_ms", "read_diff_p99_ms",
              "json_p50_ms", "json_p99_ms"}


def run(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        *args: str) -> str:
    monkeypatch.setenv("CAIRN_BENCH_TMPDIR", str(tmp_path))
    # the machine's description (``platform.processor`` runs ``uname -p``): not what is tested here
    monkeypatch.setattr(graph, "environment", lambda: {"environment": "not described"})
    assert graph.main(["--steps", str(STEPS), "--samples", "5", *args]) == 0
    return capsys.readouterr().out


def test_the_json_output_holds_every_figure_and_ratio_of_both_sides(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    doc = json.loads(run(capsys, monkeypatch, tmp_path, "--only", "langgraph,cairn", "--json",
                         "--in-process"))
    assert doc["skipped"] == {}
    (size,) = doc["sizes"]
    assert size["steps"] == STEPS
    assert size["logical_bytes"] == STEPS * graph.MESSAGE_BYTES
    for system in ("langgraph", "cairn"):
        figures = size[system]
        missing = [name for name, value in figures.items()
                   if value is None and not (system != "cairn" and name in CAIRN_ONLY)]
        assert missing == [], (system, missing, figures["notes"])
        assert figures["checkpoints"] >= STEPS
    judged = {t["target"]: t for t in size["targets"]}
    assert len(judged) == len(graph.targets(None, None))
    for target in judged.values():  # every target has its measured value and a verdict
        assert target["measured"] is not None, target
        assert target["met"] in (True, False), target


def test_the_table_shows_each_figure_with_its_ratio_and_every_target(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    out = run(capsys, monkeypatch, tmp_path, "--only", "langgraph,cairn", "--in-process")
    lines = out.splitlines()
    assert any("cairn/langgraph" in line for line in lines)
    for label, _attr, _style in graph.ROWS:
        (row,) = [line for line in lines if line.startswith(label)]
        assert "—" not in row or label.startswith(("diff", "read 2", "state as JSON")), row
        if not label.startswith(("diff", "read 2", "state as JSON")):
            assert row.rstrip().endswith("x"), row  # the cairn/langgraph ratio is computed
    verdicts = [line for line in lines if line.startswith("target ")]
    assert len(verdicts) == len(graph.targets(None, None))
    assert all(line.endswith((" met", " MISSED")) for line in verdicts), verdicts


@pytest.mark.slow
def test_as_run_each_system_is_measured_in_an_interpreter_of_its_own(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without ``--in-process`` each system's figures come from a child
    interpreter (``--child``): they arrive whole, and the parent never ran
    the workload (it imported no LangGraph)."""
    import sys

    monkeypatch.delitem(sys.modules, "langgraph.graph", raising=False)
    doc = json.loads(run(capsys, monkeypatch, tmp_path, "--only", "langgraph,cairn", "--json"))
    (size,) = doc["sizes"]
    for system in ("langgraph", "cairn"):
        assert size[system]["checkpoints"] >= STEPS
        assert size[system]["step_cpu_us"] > 0
    assert "langgraph.graph" not in sys.modules
