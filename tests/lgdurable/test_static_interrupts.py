"""LangGraph static interrupts (``compile(interrupt_before=..., interrupt_after=...)``,
``"*"``) as Cairn approvals or signal waits (both backends).

The run suspends before (after) the named nodes run, holding no worker, the
state as the request's details; approved, the graph goes on; edited, the
edit is applied as ``update_state`` applies an update (as the node named,
through its reducers, validated as the state's fields); rejected, the run
fails. The driver decides where the stops are from the stored checkpoint
(``cairn.lgbreakpoints``), so each is asked once, and a later execution
replays its decision."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import interrupt
from pydantic import BaseModel

import cairn
from cairn.errors import InvalidEdit, RunFailed, RunSuspended
from cairn.langgraph import CairnSaver
from cairn.lgdurable import RESUME_SIGNAL
from cairn.store.records import ApprovalStatus, RunStatus
from tests.lgdurable.test_interrupts import driven, published


class Order(TypedDict):
    log: Annotated[list[str], operator.add]
    amount: Annotated[int, operator.add]  # a reducer: an edit applied twice would show


START_STATE = {"log": [], "amount": 0}


def chain(ran: list[str], *names: str) -> StateGraph[Any, Any, Any, Any]:
    """``START -> names[0] -> ... -> END``; each node notes it ran and logs the amount it saw."""
    builder = StateGraph(Order)
    for name in names:
        def node(state: Order, name: str = name) -> dict[str, Any]:
            ran.append(name)
            return {"log": [f"{name} {state['amount']}"]}
        builder.add_node(name, node)
    for a, b in zip((START, *names), (*names, END), strict=True):
        builder.add_edge(a, b)
    return builder


def suspended(app: cairn.App, run: Any) -> cairn.ApprovalView:
    """Run (or resume) until the run waits for its one open request; that request."""
    with pytest.raises(RunSuspended, match="waiting for a decision"):
        run()
    assert app.get_run("r").status is RunStatus.SUSPENDED
    [request] = [r for r in app.approvals(run_id="r") if r.status is ApprovalStatus.PENDING]
    return request


def test_before_a_node_approved_the_graph_goes_on(app: cairn.App) -> None:
    ran: list[str] = []
    workflow = app.langgraph(chain(ran, "draft", "pay").compile(interrupt_before=["pay"]), name="g")
    request = suspended(app, lambda: app.run(workflow, START_STATE, run_id="r"))
    assert request.action == "LangGraph g: before pay (step 1)"
    assert request.details == {"log": ["draft 0"], "amount": 0}  # the state, pay not run
    assert ran == ["draft"]
    app.approve("r", request.request_id)
    assert app.resume("r") == {"log": ["draft 0", "pay 0"], "amount": 0}
    assert ran == ["draft", "pay"]
    assert len(app.approvals(run_id="r", pending=False)) == 1
    names = [e.name for e in app.history("r") if e.step_kind == "langgraph"]
    assert names == ["step -1 (input)", "step 0 (loop)", "step 1: draft", "step 2: pay"]


def test_an_edit_before_a_node_goes_through_the_reducers_and_the_node_still_runs(app: cairn.App) -> None:
    ran: list[str] = []
    workflow = app.langgraph(chain(ran, "draft", "pay").compile(interrupt_before=["pay"]), name="g")
    request = suspended(app, lambda: app.run(workflow, START_STATE, run_id="r"))
    app.approve("r", request.request_id, edit={"amount": 7, "log": ["edited"]})
    assert app.resume("r") == {"log": ["draft 0", "edited", "pay 7"], "amount": 7}
    assert ran == ["draft", "pay"]
    names = [e.name for e in app.history("r") if e.step_kind == "langgraph"]
    assert names[-2:] == ["step 2 (update)", "step 3: pay"]  # the edit's checkpoint is not asked about


def test_after_a_node_an_edit_is_applied_as_that_node(app: cairn.App) -> None:
    ran: list[str] = []
    compiled = chain(ran, "draft", "check", "pay").compile(interrupt_after=["draft"])
    workflow = app.langgraph(compiled, name="g")
    request = suspended(app, lambda: app.run(workflow, START_STATE, run_id="r"))
    assert request.action == "LangGraph g: after draft (step 1)"
    assert ran == ["draft"]
    app.approve("r", request.request_id, edit={"amount": 3})
    assert app.resume("r") == {"log": ["draft 0", "check 3", "pay 3"], "amount": 3}
    assert ran == ["draft", "check", "pay"]
    [state] = [s for s in CairnSaver(app).list({"configurable": {"thread_id": "lg:r"}})
               if (s.metadata or {}).get("source") == "update"]
    assert state.metadata is not None
    assert state.metadata["step"] == 2


def test_after_the_last_node_an_edit_changes_the_final_state(app: cairn.App) -> None:
    workflow = app.langgraph(chain([], "draft").compile(interrupt_after=["draft"]), name="g")
    request = suspended(app, lambda: app.run(workflow, START_STATE, run_id="r"))
    app.approve("r", request.request_id, edit={"log": ["late"]})
    assert app.resume("r") == {"log": ["draft 0", "late"], "amount": 0}


def test_every_node_with_a_star(app: cairn.App) -> None:
    """``"*"`` before and after: one stop per checkpoint between nodes
    (LangGraph's rule: after one node and before the next is one stop)."""
    ran: list[str] = []
    compiled = chain(ran, "a", "b").compile(interrupt_before="*", interrupt_after="*")
    workflow = app.langgraph(compiled, name="g")
    actions = []
    run: Any = lambda: app.run(workflow, START_STATE, run_id="r")  # noqa: E731
    for _ in range(3):
        request = suspended(app, run)
        actions.append((request.action, list(ran)))
        app.approve("r", request.request_id)
        run = lambda: app.resume("r")  # noqa: E731
    assert run() == {"log": ["a 0", "b 0"], "amount": 0}
    assert actions == [("LangGraph g: before a (step 0)", []),
                       ("LangGraph g: after a; before b (step 1)", ["a"]),
                       ("LangGraph g: after b (step 2)", ["a", "b"])]


def test_a_rejection_fails_the_run_and_the_node_never_runs(app: cairn.App) -> None:
    ran: list[str] = []
    workflow = app.langgraph(chain(ran, "draft", "pay").compile(interrupt_before=["pay"]), name="g")
    request = suspended(app, lambda: app.run(workflow, START_STATE, run_id="r"))
    app.reject("r", request.request_id, comment="no")
    with pytest.raises(RunFailed, match=r"LangGraph g: before pay \(step 1\): rejected"):
        app.resume("r")
    assert ran == ["draft"]
    assert app.get_run("r").status is RunStatus.FAILED


@pytest.mark.parametrize(("edit", "why"), [({"amount": "lots"}, r"'lots' is not of type 'integer'"),
                                           ({"amonut": 3}, r"amonut"), ("everything", r"object"),
                                           # LangGraph's own channels: routing around the node is no edit
                                           ({"branch:to:pay": None}, r"branch:to:pay"),
                                           ({"__interrupt__": []}, r"__interrupt__")])
def test_an_edit_that_is_not_an_update_of_the_state_is_refused(app: cairn.App, edit: Any, why: str) -> None:
    ran: list[str] = []
    workflow = app.langgraph(chain(ran, "draft", "pay").compile(interrupt_before=["pay"]), name="g")
    request = suspended(app, lambda: app.run(workflow, START_STATE, run_id="r"))
    with pytest.raises(InvalidEdit, match=why) as refused:
        app.approve("r", request.request_id, edit=edit)
    assert "\n" not in str(refused.value)
    # nothing decided
    assert [r.status for r in app.approvals(run_id="r", pending=False)] == [ApprovalStatus.PENDING]
    assert ran == ["draft"]


def test_parallel_nodes_are_one_stop(app: cairn.App) -> None:
    ran: list[str] = []
    builder = StateGraph(Order)
    for name in ("left", "right"):
        builder.add_node(name, lambda state, name=name: ran.append(name) or {"log": [name]})
        builder.add_edge(START, name)
        builder.add_edge(name, "join")
    builder.add_node("join", lambda state: ran.append("join") or {"log": ["join"]})
    workflow = app.langgraph(builder.compile(interrupt_before=["left", "right"], interrupt_after=["left"]),
                             name="g")
    request = suspended(app, lambda: app.run(workflow, START_STATE, run_id="r"))
    assert request.action == "LangGraph g: before left, right (step 0)"
    app.approve("r", request.request_id)
    request = suspended(app, lambda: app.resume("r"))
    assert request.action == "LangGraph g: after left (step 1)"
    app.approve("r", request.request_id, edit={"amount": 2})  # as left: join still runs, once
    assert sorted(app.resume("r")["log"]) == ["join", "left", "right"]
    assert sorted(ran) == ["join", "left", "right"]


def test_before_a_subgraph_node(app: cairn.App) -> None:
    """A node that is a compiled subgraph: the stop is before it runs, and
    the subgraph reads the edited state."""
    ran: list[str] = []
    inner = chain(ran, "check", "stamp").compile()
    builder = StateGraph(Order)
    builder.add_node("draft", lambda state: ran.append("draft") or {"log": ["draft"]})
    builder.add_node("audit", inner)
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "audit")
    workflow = app.langgraph(builder.compile(interrupt_before=["audit"]), name="g")
    request = suspended(app, lambda: app.run(workflow, START_STATE, run_id="r"))
    assert request.action == "LangGraph g: before audit (step 1)"
    assert ran == ["draft"]
    app.approve("r", request.request_id, edit={"amount": 4})
    final = app.resume("r")
    assert final["amount"] == 8  # the subgraph returns its whole state: the amount goes through add again
    assert final["log"][-2:] == ["check 4", "stamp 4"]
    assert ran == ["draft", "check", "stamp"]


def test_a_resumed_run_replays_the_decision_and_asks_again_only_what_is_new(app: cairn.App) -> None:
    """The node behind the stop asks a dynamic ``interrupt()``: each
    resume replays the stop's decision from the journal (no second request)
    and the node runs again with the interrupt's answer, as LangGraph does."""
    ran: list[str] = []
    builder = chain(ran, "draft")

    def pay(state: Order) -> dict[str, Any]:
        ran.append("pay")
        return {"log": [f"pay {interrupt('how much?')} of {state['amount']}"]}

    builder.add_node("pay", pay)
    builder.add_edge("draft", "pay")
    workflow = app.langgraph(builder.compile(interrupt_before=["pay"]), name="g")
    stop = suspended(app, lambda: app.run(workflow, START_STATE, run_id="r"))
    app.approve("r", stop.request_id)  # as asked: the checkpoint behind the stop stays the latest
    asked = suspended(app, lambda: app.resume("r"))
    assert asked.action.startswith("LangGraph g: interrupt in pay (")
    app.approve("r", asked.request_id, edit=9)
    assert app.resume("r") == {"log": ["draft 0", "pay 9 of 0"], "amount": 0}
    assert ran == ["draft", "pay", "pay"]
    requested = sorted(r.action for r in app.approvals(run_id="r", pending=False))
    assert len(requested) == 2
    assert requested[0] == "LangGraph g: before pay (step 1)"
    assert app.get_run("r").status is RunStatus.COMPLETED


def test_a_static_interrupt_as_a_signal_wait(app: cairn.App) -> None:
    """``interrupts="signal"``: the stop is published (event ``interrupts``)
    and signal ``resume`` answers it: a map of fields is the edit, a signal
    that is not an update of the state is passed over; no approval."""
    ran: list[str] = []
    workflow = app.langgraph(chain(ran, "draft", "pay").compile(interrupt_before=["pay"]), name="g",
                             interrupts="signal")
    app.start(workflow, START_STATE, run_id="s")
    with driven(app, "s") as final:
        [pending] = published(app, "s")
        assert (pending["node"], pending["before"], pending["value"]) == \
            ("before pay", ["pay"], {"log": ["draft 0"], "amount": 0})
        app.signal("s", RESUME_SIGNAL, {"amount": "lots"})  # not an int: passed over
        published(app, "s", signals=1)
        app.signal("s", RESUME_SIGNAL, {"branch:to:pay": None})  # not a field of the state: passed over
        published(app, "s", signals=2)
        assert ran == ["draft"]
        app.signal("s", RESUME_SIGNAL, {"amount": 6})
        assert final.result(60) == {"log": ["draft 0", "pay 6"], "amount": 6}
    assert app.approvals(run_id="s", pending=False) == []
    assert ran == ["draft", "pay"]


def test_a_signal_of_none_goes_on_unchanged(app: cairn.App) -> None:
    compiled = chain([], "draft").compile(interrupt_after=["draft"])
    workflow = app.langgraph(compiled, name="g", interrupts="signal")
    app.start(workflow, START_STATE, run_id="s")
    with driven(app, "s") as final:
        published(app, "s")
        app.signal("s", RESUME_SIGNAL, None)
        assert final.result(60) == {"log": ["draft 0"], "amount": 0}


class Priced(BaseModel):
    n: int = 0
    note: str = ""


def test_a_pydantic_state_types_the_edit(app: cairn.App) -> None:
    builder = StateGraph(Priced)
    builder.add_node("a", lambda state: {"note": f"a{state.n}"})
    builder.add_node("b", lambda state: {"note": f"{state.note} b{state.n}"})
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    workflow = app.langgraph(builder.compile(interrupt_before=["b"]), name="g")
    request = suspended(app, lambda: app.run(workflow, {"n": 1}, run_id="r"))
    assert request.details == {"n": 1, "note": "a1"}
    with pytest.raises(InvalidEdit, match=r"'x' is not of type 'integer'"):
        app.approve("r", request.request_id, edit={"n": "x"})
    app.approve("r", request.request_id, edit={"n": 5})
    assert app.resume("r") == {"n": 5, "note": "a1 b5"}


def test_messages_are_edited_as_langgraph_reads_them_and_their_fields_are_named(app: cairn.App) -> None:
    """A field Cairn cannot type (LangChain messages): any value, but only
    the state's fields; ``add_messages`` turns the edit's dicts into messages."""
    builder = StateGraph(MessagesState)
    builder.add_node("a", lambda state: {"messages": [AIMessage("hi", id="1")]})
    builder.add_node("b", lambda state: {"messages": [AIMessage(f"{len(state['messages'])} seen", id="3")]})
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    workflow = app.langgraph(builder.compile(interrupt_before=["b"]), name="g")
    request = suspended(app, lambda: app.run(workflow, {"messages": []}, run_id="r"))
    with pytest.raises(InvalidEdit, match=r"mesages"):
        app.approve("r", request.request_id, edit={"mesages": []})
    app.approve("r", request.request_id, edit={"messages": [{"type": "human", "content": "wait", "id": "2"}]})
    final = app.resume("r")
    assert [(m["type"], m["content"]) for m in final["messages"]] == \
        [("ai", "hi"), ("human", "wait"), ("ai", "2 seen")]


def test_async_nodes_stop_too(app: cairn.App) -> None:
    ran: list[str] = []
    builder = StateGraph(Order)

    async def draft(state: Order) -> dict[str, Any]:
        ran.append("draft")
        return {"log": ["draft"]}

    async def pay(state: Order) -> dict[str, Any]:
        ran.append("pay")
        return {"log": [f"pay {state['amount']}"]}

    builder.add_node("draft", draft)
    builder.add_node("pay", pay)
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "pay")
    workflow = app.langgraph(builder.compile(interrupt_before=["pay"]), name="g")
    request = suspended(app, lambda: app.run(workflow, START_STATE, run_id="r"))
    assert ran == ["draft"]
    app.approve("r", request.request_id, edit={"amount": 2})
    assert app.resume("r") == {"log": ["draft", "pay 2"], "amount": 2}


def test_an_edit_before_the_first_node(app: cairn.App) -> None:
    """At step 0 the super-step before ran only ``__start__``: the edit is applied as it."""
    ran: list[str] = []
    workflow = app.langgraph(chain(ran, "a", "b").compile(interrupt_before=["a"]), name="g")
    request = suspended(app, lambda: app.run(workflow, START_STATE, run_id="r"))
    assert request.action == "LangGraph g: before a (step 0)"
    app.approve("r", request.request_id, edit={"amount": 3})
    assert app.resume("r") == {"log": ["a 3", "b 3"], "amount": 3}
    assert ran == ["a", "b"]
