"""LangGraph ``interrupt()`` as a Cairn approval (both backends): the run
suspends with the interrupt's value as the request's details and holds no
worker; the decision resumes the graph with ``Command(resume=answer)`` (the
edit, or the value as asked when approved as is); a rejection fails the run.
The node that asked runs again from its start on resume, as LangGraph does,
and a tool it called before asking is replayed, not paid twice."""

from __future__ import annotations

import concurrent.futures
import contextlib
import operator
import threading
import time
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

import cairn
from cairn.errors import InvalidArgument, RunFailed, RunSuspended
from cairn.lgdurable import INTERRUPTS_EVENT, RESUME_SIGNAL
from cairn.store.records import RunStatus


class Order(TypedDict):
    log: Annotated[list[str], operator.add]


def order_graph(app: cairn.App, paid: list[str], ran: list[str]) -> Any:
    @app.tool(effect="write")
    def pay(what: str) -> str:
        paid.append(what)
        return f"paid {what}"

    def draft(state: Order) -> dict[str, Any]:
        ran.append("draft")
        return {"log": ["drafted"]}

    def confirm(state: Order) -> dict[str, Any]:
        ran.append("confirm")
        deposit = pay("deposit")  # before the interrupt: replayed when the node runs again
        answer = interrupt({"question": "how much?", "default": 10})
        return {"log": [deposit, pay(f"balance {answer}")]}

    builder = StateGraph(Order)
    builder.add_node("draft", draft)
    builder.add_node("confirm", confirm)
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "confirm")
    builder.add_edge("confirm", END)
    return builder.compile()


def waiting(app: cairn.App, workflow: cairn.Workflow[Any], run_id: str) -> cairn.ApprovalView:
    with pytest.raises(RunSuspended, match="waiting for a decision"):
        app.run(workflow, {"log": []}, run_id=run_id)
    assert app.get_run(run_id).status is RunStatus.SUSPENDED
    [request] = app.approvals(run_id=run_id)
    return request


def test_an_edit_is_the_answer_and_the_tool_before_the_interrupt_runs_once(app: cairn.App) -> None:
    paid: list[str] = []
    ran: list[str] = []
    workflow = app.langgraph(order_graph(app, paid, ran), name="order")
    request = waiting(app, workflow, "o")
    assert request.action.startswith("LangGraph order: interrupt in confirm (")
    assert request.details == {"question": "how much?", "default": 10}
    assert paid == ["deposit"]
    app.approve("o", request.request_id, edit=42)
    assert app.resume("o") == {"log": ["drafted", "paid deposit", "paid balance 42"]}
    assert paid == ["deposit", "balance 42"]  # the deposit was replayed from the journal
    assert ran == ["draft", "confirm", "confirm"]  # LangGraph runs the asking node again; draft never


def test_approved_as_asked_resumes_with_the_interrupt_value(app: cairn.App) -> None:
    paid: list[str] = []
    workflow = app.langgraph(order_graph(app, paid, []), name="order")
    request = waiting(app, workflow, "o")
    app.approve("o", request.request_id)
    final = app.resume("o")
    assert final["log"][-1] == "paid balance {'question': 'how much?', 'default': 10}"


def test_a_rejection_fails_the_run_and_the_graph_is_not_resumed(app: cairn.App) -> None:
    paid: list[str] = []
    ran: list[str] = []
    workflow = app.langgraph(order_graph(app, paid, ran), name="order")
    request = waiting(app, workflow, "o")
    app.reject("o", request.request_id, comment="no")
    with pytest.raises(RunFailed, match=r"LangGraph order: interrupt in confirm \(\w+\): rejected"):
        app.resume("o")
    assert paid == ["deposit"]
    assert ran == ["draft", "confirm"]


def test_the_journal_names_the_super_steps_and_their_nodes(app: cairn.App) -> None:
    workflow = app.langgraph(order_graph(app, [], []), name="order")
    request = waiting(app, workflow, "o")
    app.approve("o", request.request_id, edit=1)
    app.resume("o")
    names = [e.name for e in app.history("o") if e.step_kind == "langgraph"]
    assert names == ["step -1 (input)", "step 0 (loop)", "step 1: draft", "step 2: confirm"]


def test_a_waiting_run_holds_no_worker(app: cairn.App) -> None:
    """One worker with one slot: while the first run waits for its decision,
    a second run is claimed and finishes on that slot, and the worker then
    goes idle (and stops: ``max_idle``) with the first run still waiting."""
    workflow = app.langgraph(order_graph(app, [], []), name="order")
    builder = StateGraph(Order)
    builder.add_node("hello", lambda state: {"log": ["hello"]})
    builder.add_edge(START, "hello")
    quick = app.langgraph(builder.compile(), name="quick")

    def serve() -> threading.Thread:
        worker = app.worker(concurrency=1, poll_interval=0.02)
        thread = threading.Thread(target=lambda: worker.run(install_signals=False, max_idle=1.0), daemon=True)
        thread.start()
        return thread

    app.start(workflow, {"log": []}, run_id="o")
    first = serve()
    deadline = time.monotonic() + 60
    while not app.approvals(run_id="o") and time.monotonic() < deadline:
        time.sleep(0.02)
    [request] = app.approvals(run_id="o")
    assert app.start(quick, {"log": []}, run_id="q").result(timeout=60) == {"log": ["hello"]}
    first.join(60)
    assert not first.is_alive()  # idle: the waiting run holds none of its slots
    assert app.get_run("o").status is RunStatus.SUSPENDED
    app.approve("o", request.request_id, edit=5)
    second = serve()
    assert app.handle("o").result(timeout=60)["log"][-1] == "paid balance 5"
    second.join(60)


def two_askers(app: cairn.App, name: str, interrupts: str = "approval") -> cairn.Workflow[Any]:
    """``left`` and ``right`` run in one super-step and each interrupts."""
    builder = StateGraph(Order)
    for node in ("left", "right"):
        def ask(state: Order, node: str = node) -> dict[str, Any]:
            return {"log": [f"{node} {interrupt(f'{node}?')}"]}
        builder.add_node(node, ask)
        builder.add_edge(START, node)
    return app.langgraph(builder.compile(), name=name, interrupts=interrupts)


def test_parallel_interrupts_are_asked_together(app: cairn.App) -> None:
    """Two tasks of one super-step interrupt: both approval requests are
    open at the first suspension (decided in any order), and the graph
    resumes once with every answer (``Command(resume={interrupt id: answer})``)."""
    workflow = two_askers(app, "both")
    with pytest.raises(RunSuspended, match="waiting for a decision") as suspended:
        app.run(workflow, {"log": []}, run_id="b")
    requests = app.approvals(run_id="b")
    assert sorted(r.details for r in requests) == ["left?", "right?"]
    [last] = [r for r in requests if r.request_id in str(suspended.value)]  # the one the run waits on
    [first] = [r for r in requests if r is not last]  # decided first
    app.approve("b", first.request_id, edit=f"{first.details} yes")
    with pytest.raises(RunSuspended, match="waiting for a decision"):
        app.resume("b")  # the earlier request is still open: the run waits for it
    app.approve("b", last.request_id, edit=f"{last.details} yes")
    assert sorted(app.resume("b")["log"]) == ["left left? yes", "right right? yes"]


@contextlib.contextmanager
def driven(app: cairn.App, run_id: str) -> Iterator[concurrent.futures.Future[Any]]:
    """``app.resume(run_id)`` in a daemon thread (it waits for the run's
    signals); cancelled if the test fails first, so nothing is left waiting."""
    final: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def drive() -> None:
        try:
            final.set_result(app.resume(run_id))
        except BaseException as exc:
            final.set_exception(exc)

    threading.Thread(target=drive, daemon=True).start()
    try:
        yield final
    finally:
        if not final.done():
            app.cancel(run_id)
            with contextlib.suppress(Exception):
                final.result(30)


def published(app: cairn.App, run_id: str, signals: int = 0) -> Any:
    """The pending interrupts run ``run_id`` published, once it waits for its
    signal having consumed ``signals`` signals before (its journal says so)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        taken = sum(1 for e in app.history(run_id) if e.step_kind == "signal"
                    and e.event.value == "step.completed")
        if taken == signals and app.get_run(run_id).status is RunStatus.SUSPENDED:
            return app.get_event(run_id, INTERRUPTS_EVENT)
        time.sleep(0.02)
    raise AssertionError(f"run {run_id} never waited for its signal: {app.get_run(run_id).status}")


def test_an_interrupt_as_a_signal_wait(app: cairn.App) -> None:
    """``interrupts="signal"``: the pending interrupt is published (event
    ``interrupts``) and signal ``resume`` answers it; a tool the node called
    before asking is replayed, not paid twice; no approval is requested."""
    paid: list[str] = []
    workflow = app.langgraph(order_graph(app, paid, []), name="order", interrupts="signal")
    app.start(workflow, {"log": []}, run_id="s")
    with driven(app, "s") as final:
        [pending] = published(app, "s")
        assert (pending["node"], pending["value"]) == ("confirm", {"question": "how much?", "default": 10})
        assert app.approvals(run_id="s") == []
        app.signal("s", RESUME_SIGNAL, 7)
        assert final.result(60) == {"log": ["drafted", "paid deposit", "paid balance 7"]}
    assert paid == ["deposit", "balance 7"]


def test_parallel_interrupts_answered_by_one_signal_naming_each(app: cairn.App) -> None:
    """Several interrupts: one signal whose data maps each interrupt id to
    its answer; a signal that does not name them all is passed over."""
    workflow = two_askers(app, "both", interrupts="signal")
    app.start(workflow, {"log": []}, run_id="b")
    with driven(app, "b") as final:
        ids = {p["value"]: p["id"] for p in published(app, "b")}
        assert sorted(ids) == ["left?", "right?"]
        app.signal("b", RESUME_SIGNAL, {ids["left?"]: "only left"})  # not every interrupt: passed over
        published(app, "b", signals=1)  # consumed, and the run waits again
        app.signal("b", RESUME_SIGNAL, {ids["left?"]: "L", ids["right?"]: "R"})
        assert sorted(final.result(60)["log"]) == ["left L", "right R"]


def test_an_unknown_interrupt_mode_is_refused(app: cairn.App) -> None:
    builder = StateGraph(Order)
    builder.add_node("n", lambda state: {"log": ["n"]})
    builder.add_edge(START, "n")
    with pytest.raises(InvalidArgument, match=r"interrupts= is 'approval' or 'signal', not 'email'"):
        app.langgraph(builder.compile(), name="n", interrupts="email")
