"""Pending writes are durable before the checkpoint that follows them
(LangGraph issue 8039), so a process SIGKILLed while a checkpoint is being
written never runs a finished node again when the thread is resumed.

LangGraph's loop submits a finished node's ``put_writes`` and the next
checkpoint's ``put`` to its background executor with no order between them.
The child (``crash_main``) makes the writes' commit slow and is killed by the
fault point inside the put's transaction (LangGraph's ``durability="sync"``,
where the loop waits for each checkpoint before the next super-step): if the put did not wait for the
writes, both die with the process and the resumed thread runs the node again
(its ledger line appears twice)."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import cairn
from tests import processes
from tests.langgraph.graphs import ledger_loop

STEPS = 8
#: the put killed: the input checkpoint is put 1, step 0's checkpoint put 2, ...
KILLED_PUT = 5


def _config(thread: str) -> Any:
    return {"configurable": {"thread_id": thread}, "recursion_limit": 10 * STEPS}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_node_finished_before_the_kill_never_runs_again(app: cairn.App, db_url: str, tmp_path: Path,
                                                           mode: str) -> None:
    from cairn.langgraph import CairnSaver

    ledger = tmp_path / "ledger"
    child = processes.spawn("tests.langgraph.crash_main", [db_url, "t", str(STEPS), str(ledger), mode],
                            env={"CAIRN_FAULTS": f"langgraph.put.before_commit@{KILLED_PUT}"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = child.communicate(timeout=120)
    assert child.returncode == -9, f"the child was not killed at its put: {out}{err}"
    ran_before = ledger.read_text().split()
    assert ran_before, "no node ran before the kill"
    saver = CairnSaver(app, tenant="acme")
    final = ledger_loop(STEPS, str(ledger)).compile(checkpointer=saver).invoke(None, _config("t"))
    assert final["log"] == [f"s{n}" for n in range(STEPS)]
    runs = Counter(ledger.read_text().split())
    again = sorted(n for n, times in runs.items() if times > 1)
    assert again == [], f"finished before the kill, ran again: {again} (before the kill: {ran_before})"
    assert sorted(runs, key=int) == [str(n) for n in range(STEPS)]
