"""A graph whose parallel nodes finish in a random order, run by
``test_determinism.py`` in the test process and in another process (with
another hash seed): ``python -m tests.graph.determinism_app DB RUN_ID``."""

from __future__ import annotations

import asyncio
import random
import sys
from typing import Annotated, Any, TypedDict

import cairn


def gather(old: Any, new: Any) -> dict[str, list[str]]:
    """A custom reducer: each key's list grows in the order updates merge."""
    merged = {k: list(v) for k, v in (old or {}).items()}
    for key, value in new.items():
        merged.setdefault(key, []).append(value)
    return merged


class Work(TypedDict):
    log: Annotated[list[str], cairn.append]
    seen: Annotated[dict[str, list[str]], gather]
    tags: Annotated[dict[str, int], cairn.merge]
    rounds: int


def build(app: cairn.App) -> cairn.Workflow[Any]:
    g = cairn.Graph(Work)

    def branch(name: str) -> Any:
        async def node(state: Work) -> dict[str, Any]:
            await asyncio.sleep(random.uniform(0, 0.01))
            rounds = state["rounds"]
            return {"log": [f"{name}{rounds}"], "seen": {"all": name}, "tags": {name: rounds}}
        return node

    for name in ("p", "q", "r", "s"):
        g.node(branch(name), name=name)
        g.edge(cairn.START, name)

    @g.node
    def join(state: Work) -> dict[str, Any]:
        return {"rounds": state["rounds"] + 1}

    for name in ("p", "q", "r", "s"):
        g.edge(name, "join")
    g.route("join", lambda state: cairn.END if state["rounds"] >= 5 else
            ["s", cairn.Send("p", {"rounds": state["rounds"]}), "q", "r"])
    return app.graph("work", g)


START: Work = {"log": [], "seen": {}, "tags": {}, "rounds": 0}


def main() -> int:
    app = cairn.App(db=sys.argv[1])
    try:
        app.run(build(app), START, run_id=sys.argv[2])
    finally:
        app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
