"""Step 2 of graph workflows: super-steps on the engine.

Nodes of one super-step run side by side and their updates merge in task
order whatever order they finish in; routers loop and fan out (``Send``);
``max_steps`` stops a loop with a clear error; a node's ``RetryPolicy``
retries it; the bundle covers nodes, routers and edges; a new execution
resumes from the latest checkpoint without running committed nodes again."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, TypedDict

import pytest

import cairn
from cairn.engine.bundles import code_hash
from cairn.engine.signals import Release
from cairn.errors import RunFailed


class Log(TypedDict):
    log: Annotated[list[str], cairn.append]
    n: int


def diamond(delays: dict[str, float]) -> cairn.Graph:
    g = cairn.Graph(Log)

    def make(name: str) -> Any:
        async def node(state: Log) -> dict[str, Any]:
            await asyncio.sleep(delays.get(name, 0.0))
            return {"log": [name]}
        return node

    for name in ("a", "b", "c", "d"):
        g.node(make(name), name=name)
    g.edge(cairn.START, "a")
    g.edge("a", "c")
    g.edge("a", "b")
    g.edge("b", "d")
    g.edge("c", "d")
    g.edge("d", cairn.END)
    return g


@pytest.mark.parametrize("delays", [{"b": 0.05}, {"c": 0.05}], ids=["b-slow", "c-slow"])
def test_parallel_branches_merge_in_task_order_whatever_finishes_first(
        app: cairn.App, delays: dict[str, float]) -> None:
    final = app.run(app.graph("diamond", diamond(delays)), {"log": [], "n": 0}, run_id="d")
    assert final["log"] == ["a", "b", "c", "d"]
    assert [c.nodes for c in reversed(app.checkpoints("d"))] == [(), ("a",), ("b", "c"), ("d",)]


def test_sync_nodes_run_side_by_side_in_threads(app: cairn.App) -> None:
    import threading

    barrier = threading.Barrier(2, timeout=10)
    g = cairn.Graph(Log)

    def meet(name: str) -> Any:
        def node(state: Log) -> dict[str, Any]:
            barrier.wait()  # both must be running at once, or this times out
            return {"log": [name]}
        return node

    g.node(meet("x"), name="x")
    g.node(meet("y"), name="y")
    g.edge(cairn.START, "y")
    g.edge(cairn.START, "x")
    g.edge("x", cairn.END)
    g.edge("y", cairn.END)
    assert app.run(app.graph("pair", g), {"log": [], "n": 0})["log"] == ["x", "y"]


def test_send_fans_out_over_a_thousand_items(app: cairn.App) -> None:
    g = cairn.Graph(Log)
    g.node(lambda state: None, name="plan")

    async def square(item: Any) -> dict[str, Any]:
        await asyncio.sleep(0.001 * (item["i"] % 3))  # finish out of order
        return {"log": [str(item["i"] ** 2)]}

    g.node(square, name="square")
    g.edge(cairn.START, "plan")
    g.route("plan", lambda state: [cairn.Send("square", {"i": i}) for i in range(1000)])
    g.edge("square", cairn.END)
    final = app.run(app.graph("fan", g), {"log": [], "n": 0}, run_id="fan")
    assert final["log"] == [str(i * i) for i in range(1000)]
    top = app.checkpoints("fan", limit=1)[0]
    assert (top.step, len(top.nodes), top.next) == (2, 1000, ())


def loop(limit: int) -> cairn.Graph:
    g = cairn.Graph(Log)
    g.node(lambda state: {"n": state["n"] + 1}, name="tick")
    g.edge(cairn.START, "tick")
    g.route("tick", lambda state: cairn.END if state["n"] >= limit else "tick")
    return g


def test_a_loop_runs_until_its_router_says_end(app: cairn.App) -> None:
    assert app.run(app.graph("loop", loop(25)), {"log": [], "n": 0}, run_id="l")["n"] == 25
    assert app.checkpoints("l", limit=1)[0].step == 25


def test_max_steps_stops_a_loop_with_a_clear_error(app: cairn.App) -> None:
    workflow = app.graph("spin", loop(10**9), max_steps=30)
    says = r"ran 30 super-steps \(max_steps\) without reaching END; next: tick"
    with pytest.raises(RunFailed, match=says):
        app.run(workflow, {"log": [], "n": 0}, run_id="spin")
    assert app.graph_state("spin")["n"] == 30


def test_a_node_retry_policy_retries_it(app: cairn.App) -> None:
    attempts: list[int] = []
    g = cairn.Graph(Log)

    def flaky(state: Log) -> dict[str, Any]:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("try again")
        return {"n": len(attempts)}

    g.node(flaky, retry=cairn.RetryPolicy(max_attempts=3, initial_delay=0.0, jitter=0.0))
    g.edge(cairn.START, "flaky")
    g.edge("flaky", cairn.END)
    assert app.run(app.graph("flaky", g), {"log": [], "n": 0})["n"] == 3

    attempts.clear()
    g2 = cairn.Graph(Log)
    g2.node(flaky, retry=cairn.RetryPolicy(max_attempts=2, initial_delay=0.0, jitter=0.0))
    g2.edge(cairn.START, "flaky")
    g2.edge("flaky", cairn.END)
    says = r"node 'flaky' failed \(attempt 2 of 2\): ConnectionError: try again"
    with pytest.raises(RunFailed, match=says):
        app.run(app.graph("flaky2", g2), {"log": [], "n": 0})


def first(state: Log) -> dict[str, Any]:
    return {"n": 1}


def first_changed(state: Log) -> dict[str, Any]:
    return {"n": 2}


def second(state: Log) -> dict[str, Any]:
    return {"log": ["second"]}


def hash_of(nodes: list[Any], edges: list[tuple[str, str]]) -> str:
    g = cairn.Graph(Log)
    for fn in nodes:
        g.node(fn, name=fn.__name__.removesuffix("_changed"))
    for source, target in edges:
        g.edge(source, target)
    from cairn.graph import runner

    return code_hash(runner.workflow("h", "1", g.compile(), 100).fn)


def test_the_bundle_covers_node_code_and_edges() -> None:
    edges = [(cairn.START, "first"), ("first", "second"), ("second", cairn.END)]
    base = hash_of([first, second], edges)
    assert hash_of([first, second], edges) == base
    assert hash_of([first_changed, second], edges) != base  # a node's code
    parallel = [(cairn.START, "first"), (cairn.START, "second"), ("first", cairn.END), ("second", cairn.END)]
    assert hash_of([first, second], parallel) != base  # an edge


def test_a_new_execution_resumes_from_the_latest_checkpoint(app: cairn.App) -> None:
    """The run is released in super-step 3 (as a draining worker does):
    the next execution starts from checkpoint 2, so the nodes of steps 1
    and 2 never run again and step 3's node runs again."""
    ran: list[int] = []
    g = cairn.Graph(Log)

    def tick(state: Log) -> dict[str, Any]:
        ran.append(state["n"])
        if state["n"] == 2 and ran.count(2) == 1:
            raise Release("worker is draining")
        return {"n": state["n"] + 1, "log": [str(state["n"])]}

    g.node(tick)
    g.edge(cairn.START, "tick")
    g.route("tick", lambda state: cairn.END if state["n"] >= 5 else "tick")
    final = app.run(app.graph("resume", g), {"log": [], "n": 0}, run_id="resume")
    assert final == {"log": ["0", "1", "2", "3", "4"], "n": 5}
    assert ran == [0, 1, 2, 2, 3, 4]
    assert [c.step for c in app.checkpoints("resume")] == [5, 4, 3, 2, 1, 0]
