"""Time travel over graph runs (issue 23, item 4), on both backends:
history, the state at any checkpoint (typed, and as plain JSON without the
graph's code), replay from a checkpoint (a new run with lineage that reuses
nothing after it: nodes, tools and model calls run again), fork with an
edited state (validated; nothing of the abandoned branch leaks in: pending
writes, approvals, run memory), diffs and the first divergence."""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any, TypedDict

import pytest

import cairn
from cairn.errors import InvalidArgument, RunFailed, RunSuspended
from cairn.graph.travel import Lineage
from cairn.models import Message, ScriptedModel
from cairn.store.records import RunStatus


class Chat(TypedDict):
    messages: Annotated[list[str], cairn.append]
    n: int
    seen: str | None


START_STATE: Chat = {"messages": [], "n": 0, "seen": None}


class Agent:
    """think -> act -> finish, counting every call: ``act`` asks a model,
    calls a write tool and reads then writes run memory."""

    def __init__(self, app: cairn.App, *, interrupt: bool = False) -> None:
        self.calls: Counter[str] = Counter()
        self.model = ScriptedModel(lambda request, n: Message("assistant", f"reply {n}"))

        @app.tool(effect="write")
        def send(op: cairn.Operation, text: str) -> str:
            self.calls["send"] += 1
            return op.operation_id

        g = cairn.Graph(Chat)

        def think(state: Chat) -> dict[str, Any]:
            self.calls["think"] += 1
            return {"messages": ["thought"], "n": state["n"] + 1}

        def act(state: Chat, ctx: cairn.Context) -> dict[str, Any]:
            self.calls["act"] += 1
            reply = ctx.model(self.model, [Message("user", "go")]).message.text
            receipt = send(reply)
            seen = ctx.memory.run.get("note")
            ctx.memory.run.put("note", f"act saw n={state['n']}")
            return {"messages": [f"{reply} {receipt}"], "seen": seen}

        def finish(state: Chat) -> dict[str, Any]:
            self.calls["finish"] += 1
            return {"messages": [f"done n={state['n']}"]}

        g.node(think)
        g.node(act)
        g.node(finish, interrupt_before=interrupt)
        g.edge(cairn.START, "think")
        g.edge("think", "act")
        g.edge("act", "finish")
        g.edge("finish", cairn.END)
        self.workflow = app.graph("agent", g)


def test_history_and_state_at_any_checkpoint_without_the_code(app: cairn.App) -> None:
    agent = Agent(app)
    final = app.run(agent.workflow, START_STATE, run_id="o")
    assert [c.step for c in app.checkpoints("o")] == [3, 2, 1, 0]
    assert [c.step for c in app.checkpoints("o", before=2, limit=1)] == [1]
    assert app.graph_state("o", 1) == {"messages": ["thought"], "n": 1, "seen": None}
    bare = cairn.App(db=app.db_url)  # no graph registered: the CLI's and the server's view
    try:
        assert [c.step for c in bare.checkpoints("o", limit=2)] == [3, 2]
        assert bare.graph_state_json("o", 1) == (1, {"messages": ["thought"], "n": 1, "seen": None})
        assert bare.graph_state_json("o") == (3, dict(final))
        with pytest.raises(InvalidArgument, match="not registered in this process"):
            bare.graph_replay("o", 1)
        with pytest.raises(InvalidArgument, match="not registered in this process"):
            bare.graph_fork("o", 1, update={"n": 5})
    finally:
        bare.close()


def test_replay_reexecutes_from_the_checkpoint_and_reuses_nothing_after_it(app: cairn.App) -> None:
    agent = Agent(app)
    first = app.run(agent.workflow, START_STATE, run_id="o")
    assert dict(agent.calls) == {"think": 1, "act": 1, "send": 1, "finish": 1}
    assert agent.model.calls == 1
    handle = app.graph_replay("o", 1, run_id="r")
    assert handle.run_id == "r"
    assert handle.created
    again = app.resume("r")
    # think's super-step (1) is the starting point: not run; act, its model call and its tool run again
    assert dict(agent.calls) == {"think": 1, "act": 2, "send": 2, "finish": 2}
    assert agent.model.calls == 2
    assert first["messages"][1].startswith("reply 0 ")
    assert again["messages"][1].startswith("reply 1 ")
    assert first["messages"][1] != again["messages"][1]  # another operation id: the tool ran again
    assert again["seen"] is None  # the origin's run memory is not the replay's
    assert app.lineage("r") == Lineage("o", 1, False)
    assert app.lineage("o") is None
    assert [c.step for c in app.checkpoints("r")] == [3, 2, 1]
    assert app.checkpoints("r")[-1].nodes == ()
    assert app.graph_state("r", 0) == app.graph_state("o", 0)  # before the fork: the origin's
    assert app.graph_state("r", 1) == app.graph_state("o", 1)
    assert app.graph_divergence("o", "r") == 2  # the model said something else at step 2
    assert app.graph_divergence("o", "o") is None
    created = app.history("r", 0, 1)[0]
    assert created.detail is not None
    assert created.detail["forked_from"] == {"run_id": "o", "step": 1, "edited": False}


def test_replay_from_the_input_runs_every_node_again(app: cairn.App) -> None:
    agent = Agent(app)
    app.run(agent.workflow, START_STATE, run_id="o")
    app.graph_replay("o", 0, run_id="r0")
    app.resume("r0")
    assert dict(agent.calls) == {"think": 2, "act": 2, "send": 2, "finish": 2}


def test_a_replay_is_idempotent_on_its_run_id(app: cairn.App) -> None:
    agent = Agent(app)
    app.run(agent.workflow, START_STATE, run_id="o")
    assert app.graph_replay("o", 2, run_id="r").created
    assert not app.graph_replay("o", 2, run_id="r").created
    assert len(app.list_runs()) == 2


def test_fork_with_an_edited_state(app: cairn.App) -> None:
    agent = Agent(app)
    app.run(agent.workflow, START_STATE, run_id="o")
    app.graph_fork("o", 2, update={"n": 41}, run_id="f")
    final = app.resume("f")
    assert final["messages"][-1] == "done n=41"
    assert agent.calls["act"] == 1  # forked after act: act is not run again
    assert app.lineage("f") == Lineage("o", 2, True)
    assert app.graph_divergence("o", "f") == 2
    changes = app.graph_diff("o", 2, 2, other_run="f")
    assert [(c.path, c.kind, c.old, c.new) for c in changes] == [(("n",), "replaced", 1, 41)]
    assert app.graph_divergence("f", "f") is None


@pytest.mark.parametrize(("update", "message"), [
    ({"nope": 1}, "'nope' is not a field of Chat"),
    ({"n": "many"}, "field 'n'"),
    ({"messages": "not a list"}, "field 'messages'"),
    ([1, 2], "the fork.s update is a list"),
])
def test_a_bad_update_names_the_field_and_creates_no_run(app: cairn.App, update: Any, message: str) -> None:
    agent = Agent(app)
    app.run(agent.workflow, START_STATE, run_id="o")
    with pytest.raises(InvalidArgument, match=message):
        app.graph_fork("o", 1, update=update, run_id="f")
    assert [r.run_id for r in app.list_runs()] == ["o"]


def test_bad_steps_and_runs_are_clear_errors(app: cairn.App) -> None:
    agent = Agent(app)
    app.run(agent.workflow, START_STATE, run_id="o")

    @app.workflow
    def plain(ctx: cairn.Context) -> int:
        return 1

    app.run(plain, run_id="p")
    for call in (lambda: app.graph_replay("o", 9), lambda: app.graph_state_json("o", 9),
                 lambda: app.graph_diff("o", 0, 9)):
        with pytest.raises(InvalidArgument, match=r"no checkpoint at super-step 9 \(its checkpoints: 0 to 3"):
            call()
    with pytest.raises(InvalidArgument, match=r"non-negative integer\), not -1"):
        app.graph_replay("o", -1)
    with pytest.raises(InvalidArgument, match=r"non-negative integer\), not .1."):
        app.graph_replay("o", "1")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="'p' has no checkpoint: it is not a graph run"):
        app.graph_replay("p", 0)
    with pytest.raises(InvalidArgument, match="not a graph run"):
        app.checkpoints("p")
    with pytest.raises(cairn.RunNotFound):
        app.graph_fork("missing", 0)
    assert {r.run_id for r in app.list_runs()} == {"o", "p"}


def test_pending_writes_of_the_abandoned_branch_do_not_leak(app: cairn.App) -> None:
    """The origin's super-step 1 ran x (its tool executed) and failed in y:
    x's tool result is a pending write of a super-step that never
    committed. The fork at 0 runs x again, and its tool too."""
    sent: list[str] = []

    @app.tool(effect="write")
    def charge(op: cairn.Operation) -> str:
        sent.append(op.operation_id)
        return op.operation_id

    class Flags(TypedDict):
        log: Annotated[list[str], cairn.append]
        ok: bool

    g = cairn.Graph(Flags)

    def x(state: Flags) -> dict[str, Any]:
        return {"log": [f"x {charge()}"]}

    def y(state: Flags) -> dict[str, Any]:
        if not state["ok"]:
            raise RuntimeError("not ok")
        return {"log": ["y"]}

    g.node(x)
    g.node(y)
    g.edge(cairn.START, "x")
    g.edge(cairn.START, "y")
    g.edge("x", cairn.END)
    g.edge("y", cairn.END)
    workflow = app.graph("flags", g)
    with pytest.raises(RunFailed, match="not ok"):
        app.run(workflow, {"log": [], "ok": False}, run_id="o")
    assert len(sent) == 1
    app.graph_fork("o", 0, update={"ok": True}, run_id="f")
    final = app.resume("f")
    assert len(sent) == 2
    assert sent[0] != sent[1]
    assert final["log"] == [f"x {sent[1]}", "y"]


def test_approvals_of_the_abandoned_branch_do_not_leak(app: cairn.App) -> None:
    agent = Agent(app, interrupt=True)
    with pytest.raises(RunSuspended):
        app.run(agent.workflow, START_STATE, run_id="o")
    [request] = app.approvals(run_id="o")
    app.approve("o", request.request_id, edit={**app.graph_state("o", 2), "n": 99})
    assert app.resume("o")["messages"][-1] == "done n=99"
    app.graph_replay("o", 2, run_id="r")
    with pytest.raises(RunSuspended):
        app.resume("r")  # its own approval: the origin's decision (and its edit) is not the replay's
    [mine] = app.approvals(run_id="r")
    assert mine.request_id != request.request_id
    assert mine.pending
    app.approve("r", mine.request_id)
    assert app.resume("r")["messages"][-1] == "done n=1"
    assert app.get_run("r").status is RunStatus.COMPLETED


def test_run_memory_written_after_the_point_does_not_leak(app: cairn.App) -> None:
    agent = Agent(app)
    app.run(agent.workflow, START_STATE, run_id="o")
    app.graph_replay("o", 1, run_id="r")
    assert app.resume("r")["seen"] is None
    app.graph_replay("r", 2, run_id="rr")  # a replay of a replay: rr's states before 2 are r's
    app.resume("rr")
    assert app.lineage("rr") == Lineage("r", 2, False)
    assert app.graph_state_json("rr", 0) == app.graph_state_json("o", 0)
    assert app.graph_divergence("r", "rr") is None  # finish ran again on the same state


def test_diff_of_two_checkpoints(app: cairn.App) -> None:
    agent = Agent(app)
    app.run(agent.workflow, START_STATE, run_id="o")
    changes = app.graph_diff("o", 0, 1)
    assert [(c.path, c.kind, c.old, c.new) for c in changes] == [
        (("messages",), "appended", None, ["thought"]), (("n",), "replaced", 0, 1)]
    assert app.graph_diff("o", 3, 3) == []


def test_divergence_of_two_independent_runs(app: cairn.App) -> None:
    agent = Agent(app)
    app.run(agent.workflow, START_STATE, run_id="a")
    app.run(agent.workflow, START_STATE, run_id="b")
    assert app.graph_divergence("a", "b") == 2  # the same input and thought; the model's reply differs
    app.run(agent.workflow, {**START_STATE, "n": 5}, run_id="c")
    assert app.graph_divergence("a", "c") == 0


def test_a_fork_carries_the_sends_of_its_checkpoint_and_passes_the_replay_check(app: cairn.App) -> None:
    class Fan(TypedDict):
        items: list[int]
        out: Annotated[list[int], cairn.append]

    g = cairn.Graph(Fan)
    runs: Counter[int] = Counter()

    def square(item: int) -> dict[str, Any]:
        runs[item] += 1
        return {"out": [item * item]}

    g.node(square)
    g.route(cairn.START, lambda state: [cairn.Send("square", i) for i in state["items"]])
    g.edge("square", cairn.END)
    workflow = app.graph("fan", g)
    assert app.run(workflow, {"items": [1, 2, 3], "out": []}, run_id="o")["out"] == [1, 4, 9]
    app.graph_fork("o", 0, update={"items": [7]}, run_id="f")  # the Sends were computed at step 0
    assert app.resume("f")["out"] == [1, 4, 9]
    assert runs == {1: 2, 2: 2, 3: 2}
    assert app.checkpoints("f")[-1].next == ("square", "square", "square")
    assert app.replay_check("f").compatible
    assert app.graph_state("f")["items"] == [7]
