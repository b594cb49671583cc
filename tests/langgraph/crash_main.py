"""A process driving a LangGraph thread through ``CairnSaver`` until the
crash test's fault point SIGKILLs it inside a checkpoint's ``put``:
``python -m tests.langgraph.crash_main DB_URL THREAD STEPS LEDGER MODE``
(``MODE``: ``sync`` for ``invoke``, ``async`` for ``ainvoke``), with
LangGraph's ``durability="sync"``: a super-step starts once the checkpoint
before it is written (with ``"async"`` a node may run ahead of its
predecessor's checkpoint, and no saver can keep it from running again).

Each node's effect is a line ``<n>`` appended to ``LEDGER`` and fsynced
before the node returns, so the file counts how often each node ran. The
store's pending-write transaction is slowed down (a database whose commit of
the writes takes longer than the loop takes to reach the next checkpoint's
``put``: a loaded server, a slow disk), which is the interleaving LangGraph's
loop allows (issue 8039) made certain rather than left to the scheduler.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

from cairn.store import open_store
from tests.langgraph.graphs import ledger_loop

#: how long the store takes to commit a super-step's pending writes here
WRITES_DELAY = 0.4


def main() -> int:
    url, thread, steps, ledger, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
    from cairn.langgraph import CairnSaver

    store: Any = open_store(url)
    commit_writes = store.lg_put_writes

    def slow_writes(*args: Any, **kwargs: Any) -> Any:
        time.sleep(WRITES_DELAY)
        return commit_writes(*args, **kwargs)

    store.lg_put_writes = slow_writes
    graph = ledger_loop(steps, ledger).compile(checkpointer=CairnSaver(store, tenant="acme"))
    config: Any = {"configurable": {"thread_id": thread}, "recursion_limit": 10 * steps}
    if mode == "async":
        asyncio.run(graph.ainvoke({"log": []}, config, durability="sync"))
    else:
        graph.invoke({"log": []}, config, durability="sync")
    print("finished without being killed", flush=True)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
