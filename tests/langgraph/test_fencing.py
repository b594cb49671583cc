"""Two savers driving one LangGraph thread: the one that took the thread last
writes it, the one that lost it is refused (``ThreadTaken``) with nothing of
its write applied, so the chain of checkpoints never forks. LangGraph's own
savers let both writers succeed."""

from __future__ import annotations

import signal
import subprocess
from collections import Counter
from typing import Any

import pytest

import cairn
from cairn.errors import ThreadTaken
from tests import processes
from tests.langgraph.graphs import counting_loop


def _config(thread: str) -> Any:
    return {"configurable": {"thread_id": thread}, "recursion_limit": 200}


def _parents(app: cairn.App, thread: str) -> Counter[str]:
    """How many checkpoints of ``thread`` name each parent (a fork: one named twice)."""
    from cairn.langgraph import CairnSaver

    saver = CairnSaver(app, tenant="acme")
    return Counter(t.parent_config["configurable"]["checkpoint_id"]
                   for t in saver.list(_config(thread)) if t.parent_config)


def test_the_saver_that_lost_the_thread_is_refused(app: cairn.App) -> None:
    from cairn.langgraph import CairnSaver

    first, second = CairnSaver(app, tenant="acme"), CairnSaver(app, tenant="acme")
    counting_loop(3, "a").compile(checkpointer=first).invoke({"log": []}, _config("t"))
    # another saver (another process) continues the thread: it takes it
    out = counting_loop(6, "b").compile(checkpointer=second).invoke({"log": ["x"]}, _config("t"))
    assert out["log"][:4] == ["a0", "a1", "a2", "x"]
    latest = second.get_tuple(_config("t"))
    with pytest.raises(ThreadTaken, match="'t' was taken by another saver"):
        counting_loop(9, "a").compile(checkpointer=first).invoke({"log": ["late"]}, _config("t"))
    assert second.get_tuple(_config("t")) == latest  # nothing of the stale write applied
    assert max(_parents(app, "t").values()) == 1
    # a copy of the stale saver (with_allowlist) is the same writer: refused too
    with pytest.raises(ThreadTaken):
        first.with_allowlist([("x", "Y")]).put_writes(latest.config, [("log", ["late"])], "task")
    # a thread the stale saver never wrote is its to take
    counting_loop(2, "a").compile(checkpointer=first).invoke({"log": []}, _config("other"))
    # deleting the thread frees it
    second.delete_thread("t")
    counting_loop(2, "a").compile(checkpointer=second).invoke({"log": []}, _config("t"))


@pytest.mark.slow
def test_a_frozen_process_that_lost_its_thread_cannot_fork_it(app: cairn.App, db_url: str) -> None:
    """A process drives a thread and is frozen (SIGSTOP) between two writes;
    this process takes the thread and runs it to its end; the frozen one,
    resumed (SIGCONT), is refused at its next write and exits naming the
    thread: no checkpoint has two children. (Under LangGraph's default
    ``async`` durability the refusal surfaces when its graph ends, so the
    driver's graph is short: 8 super-steps, frozen at the 4th.)"""
    from cairn.langgraph import CairnSaver

    child = processes.spawn("tests.langgraph.driver_main", [db_url, "t", "8"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        for line in child.stdout:
            if line.strip() == "ready 3":  # checkpoints of steps 0-2 written, step 3's node asleep
                break
        else:
            pytest.fail(f"the driver ended early: {child.communicate(timeout=10)[1]}")
        child.send_signal(signal.SIGSTOP)
        saver = CairnSaver(app, tenant="acme")
        out = counting_loop(8, "b").compile(checkpointer=saver).invoke(None, _config("t"))
        assert out["log"] == ["a0", "a1", "a2", "b3", "b4", "b5", "b6", "b7"]
        child.send_signal(signal.SIGCONT)
        _, err = child.communicate(timeout=60)
        assert child.returncode == 3, err
        assert "'t' was taken by another saver" in err
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert max(_parents(app, "t").values()) == 1
    final = CairnSaver(app, tenant="acme").get_tuple(_config("t"))
    assert final is not None
    assert final.checkpoint["channel_values"]["log"] == out["log"]

