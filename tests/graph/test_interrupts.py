"""Interrupts before and after a node, through the existing approvals: the
run waits suspended (no worker held) with the state as the request's
details; an edit changes the state (and the next checkpoint records it), a
rejection fails the run; nodes that completed before the wait never run again."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

import pytest

import cairn
from cairn.errors import RunFailed, RunSuspended
from cairn.store.records import RunStatus


class Mail(TypedDict):
    messages: Annotated[list[str], cairn.append]
    n: int


def mail_graph(ran: list[str], *, before: bool = False, after: bool = False) -> cairn.Graph:
    g = cairn.Graph(Mail)

    def draft(state: Mail) -> dict[str, Any]:
        ran.append("draft")
        return {"messages": ["draft"], "n": state["n"] + 1}

    def send(state: Mail) -> dict[str, Any]:
        ran.append("send")
        return {"messages": [f"sent n={state['n']} last={state['messages'][-1]}"]}

    g.node(draft, interrupt_after=after)
    g.node(send, interrupt_before=before)
    g.edge(cairn.START, "draft")
    g.edge("draft", "send")
    g.edge("send", cairn.END)
    return g


def waiting(app: cairn.App, workflow: cairn.Workflow[Any], run_id: str) -> cairn.ApprovalView:
    with pytest.raises(RunSuspended, match="waiting for a decision"):
        app.run(workflow, {"messages": [], "n": 0}, run_id=run_id)
    assert app.get_run(run_id).status is RunStatus.SUSPENDED
    [request] = app.approvals(run_id=run_id)
    return request


@pytest.mark.parametrize("where", ["before", "after"])
def test_an_edit_at_an_interrupt_changes_the_state(app: cairn.App, where: str) -> None:
    ran: list[str] = []
    workflow = app.graph("mail", mail_graph(ran, before=where == "before", after=where == "after"))
    request = waiting(app, workflow, "m")
    assert request.action == f"graph mail: {where} {'send' if where == 'before' else 'draft'}"
    assert request.details == {"messages": ["draft"], "n": 1}
    assert ran == ["draft"]
    app.approve("m", request.request_id, edit={"messages": ["edited"], "n": 41})
    final = app.resume("m")
    assert final == {"messages": ["edited", "sent n=41 last=edited"], "n": 41}
    assert ran == ["draft", "send"]  # draft's super-step committed before the wait: not run again
    assert app.graph_state("m", 1) == {"messages": ["draft"], "n": 1}
    assert app.graph_state("m") == final


def test_approved_as_requested_goes_on_unchanged(app: cairn.App) -> None:
    ran: list[str] = []
    workflow = app.graph("mail", mail_graph(ran, before=True))
    request = waiting(app, workflow, "m")
    app.approve("m", request.request_id)
    assert app.resume("m") == {"messages": ["draft", "sent n=1 last=draft"], "n": 1}


def test_a_rejection_fails_the_run_and_the_node_never_runs(app: cairn.App) -> None:
    ran: list[str] = []
    workflow = app.graph("mail", mail_graph(ran, before=True))
    request = waiting(app, workflow, "m")
    app.reject("m", request.request_id, comment="no")
    with pytest.raises(RunFailed, match="graph mail: before send: the approval was rejected"):
        app.resume("m")
    assert ran == ["draft"]
    assert [c.step for c in app.checkpoints("m")] == [1, 0]


def test_an_edit_after_the_last_super_step_is_checkpointed(app: cairn.App) -> None:
    g = cairn.Graph(Mail)
    g.node(lambda state: {"n": 1}, name="only", interrupt_after=True)
    g.edge(cairn.START, "only")
    g.edge("only", cairn.END)
    workflow = app.graph("last", g)
    request = waiting(app, workflow, "l")
    app.approve("l", request.request_id, edit={"messages": ["x"], "n": 7})
    assert app.resume("l") == {"messages": ["x"], "n": 7}
    assert [(c.step, c.nodes) for c in app.checkpoints("l")] == [(2, ()), (1, ("only",)), (0, ())]


def test_the_readers_see_what_was_committed_since_their_last_read(app: cairn.App) -> None:
    """``app.checkpoints`` and ``app.graph_state`` read a run's history
    incrementally: what a run commits after a read shows in the next one."""
    ran: list[str] = []
    workflow = app.graph("mail", mail_graph(ran, before=True))
    request = waiting(app, workflow, "m")
    assert [c.step for c in app.checkpoints("m")] == [1, 0]
    assert app.graph_state("m") == {"messages": ["draft"], "n": 1}
    app.approve("m", request.request_id)
    app.resume("m")
    assert [c.step for c in app.checkpoints("m")] == [2, 1, 0]
    assert app.graph_state("m") == {"messages": ["draft", "sent n=1 last=draft"], "n": 1}


def test_an_interrupt_from_inside_a_node_uses_the_decision(app: cairn.App) -> None:
    """A node may ask itself (``ctx.request_approval``): the run suspends in
    its super-step, which runs again once decided, the decision replayed."""
    asked: list[int] = []
    g = cairn.Graph(Mail)

    def propose(state: Mail, ctx: cairn.Context) -> dict[str, Any]:
        asked.append(state["n"])
        decision = ctx.request_approval("send the draft", {"text": "hello"})
        return {"messages": [str((decision.data or {}).get("text"))], "n": state["n"] + 1}

    g.node(propose)
    g.edge(cairn.START, "propose")
    g.edge("propose", cairn.END)
    request = waiting(app, app.graph("inside", g), "i")
    assert request.action == "send the draft"
    app.approve("i", request.request_id, edit={"text": "hello, edited"})
    assert app.resume("i") == {"messages": ["hello, edited"], "n": 1}
    assert asked == [0, 0]  # the super-step that waited ran again; the decision came from the journal


@pytest.mark.parametrize(("edit", "says"), [
    ({"messages": ["ok"], "n": "forty-one"}, "n"),
    ({"messages": "not a list", "n": 1}, "messages"),
    ({"messages": [None], "n": 1}, "messages"),
    ({"messages": ["ok"], "n": 1, "subject": "hi"}, "subject"),
], ids=["wrong-type", "not-a-list", "bad-item", "unknown-field"])
def test_an_edit_that_does_not_fit_the_state_is_refused_and_nothing_changes(
        app: cairn.App, edit: dict[str, Any], says: str) -> None:
    """A hostile edit at an interrupt is one line naming the field; the
    approval stays pending, no checkpoint is written, the run still waits,
    and a good edit afterwards goes through."""
    ran: list[str] = []
    workflow = app.graph("mail", mail_graph(ran, before=True))
    request = waiting(app, workflow, "h")
    before = [c.step for c in app.checkpoints("h")]
    with pytest.raises(cairn.InvalidEdit) as raised:
        app.approve("h", request.request_id, edit=edit)
    message = str(raised.value)
    assert "\n" not in message
    assert says in message, message
    [still] = app.approvals(run_id="h")
    assert still.request_id == request.request_id
    assert [c.step for c in app.checkpoints("h")] == before
    assert app.get_run("h").status is RunStatus.SUSPENDED
    app.approve("h", request.request_id, edit={"messages": ["<b>mine</b>"], "n": 5})
    assert app.resume("h") == {"messages": ["<b>mine</b>", "sent n=5 last=<b>mine</b>"], "n": 5}
    assert ran == ["draft", "send"]
