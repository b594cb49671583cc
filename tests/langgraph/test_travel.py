"""Time travel over LangGraph threads stored by ``CairnSaver`` (issue 24,
part 3), on both backends: a typed diff between two checkpoints (a list that
grew as an append, a dict's change by key path, a replaced value old -> new),
from Python and from ``cairn langgraph diff --json``; LangGraph's own fork
(``update_state`` on an old checkpoint, then resuming from it) working through
the saver; another tenant's thread, an unknown checkpoint and hostile text."""

from __future__ import annotations

import json
import operator
from typing import Annotated, Any, TypedDict

import pytest
from click.testing import CliRunner, Result

import cairn
from cairn.cli.main import main
from cairn.errors import InvalidArgument


class Profiled(TypedDict):
    log: Annotated[list[str], operator.add]
    profile: dict[str, Any]
    n: int


def _graph(steps: int) -> Any:
    """Each super-step appends to ``log``, moves ``profile.address.city`` and bumps ``n``."""
    from langgraph.graph import END, START, StateGraph

    def step(state: Profiled) -> dict[str, Any]:
        n = state["n"] + 1
        return {"log": [f"step {n}"], "n": n,
                "profile": {**state["profile"], "address": {"city": f"city {n}", "zip": "00000"}}}

    def route(state: Profiled) -> str:
        return END if state["n"] >= steps else "step"

    g = StateGraph(Profiled)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", route)
    return g


def _config(thread: str, checkpoint_id: str | None = None) -> Any:
    conf = {"thread_id": thread} if checkpoint_id is None else {"thread_id": thread,
                                                                "checkpoint_id": checkpoint_id}
    return {"configurable": conf}


def _by_step(saver: Any, thread: str) -> dict[int, str]:
    return {t.metadata["step"]: t.config["configurable"]["checkpoint_id"]
            for t in saver.list(_config(thread))}


def _cli(db_url: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["langgraph", *args, "--db", db_url], env={"COLUMNS": "200"})


def test_a_diff_of_two_checkpoints_is_typed(app: cairn.App, db_url: str) -> None:
    from cairn.langgraph import CairnSaver

    saver = CairnSaver(app, tenant="acme")
    start = {"log": [], "profile": {"name": "ada"}, "n": 0}
    _graph(4).compile(checkpointer=saver).invoke(start, _config("t"))
    steps = _by_step(saver, "t")
    changes = saver.diff("t", steps[1], steps[3])
    assert [(c.path, c.kind, c.old, c.new) for c in changes] == [
        (("log",), "appended", None, ["step 2", "step 3"]),
        (("profile", "address", "city"), "replaced", "city 1", "city 3"),
        (("n",), "replaced", 1, 3),
    ]
    # LangGraph's own channels are no field of the state unless asked for
    assert {c.path[0] for c in saver.diff("t", steps[-1], steps[0], internal=True)} >= {"__start__"}
    assert saver.diff("t", steps[2], steps[2]) == []
    assert saver.values("t")["log"] == [f"step {n}" for n in range(1, 5)]
    # the same from the command line, as JSON
    out = _cli(db_url, "diff", "t", steps[1], steps[3], "--tenant", "acme", "--json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["changes"][0] == {"path": ["log"], "kind": "appended", "old": None,
                                 "new": ["step 2", "step 3"]}
    assert doc["changes"][1]["path"] == ["profile", "address", "city"]
    # B defaults to the latest checkpoint
    latest = json.loads(_cli(db_url, "diff", "t", steps[3], "--tenant", "acme", "--json").output)
    assert latest["changes"][0]["new"] == ["step 4"]
    history = json.loads(_cli(db_url, "history", "t", "--tenant", "acme", "--limit", "2", "--json").output)
    assert [c["step"] for c in history["checkpoints"]] == [4, 3]
    assert history["next_before"] == steps[3]
    state = json.loads(_cli(db_url, "state", "t", "--checkpoint", steps[2], "--tenant", "acme",
                            "--json").output)
    assert state["values"] == {"log": ["step 1", "step 2"], "n": 2,
                               "profile": {"name": "ada", "address": {"city": "city 2", "zip": "00000"}}}


def test_another_tenants_thread_and_an_unknown_checkpoint_are_one_line(app: cairn.App, db_url: str) -> None:
    from cairn.langgraph import CairnSaver

    saver = CairnSaver(app, tenant="acme")
    _graph(2).compile(checkpointer=saver).invoke({"log": [], "profile": {}, "n": 0}, _config("t"))
    first = _by_step(saver, "t")[0]
    with pytest.raises(InvalidArgument, match="thread 't' of tenant 'globex' has no checkpoint"):
        CairnSaver(app, tenant="globex").diff("t", first, None)
    for args in (["diff", "t", first, "--tenant", "globex"], ["state", "t", "--checkpoint", "nope"],
                 ["history", "t", "--tenant", "globex"]):
        out = _cli(db_url, *args)
        assert out.exit_code == 2, out.output
        assert "Traceback" not in out.output
        assert len(out.output.strip().splitlines()) == 1, out.output


def test_fork_with_update_state_works_through_the_saver(app: cairn.App, db_url: str) -> None:
    """LangGraph's time travel: ``update_state`` on an old checkpoint makes a
    new checkpoint whose parent is that one; resuming from it runs a second
    branch; both branches stay readable, and the diff of their ends says
    what the fork changed."""
    from cairn.langgraph import CairnSaver

    saver = CairnSaver(app, tenant="acme")
    graph = _graph(4).compile(checkpointer=saver)
    graph.invoke({"log": [], "profile": {"name": "ada"}, "n": 0}, _config("t"))
    steps = _by_step(saver, "t")
    first_end = steps[4]
    forked = graph.update_state(_config("t", steps[2]), {"log": ["edited"], "n": 2})
    assert saver.get_tuple(forked).parent_config["configurable"]["checkpoint_id"] == steps[2]
    out = graph.invoke(None, forked)
    assert out["log"] == ["step 1", "step 2", "edited", "step 3", "step 4"]
    # the first branch is untouched, and read again (not from what the saver last held)
    again = CairnSaver(app, tenant="acme")
    assert again.values("t", first_end)["log"] == [f"step {n}" for n in range(1, 5)]
    assert saver.values("t", first_end)["log"] == [f"step {n}" for n in range(1, 5)]
    changes = saver.diff("t", first_end, None)
    assert [(c.path, c.kind) for c in changes] == [(("log", 2), "inserted")]
    assert changes[0].new == ["edited"]
    # the history of the new branch runs through the fork to the first steps
    branch = [t.metadata["step"] for t in graph.get_state_history(_config("t"))]
    assert len(branch) == len(set(t.config["configurable"]["checkpoint_id"]
                                  for t in graph.get_state_history(_config("t"))))


def test_messages_and_hostile_text_diff_as_data(app: cairn.App, db_url: str) -> None:
    """A message list diffs as appended messages (each the dict of its
    fields); markup and escape sequences in them stay data, in the JSON and
    in the one-line view."""
    from langchain_core.messages import AIMessage
    from langgraph.graph import END, START, StateGraph
    from langgraph.graph.message import add_messages

    from cairn.langgraph import CairnSaver

    chat = TypedDict("chat", {"messages": Annotated[list[Any], add_messages]})  # type: ignore[misc]  # noqa: UP013
    hostile = "[bold red]x[/] \x1b]0;pwned\x07 <script>alert(1)</script>"

    def talk(state: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [AIMessage(content=f"{hostile} {len(state['messages'])}")]}

    g = StateGraph(chat)
    g.add_node("talk", talk)
    g.add_edge(START, "talk")
    g.add_conditional_edges("talk", lambda s: END if len(s["messages"]) >= 3 else "talk")
    saver = CairnSaver(app, tenant="acme")
    g.compile(checkpointer=saver).invoke({"messages": []}, _config("chat"))
    steps = _by_step(saver, "chat")
    out = _cli(db_url, "diff", "chat", steps[0], steps[2], "--tenant", "acme", "--json")
    assert out.exit_code == 0, out.output
    change = json.loads(out.output)["changes"][0]
    assert change["kind"] == "appended"
    assert change["path"] == ["messages"]
    assert [m["content"] for m in change["new"]] == [f"{hostile} 0", f"{hostile} 1"]
    assert "\x1b" not in out.output
    shown = _cli(db_url, "diff", "chat", steps[0], steps[2], "--tenant", "acme")
    assert shown.exit_code == 0, shown.output
    assert "\x1b" not in shown.output
    assert "\x07" not in shown.output
