"""What running a LangGraph graph as a Cairn workflow costs (issue 24 part 2), in one run.

    python -m bench.lgdurable                 # 200 super-steps, 3 repeats
    python -m bench.lgdurable --steps 500 --repeats 5

The workload: one node, ``talk``, looping to itself until ``n`` reaches the
step count, appending a 1 KB message per super-step (as ``bench/graph.py``),
compiled once and run three ways on fresh SQLite files:

* ``CairnSaver``: ``graph.invoke`` with ``checkpointer=CairnSaver(app)`` and
  ``durability="sync"`` (the checkpointer alone);
* ``app.langgraph``: the same graph as a workflow run inline (``app.run``):
  the run's lease-fenced saver, a journal entry per root checkpoint;
* ``app.langgraph`` + tool: the node also calls a Cairn ``write`` tool each
  super-step (an intent behind the effect barrier, then its result);
* ``app.langgraph`` + static interrupt: compiled with
  ``interrupt_after=["finish"]``, a node run once at the end: every
  checkpoint is tested for a stop (``cairn.lgbreakpoints``: a stop after a
  node reads the parent checkpoint's tasks, the dearer of the two rules),
  and the one stop is approved and resumed inside the figure.

Figure: µs per super-step (wall time / steps), the median of the repeats.
"""

from __future__ import annotations

import argparse
import operator
import statistics
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

import cairn
from cairn.langgraph import CairnSaver


class Talk(TypedDict):
    messages: Annotated[list[str], operator.add]
    n: int


def build(steps: int, tool: Any = None, *, stop: bool = False) -> Any:
    def talk(state: Talk) -> dict[str, Any]:
        if tool is not None:
            tool(state["n"])
        return {"messages": [f"{state['n']:04d}" + "x" * 1020], "n": state["n"] + 1}

    builder = StateGraph(Talk)
    builder.add_node("talk", talk)
    builder.add_edge(START, "talk")
    last = "finish" if stop else END
    builder.add_conditional_edges("talk", lambda s: last if s["n"] >= steps else "talk", ["talk", last])
    if not stop:
        return builder.compile()
    builder.add_node("finish", lambda state: {"messages": ["done"]})
    builder.add_edge("finish", END)
    return builder.compile(interrupt_after=["finish"])


def saver_only(directory: Path, steps: int) -> float:
    with cairn.App(db=f"sqlite:///{directory}/saver.db") as app:
        graph = build(steps).copy(update={"checkpointer": CairnSaver(app)})
        config: Any = {"configurable": {"thread_id": "t"}, "recursion_limit": steps + 10}
        started = time.perf_counter()
        graph.invoke({"messages": [], "n": 0}, config, durability="sync")
        return time.perf_counter() - started


def as_workflow(directory: Path, steps: int, *, with_tool: bool) -> float:
    with cairn.App(db=f"sqlite:///{directory}/run.db") as app:
        tool = None
        if with_tool:
            @app.tool(effect="write")
            def record(n: int) -> int:
                return n

            tool = record
        graph = build(steps, tool).with_config(recursion_limit=steps + 10)
        workflow = app.langgraph(graph, name="talk")
        started = time.perf_counter()
        final = app.run(workflow, {"messages": [], "n": 0})
        elapsed = time.perf_counter() - started
        assert final["n"] == steps
        return elapsed


def with_stop(directory: Path, steps: int) -> float:
    with cairn.App(db=f"sqlite:///{directory}/run.db") as app:
        graph = build(steps, stop=True).with_config(recursion_limit=steps + 10)
        workflow = app.langgraph(graph, name="talk")
        started = time.perf_counter()
        try:
            app.run(workflow, {"messages": [], "n": 0}, run_id="stop")
        except cairn.RunSuspended:
            [request] = app.approvals(run_id="stop")
            app.approve("stop", request.request_id)
        final = app.resume("stop")
        elapsed = time.perf_counter() - started
        assert final["n"] == steps
        return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ways = {"CairnSaver (graph.invoke)": lambda d: saver_only(d, args.steps),
            "app.langgraph": lambda d: as_workflow(d, args.steps, with_tool=False),
            "app.langgraph + write tool": lambda d: as_workflow(d, args.steps, with_tool=True),
            "app.langgraph + static interrupt": lambda d: with_stop(d, args.steps)}
    with tempfile.TemporaryDirectory() as warm:
        as_workflow(Path(warm), 10, with_tool=True)  # imports and first-use costs, outside the figures
    print(f"{args.steps} super-steps, 1 KB appended per step, SQLite, median of {args.repeats}")
    for name, way in ways.items():
        times = []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as directory:
                times.append(way(Path(directory)))
        per_step = statistics.median(times) / args.steps * 1e6
        print(f"{name:30s} {per_step:8.0f} µs per super-step")


if __name__ == "__main__":
    main()
