"""An app for the OpenTelemetry tests: its worker process SIGKILLs itself in
the middle of a run when CAIRN_TEST_DIE_AT names the step to die in, each
step sleeps CAIRN_TEST_STEP_SLEEP seconds (so a test can kill it at a random
point), and with CAIRN_TEST_SPANS set the process emits live spans
(``cairn.api.instrumentation``) as JSON lines into that file: the SDK's
in-memory exporter dies with a killed worker, a flushed file does not."""

from __future__ import annotations

import os
import signal
import time

import cairn
from cairn.models import Message
from cairn.models.scripted import ScriptedModel

app = cairn.App(lease_seconds=1.0)
llm = ScriptedModel(lambda request, n: Message(role="assistant", content=f"plan {n}"))

if os.environ.get("CAIRN_TEST_SPANS"):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    from cairn.api.instrumentation import instrument

    _out = open(os.environ["CAIRN_TEST_SPANS"], "a", encoding="utf-8")  # noqa: SIM115 - lives with the process
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(
        out=_out, formatter=lambda span: span.to_json(indent=None) + "\n")))
    instrument(app, tracer_provider=provider)


@app.step
def work(i: int) -> int:
    if os.environ.get("CAIRN_TEST_DIE_AT") == str(i):
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(float(os.environ.get("CAIRN_TEST_STEP_SLEEP") or 0))
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
