"""A process driving a LangGraph thread through ``CairnSaver`` (the fencing
test's stale writer): ``python -m tests.langgraph.driver_main DB_URL THREAD STEPS``. Each super-step
prints ``ready <n>`` once its previous checkpoint is surely written (the
node waits a moment first), then sleeps, so the test can freeze it outside
any write. Exits 3 printing the error if its thread was taken from it."""

from __future__ import annotations

import sys
import time

from cairn.errors import ThreadTaken
from tests.langgraph.graphs import counting_loop


def main() -> int:
    url, thread, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    from cairn.langgraph import CairnSaver

    def pause(n: int) -> None:
        time.sleep(0.3)
        print(f"ready {n}", flush=True)
        time.sleep(1.0)

    saver = CairnSaver(url, tenant="acme")
    graph = counting_loop(steps, "a", pause).compile(checkpointer=saver)
    try:
        graph.invoke({"log": []}, {"configurable": {"thread_id": thread}, "recursion_limit": 10 * steps})
    except ThreadTaken as exc:
        print(f"refused: {exc}", file=sys.stderr, flush=True)
        return 3
    finally:
        saver.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
