"""The write path's cost (issue 24, 2026-12-07: CairnSaver >= 2x faster a
super-step than LangGraph's savers): a put does not encode, hash, compress or
send again the value its super-step's ``put_writes`` stored (the message a
node wrote is the item the next checkpoint appends), and on PostgreSQL a put
is 1 round trip and a put_writes 1: the fence checked in the server
(``lg_hold``), every statement and the COMMIT in one message."""

from __future__ import annotations

from collections import Counter
from typing import Any

import cairn
from tests.langgraph.graphs import appending_loop

#: the items the graph appends, made once: the same objects in every run
ITEMS = [f"item-{n}-" + "x" * 200 for n in range(12)]


def _loop(steps: int) -> Any:
    """One node looping ``steps`` super-steps, the ``n``-th appending ``ITEMS[n]``."""
    return appending_loop(steps, ITEMS.__getitem__)


def _config(thread: str, checkpoint_id: str | None = None) -> Any:
    conf = {"thread_id": thread, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf, "recursion_limit": 100}


def _checkpoint(n: int, items: list[str]) -> Any:
    from langgraph.checkpoint.base import empty_checkpoint

    c = empty_checkpoint()
    c["id"] = f"1ef00000-0000-6000-8000-{n:012d}"
    c["channel_values"] = {"log": list(items)}
    c["channel_versions"] = {"log": f"{n:010d}.aa"}
    return c


def test_a_put_neither_encodes_nor_sends_again_what_its_writes_stored(app: cairn.App) -> None:
    """As LangGraph's loop calls a saver: a node's write of an item
    (put_writes on checkpoint n), then checkpoint n + 1 with the list grown
    by it. Each item is serialized once (before, the put encoded, hashed and
    compressed it again), and no put sends a value row its saver committed
    already (on PostgreSQL the values statement is not sent at all)."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from cairn.langgraph import CairnSaver

    dumped: Counter[str] = Counter()

    class Counting(JsonPlusSerializer):
        def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
            if isinstance(obj, str) and obj.startswith("item-"):
                dumped[obj] += 1
            return super().dumps_typed(obj)

    saver = CairnSaver(app, tenant="acme", serde=Counting(allowed_msgpack_modules=None))
    sent: list[int] = []
    rows = saver._rows
    put = rows.lg_put

    def counted(*args: Any, **kwargs: Any) -> int:
        sent.append(len(args[5]))  # the value rows this put sends
        return put(*args, **kwargs)

    rows.lg_put = counted  # type: ignore[method-assign]
    metadata: Any = {"source": "loop", "step": 0, "parents": {}}
    config = saver.put(_config("t"), _checkpoint(0, []), metadata, {"log": "0000000000.aa"})
    for n in range(1, 11):
        saver.put_writes(config, [("log", [ITEMS[n - 1]])], f"task-{n}")
        c = _checkpoint(n, ITEMS[:n])
        config = saver.put(config, c, metadata, {"log": c["channel_versions"]["log"]})
    assert dumped == Counter(ITEMS[:10])  # each once
    assert sent == [0] * 11, sent
    found = CairnSaver(app, tenant="acme").get_tuple(_config("t"))  # and it all reads back
    assert found is not None
    assert found.checkpoint["channel_values"]["log"] == ITEMS[:10]


def test_a_value_deleted_through_the_saver_is_sent_again(app: cairn.App) -> None:
    """A saver forgets what it committed when it deletes (``_forget``): a
    put after ``delete_thread`` that names the same objects stores their rows
    again, and the checkpoint reads."""
    from cairn.langgraph import CairnSaver

    saver = CairnSaver(app, tenant="acme")
    metadata: Any = {"source": "loop", "step": 0, "parents": {}}
    config = saver.put(_config("t"), _checkpoint(1, []), metadata, {"log": "0000000001.aa"})
    saver.put_writes(config, [("log", ITEMS[:3])], "task")
    saver.put(config, _checkpoint(2, ITEMS[:3]), metadata, {"log": "0000000002.aa"})
    saver.delete_thread("t")
    assert saver.get_tuple(_config("t")) is None
    saver.put(_config("t"), _checkpoint(3, ITEMS[:3]), metadata, {"log": "0000000003.aa"})
    found = CairnSaver(app, tenant="acme").get_tuple(_config("t"))
    assert found is not None
    assert found.checkpoint["channel_values"]["log"] == ITEMS[:3]


def test_a_value_committed_to_one_thread_is_still_sent_to_another(app: cairn.App) -> None:
    """What a saver remembers committing is per thread (values are stored
    per thread): the same message put to a second thread is stored there
    too, and that thread reads whole from a new saver."""
    from cairn.langgraph import CairnSaver

    saver = CairnSaver(app, tenant="acme")
    metadata: Any = {"source": "loop", "step": 0, "parents": {}}
    config = saver.put(_config("a"), _checkpoint(1, []), metadata, {"log": "0000000001.aa"})
    saver.put_writes(config, [("log", ITEMS[:3])], "task")
    saver.put(config, _checkpoint(2, ITEMS[:3]), metadata, {"log": "0000000002.aa"})
    saver.put(_config("b"), _checkpoint(3, ITEMS[:3]), metadata, {"log": "0000000003.aa"})
    found = CairnSaver(app, tenant="acme").get_tuple(_config("b"))
    assert found is not None
    assert found.checkpoint["channel_values"]["log"] == ITEMS[:3]


def test_a_super_step_is_two_round_trips_on_postgresql(pg_app: cairn.App, statements: Counter[str]) -> None:
    """On PostgreSQL a put is 1 round trip and a put_writes 1: one message
    each, from the fence (lg_hold) to the COMMIT, the put folding its
    parent's writes stored before it as the rows it expects (issue 24,
    2026-12-07). Before, 2 and 2 (the fence was checked by the client
    between two messages); before that, 9 and 7."""
    from cairn.langgraph import CairnSaver

    saver = CairnSaver(pg_app, tenant="acme")
    graph = _loop(9).compile(checkpointer=saver)
    graph.invoke({"log": []}, _config("warm"))  # the thread is taken, statements prepared
    statements.clear()
    graph.invoke({"log": []}, _config("t"))
    # 11 puts (the input's checkpoint, 10 super-steps) and 10 put_writes (the input's, 9 nodes')
    assert statements["SELECT held,"] == 21, statements
    # and once each: the first read of the thread, and its collection count, read by the first
    # write (CairnSaver._expecting); a new pooled connection's settings aside
    assert statements["SELECT collected"] == 1, statements
    others = sum(n for s, n in statements.items() if s != "SELECT set_config('search_path',")
    assert others == 21 + 1 + 1, statements
