"""The checkpointer benchmark (``bench/langgraph_saver.py``) runs in-process at
a small size on SQLite, both savers, and its output is complete: every figure
measured, every target judged. The figures themselves are not judged here
(tests assert behaviour, never speed). The paired rounds (``--rounds``): their
sequence (warm-up, fresh database each run, alternated order), their section
in the text and the JSON output, and the target's verdict on hand-made ratios."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from bench import langgraph_saver


def test_the_json_output_holds_every_figure_of_both_savers(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CAIRN_BENCH_TMPDIR", str(tmp_path))
    monkeypatch.setattr(langgraph_saver, "environment", lambda: {"environment": "not described"})
    assert langgraph_saver.main(["--steps", "12", "--samples", "3", "--only", "sqlite,cairn-sqlite",
                                 "--floor-runs", "1", "--rounds", "0", "--json"]) == 0
    (size,) = json.loads(capsys.readouterr().out)["sizes"]
    assert "paired" not in size  # --rounds 0: the output as before the rounds
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


def test_the_paired_target_is_judged_on_the_interval_of_the_median() -> None:
    judge = langgraph_saver.judge
    # 9 rounds: the 95 % interval of the median is the 2nd to the 8th of the sorted ratios
    assert judge([3.0, 2.6, 2.5, 2.4, 2.3, 2.2, 2.1, 2.0, 1.5]) == (2.3, 2.0, 2.6, "shown")
    assert judge([1.0, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.9, 2.5]) == (1.5, 1.2, 1.9, "missed")
    # the median over 2 is not enough: the interval's lower end must be
    assert judge([1.0, 1.9, 2.2, 2.3, 2.4, 2.5, 2.6, 2.7, 3.0])[3] == "not shown"
    # nor is a median under 2 a miss while the interval reaches 2
    assert judge([1.0, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 2.0, 2.5])[3] == "not shown"
    # under 6 rounds the interval is unbounded: never shown nor missed
    assert judge([5.0, 5.0, 5.0, 5.0, 5.0])[3] == "not shown"
    assert judge([0.5, 0.5])[3] == "not shown"


def test_each_round_runs_both_savers_on_fresh_databases_after_a_warm_up_in_alternate_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    closed: list[str] = []
    ran: list[tuple[str, int]] = []

    @contextmanager
    def database(system: str, label: str) -> Iterator[Any]:
        opened.append(label)

        class Db:
            def saver(self) -> tuple[Any, Any]:
                return system, lambda: closed.append(label)
        yield Db()

    def run(saver: Any, steps: int) -> tuple[float, float]:
        ran.append((saver, steps))
        return (0.004 if saver == "sqlite" else 0.002) * steps / 1000, 0.001 * steps / 1000

    monkeypatch.setattr(langgraph_saver, "database", database)
    monkeypatch.setattr(langgraph_saver, "settle", lambda: None)  # os.sync: slow on a busy machine
    monkeypatch.setattr(langgraph_saver, "run", run)
    p = langgraph_saver.paired_rounds("sqlite", "cairn-sqlite", 50, 3)
    # one full-length warm-up of each, then the rounds, baseline first in odd rounds
    assert ran == [(s, 50) for s in ("sqlite", "cairn-sqlite", "sqlite", "cairn-sqlite",
                                     "cairn-sqlite", "sqlite", "sqlite", "cairn-sqlite")]
    assert len(set(opened)) == len(opened) == 8  # a fresh database each run
    assert closed == opened
    assert [r["first"] for r in p["rounds"]] == ["sqlite", "cairn-sqlite", "sqlite"]
    assert [round(r["ratio"], 9) for r in p["rounds"]] == [2.0] * 3
    assert [round(r["baseline_us"]) for r in p["rounds"]] == [4] * 3
    assert p["target"] == "sqlite / cairn-sqlite per super-step >= 2 (paired, 3 rounds)"
    assert (p["ratio_low"], p["ratio_high"], p["verdict"]) == (None, None, "not shown")
    json.dumps(p, allow_nan=False)  # an unbounded interval is null in JSON
    assert langgraph_saver.paired_lines(p)[-1] == (
        "target sqlite / cairn-sqlite per super-step >= 2 (paired, 3 rounds): 2.00 [-inf, inf] not shown")
    only = ["sqlite", "cairn-sqlite", "cairn-postgres"]
    assert langgraph_saver.pairs_of(only) == [("sqlite", "cairn-sqlite")]


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_the_paired_section_follows_the_single_runs(
        as_json: bool, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    monkeypatch.setenv("CAIRN_BENCH_TMPDIR", str(tmp_path))
    monkeypatch.setattr(langgraph_saver, "environment", lambda: {"environment": "not described"})
    monkeypatch.setattr(langgraph_saver, "settle", lambda: None)
    assert langgraph_saver.main(["--steps", "10", "--samples", "2", "--rounds", "2", "--floor-runs", "0",
                                 "--only", "sqlite,cairn-sqlite"] + ["--json"] * as_json) == 0
    out = capsys.readouterr().out
    if as_json:
        (size,) = json.loads(out)["sizes"]
        (p,) = size["paired"]
        assert (p["baseline"], p["system"], p["steps"], len(p["rounds"])) == ("sqlite", "cairn-sqlite", 10, 2)
        assert all(r["baseline_us"] > 0 and r["system_us"] > 0 and r["ratio"] > 0 for r in p["rounds"])
        assert p["verdict"] == "not shown"
        assert p["ratio_median"] > 0
        assert len(size["targets"]) == 4  # the single runs' targets, unchanged
        return
    lines = out.splitlines()
    target = "target sqlite / cairn-sqlite per super-step >= 2"
    single = next(i for i, x in enumerate(lines) if x.startswith(f"{target}:"))  # the single runs' target
    section = next(i for i, x in enumerate(lines) if x.startswith("-- paired rounds, 10 super-steps"))
    assert single < section
    assert [x.split(":")[0] for x in lines[section + 1:section + 3]] == [
        "round 1 (sqlite first)", "round 2 (cairn-sqlite first)"]
    assert lines[-1].startswith(f"{target} (paired, 2 rounds): ")
    assert lines[-1].endswith(" [-inf, inf] not shown")
