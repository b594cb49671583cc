"""The checkpointer benchmark (``bench/langgraph_saver.py``) runs in-process at
a small size on SQLite, both savers, and its output is complete: every figure
measured, every target judged. The figures themselves are not judged here
(tests assert behaviour, never speed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench import langgraph_saver


def test_the_json_output_holds_every_figure_of_both_savers(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CAIRN_BENCH_TMPDIR", str(tmp_path))
    monkeypatch.setattr(langgraph_saver, "environment", lambda: {"environment": "not described"})
    assert langgraph_saver.main(["--steps", "12", "--samples", "3", "--only", "sqlite,cairn-sqlite",
                                 "--floor-runs", "1", "--json"]) == 0
    (size,) = json.loads(capsys.readouterr().out)["sizes"]
    for system in ("sqlite", "cairn-sqlite"):
        missing = [k for k, v in size[system].items() if v is None]
        assert missing == [], (system, missing)
        assert size[system]["checkpoints"] == 14
    assert {t["target"] for t in size["targets"]} == {
        "sqlite / cairn-sqlite per super-step >= 2", "cairn-sqlite on disk / logical <= 1.3",
        "cairn-sqlite get_state p50 <= 1 ms", "cairn-sqlite history page <= 10 ms"}
    assert all(t["met"] is not None for t in size["targets"])
    # the graph's floors, measured in the same run: no checkpointer, a no-op saver, InMemorySaver
    assert set(size["floors"]) == set(langgraph_saver.FLOORS)
    assert all(f["step_us"] > 0 and f["step_cpu_us"] >= 0 for f in size["floors"].values())
    floors = {k: (f["step_us"], f["step_cpu_us"]) for k, f in size["floors"].items()}
    measured = [langgraph_saver.Figures(**{k: v for k, v in size[s].items() if k != "disk_ratio"})
                for s in ("sqlite", "cairn-sqlite")]
    lines = langgraph_saver.floor_lines(floors, measured)
    assert any(line.startswith("saver's own work, cairn-sqlite") for line in lines)
    assert any(line.startswith("context sqlite / cairn-sqlite >= 2") for line in lines)
    with pytest.raises(SystemExit):
        langgraph_saver.main(["--only", "nope"])
