"""The saver of a LangGraph run is fenced by the run's lease epoch (both
backends): once a later lease has written the thread, a saver of an earlier
lease is refused, even one that never wrote it (a worker frozen before its
first write must not take the thread back), and nothing of its write lands."""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

import cairn
from cairn.errors import ThreadTaken
from cairn.langgraph import CairnSaver

CONFIG: Any = {"configurable": {"thread_id": "lg:r", "checkpoint_ns": ""}}


def put(saver: CairnSaver, marker: str) -> None:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"who": marker}
    checkpoint["channel_versions"] = {"who": saver.get_next_version(None, None)}
    saver.put(CONFIG, checkpoint, {"source": "loop", "step": 1}, dict(checkpoint["channel_versions"]))


def test_an_earlier_lease_never_takes_the_thread_back(app: cairn.App) -> None:
    frozen = CairnSaver(app, lease=1)  # claimed the run, then froze before writing anything
    taker = CairnSaver(app, lease=2)
    taker.hold("lg:r")
    put(taker, "taker")
    with pytest.raises(ThreadTaken, match=r"held by a later lease \(epoch 2, this writer's is 1\)"):
        put(frozen, "frozen")
    with pytest.raises(ThreadTaken):
        frozen.hold("lg:r")
    with pytest.raises(ThreadTaken):
        frozen.put_writes(CONFIG | {"configurable": {**CONFIG["configurable"], "checkpoint_id": "x"}},
                          [("who", "frozen")], "task")
    latest = taker.get_tuple(CONFIG)
    assert latest is not None
    assert latest.checkpoint["channel_values"] == {"who": "taker"}
    assert [t.checkpoint["channel_values"]["who"] for t in taker.list(CONFIG)] == ["taker"]


def test_a_later_lease_takes_over_and_fences_the_one_before(app: cairn.App) -> None:
    first, second = CairnSaver(app, lease=1), CairnSaver(app, lease=2)
    put(first, "first")
    put(second, "second")  # the next claim of the run: it takes the thread
    with pytest.raises(ThreadTaken):
        put(first, "first again")
    put(second, "second again")  # its own lease goes on writing
    assert [t.checkpoint["channel_values"]["who"] for t in second.list(CONFIG)] == ["second again", "second",
                                                                                   "first"]
