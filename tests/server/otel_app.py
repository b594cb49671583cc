"""An app for the OpenTelemetry test: its worker process SIGKILLs itself in
the middle of a run when CAIRN_TEST_DIE_AT names the step to die in."""

from __future__ import annotations

import os
import signal

import cairn
from cairn.models import Message
from cairn.models.scripted import ScriptedModel

app = cairn.App(lease_seconds=1.0)
llm = ScriptedModel(lambda request, n: Message(role="assistant", content=f"plan {n}"))


@app.step
def work(i: int) -> int:
    if os.environ.get("CAIRN_TEST_DIE_AT") == str(i):
        os.kill(os.getpid(), signal.SIGKILL)
    return i


@app.tool(effect="idempotent")
def notify(op: cairn.Operation, who: str) -> str:
    return f"{who}:{op.operation_id}"


@app.workflow(name="traced")
def traced(ctx: cairn.Context, n: int) -> int:
    ctx.model(llm, [Message(role="user", content="plan the work")])
    total = sum(work(i) for i in range(n))
    notify("ops")
    return total
