"""A process driving a LangGraph thread through ``CairnSaver`` with
LangGraph's default durability (``"async"``) that SIGKILLs itself inside a
checkpoint's put once that checkpoint's writes are committed (its pending
row, SQLite): ``python -m tests.langgraph.pending_crash_main DB_URL THREAD
STEPS LEDGER KILL_AT``. ``KILL_AT``: the put (1 the first) to die in, after
waiting for the node's writes; negative: never (resume the thread, or start
it). Each node appends ``<n>`` to ``LEDGER`` (fsynced) before it returns
(``graphs.ledger_loop``). Prints ``killed with a pending row`` before the kill
when the checkpoint's pending row is there (read behind the saver's back)."""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
import time
from typing import Any

from cairn.store import open_store
from tests.langgraph.graphs import ledger_loop


def main() -> int:
    url, thread, steps, ledger, kill_at = (
        sys.argv[1],
        sys.argv[2],
        int(sys.argv[3]),
        sys.argv[4],
        int(sys.argv[5]),
    )
    from cairn.langgraph import CairnSaver

    store: Any = open_store(url)
    put = store.lg_put
    calls = [0]

    def dying_put(key: Any, holder: Any, row: Any, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == kill_at:
            path = url.removeprefix("sqlite:///")
            for _ in range(200):  # the node's writes, committed by another thread of the loop
                with sqlite3.connect(path) as conn:
                    found = conn.execute(
                        "SELECT count(*) FROM lg_checkpoints WHERE checkpoint_id = ? "
                        "AND checkpoint_kind = ''",
                        (row.checkpoint_id,),
                    ).fetchone()[0]
                if found:
                    print("killed with a pending row", flush=True)
                    break
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGKILL)
        return put(key, holder, row, *args, **kwargs)

    store.lg_put = dying_put
    graph = ledger_loop(steps, ledger).compile(checkpointer=CairnSaver(store, tenant="acme"))
    config: Any = {"configurable": {"thread_id": thread}, "recursion_limit": 10 * steps}
    started = graph.get_state(config).values
    graph.invoke(None if started else {"log": []}, config, durability="async")
    print("finished", flush=True)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
