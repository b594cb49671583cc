"""The workflows the server tests run: registered on each test's App."""

from __future__ import annotations

import time
from typing import Any

import msgspec

import cairn
from cairn.models import Message
from cairn.models.scripted import ScriptedModel


class Payment(msgspec.Struct):
    """What the ``payout`` workflow asks to approve: an edit must fit it."""

    to: str
    amount: int


llm = ScriptedModel(lambda request, n: Message(role="assistant", content=f"answer {n}"))


def register(app: cairn.App) -> dict[str, Any]:
    @app.step
    def tick(i: int) -> int:
        time.sleep(0.002)
        return i

    @app.workflow(name="ticker")
    def ticker(ctx: cairn.Context, n: int = 3) -> int:
        total = 0
        for i in range(n):
            total += tick(i)
        return total

    @app.step
    def slow_tick(i: int) -> int:
        time.sleep(0.01)
        return i

    @app.workflow(name="slow_ticker")
    def slow_ticker(ctx: cairn.Context, n: int = 3) -> int:
        return sum(slow_tick(i) for i in range(n))

    @app.workflow(name="echo")
    def echo(ctx: cairn.Context, text: str) -> str:
        return text

    @app.workflow(name="chat")
    def chat(ctx: cairn.Context, question: str) -> str:
        answer = ctx.model(llm, [Message(role="user", content=question)])
        return answer.message.content or ""

    @app.workflow(name="agent")
    def agent(ctx: cairn.Context, turns: int) -> int:
        """A long agent loop that sends a system prompt and its last few
        messages on every call, with a step between calls."""
        system = Message(role="system", content="You are terse. " * 10)
        recent: list[Message] = []
        for turn in range(turns):
            recent = [*recent[-4:], Message(role="user", content=f"question {turn} " * 10)]
            recent.append(ctx.model(llm, [system, *recent]).message)
            tick(turn)
        return turns

    @app.tool(effect="write")
    def send(to: str) -> str:
        raise RuntimeError("the connection dropped after the request was sent")

    @app.workflow(name="payer")
    def payer(ctx: cairn.Context, to: str) -> str:
        return send(to)

    @app.workflow(name="payout")
    def payout(ctx: cairn.Context, to: str, amount: int,
               approvers: list[str] | None = None) -> dict[str, Any]:
        decision = ctx.request_approval("pay", Payment(to, amount), approvers=approvers)
        paid = msgspec.to_builtins(decision.data) if decision.approved else None
        return {"decision": decision.status.value, "paid": paid, "by": decision.decided_by}

    @app.workflow(name="listener")
    def listener(ctx: cairn.Context) -> Any:
        ctx.set_event("stage", "waiting")
        got = ctx.wait_for_signal("go")
        ctx.set_event("stage", {"got": got})
        return got

    return {"ticker": ticker, "slow_ticker": slow_ticker, "echo": echo, "chat": chat, "payer": payer,
            "payout": payout, "listener": listener, "agent": agent}


def drain(app: cairn.App, seconds: float = 10.0) -> None:
    """Run a worker until nothing is left to do (bounded)."""
    app.worker(concurrency=2, poll_interval=0.01).run(install_signals=False, max_idle=0.3)
    del seconds
