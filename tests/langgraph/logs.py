"""Checkpoints of a thread with one list channel, ``log``, put and read
directly through a saver (no graph): how the tests of a saver's memory,
its first writes and its dictionaries build the rows they attack."""

from __future__ import annotations

from typing import Any

import cairn
from cairn.langgraph import CairnSaver

#: messages long enough to be value rows of their own (not literals in the refs)
FIRST = "the first message, long enough to be a value row of its own; " * 4
SECOND = "the second message, long enough to be a value row of its own; " * 4
THIRD = "the third message, long enough to be a value row of its own; " * 4
FOURTH = "the fourth message, long enough to be a value row of its own; " * 4


def put_log(saver: CairnSaver, config: Any, step: int, log: list[str], thread: str = "t",
            run_id: str = "r1") -> Any:
    """Checkpoint ``step`` of ``thread`` after ``config`` (``None``: the
    thread's first), channel ``log`` = ``log``; its config."""
    from langgraph.checkpoint.base import empty_checkpoint

    checkpoint = empty_checkpoint()
    checkpoint["id"] = f"1f0e0000-0000-6000-8000-{step:012d}"
    version = saver.get_next_version(None if step == 0 else f"{step:010d}", None)
    checkpoint["channel_values"] = {"log": list(log)}
    checkpoint["channel_versions"] = {"log": version}
    return saver.put(config or {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}, checkpoint,
                     {"source": "loop", "step": step, "run_id": run_id}, {"log": version})


def log_of(app: cairn.App, config: Any, tenant: str = "acme") -> list[str]:
    """Channel ``log`` of ``config``'s checkpoint, as a new saver of ``tenant`` reads it."""
    found = CairnSaver(app, tenant=tenant).get_tuple(config)
    assert found is not None
    return list(found.checkpoint["channel_values"]["log"])
