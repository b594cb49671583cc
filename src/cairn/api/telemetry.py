"""OpenTelemetry spans of runs, derived from their journals (``otel`` extra).

Why from the journal, not from live instrumentation: the journal already
holds every fact a span needs (when a step started and ended, on which
worker, its attempt, a model call's model, tokens, cost and latency, a tool
call's effect class and operation id), durably, whatever crashed in between.
A span opened in a worker's memory dies with the worker; a span written from
the journal cannot be lost, and one trace per run across kills and takeovers
comes by construction: the trace id is derived from the id of the run tree's
root (a child run's spans join its parent's trace), never carried in a
process's memory, so a run taken over by another worker after a SIGKILL
continues the very same trace. The cost is latency: a run's spans are
exported when it ends (``RunTracer.on_outcome`` as a worker's
``on_outcome``), or on demand (``RunTracer.export``).

Attributes follow the GenAI semantic conventions where they apply:
``gen_ai.operation.name`` (``chat`` for model calls, ``execute_tool`` for
tools), ``gen_ai.request.model`` / ``gen_ai.response.model``,
``gen_ai.usage.input_tokens`` / ``gen_ai.usage.output_tokens``,
``gen_ai.tool.name``; Cairn's own under ``cairn.*`` (run id, tenant,
workflow, status, position, attempt, worker, effect, operation id, cost).
Takeovers and lease changes are events on the run's span.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import TYPE_CHECKING, Any

from cairn.errors import MissingExtra
from cairn.store.records import EventType, HistoryEvent, RunRecord, RunStatus

if TYPE_CHECKING:
    from cairn.api.app import App
    from cairn.engine.executor import Outcome
    from cairn.store.records import Claim

try:
    from opentelemetry import trace
    from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
except ImportError:  # pragma: no cover - the otel extra is not installed
    trace = None  # type: ignore[assignment]

_NS = 1_000_000_000
_LIFECYCLE_EVENTS = {EventType.LEASE_CLAIMED, EventType.LEASE_LOST, EventType.LEASE_TAKEN_OVER,
                     EventType.RUN_SUSPENDED, EventType.RUN_WOKEN, EventType.RUN_RELEASED,
                     EventType.RUN_RETRIED, EventType.RUN_REWOUND, EventType.RUN_KILLED,
                     EventType.RUN_REVIVED, EventType.RUN_NEEDS_ATTENTION, EventType.RUN_CANCELLED}


def trace_id_of(run_id: str) -> int:
    """The 128-bit trace id of a run tree, from its root run's id (never 0)."""
    try:
        value = uuid.UUID(run_id).int
    except ValueError:
        value = int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:16], "big")
    return value or 1


def span_id_of(*parts: object) -> int:
    """A span id derived from ``parts`` (never 0): the same in every process."""
    raw = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()[:8]
    return int.from_bytes(raw, "big") or 1


def _ns(ts: float) -> int:
    return int(ts * _NS)


class RunTracer:
    """Writes the spans of runs of ``app`` through an OpenTelemetry tracer
    provider (the global one by default)."""

    def __init__(self, app: App, tracer_provider: Any = None) -> None:
        if trace is None:
            raise MissingExtra("OpenTelemetry spans", "otel")
        self.app = app
        self.tracer = trace.get_tracer("cairn", tracer_provider=tracer_provider)

    def root_of(self, record: RunRecord) -> str:
        seen = {record.run_id}
        while record.parent_run_id is not None and record.parent_run_id not in seen:
            parent = self.app.store.get_run(record.parent_run_id)
            if parent is None:
                break
            seen.add(parent.run_id)
            record = parent
        return record.run_id

    def on_outcome(self, claim: Claim, outcome: Outcome) -> None:
        """A worker's ``on_outcome``: export a run's spans once it ended."""
        record = self.app.store.get_run(claim.run.run_id)
        if record is not None and record.status.terminal:
            self.export(record.run_id)

    def export(self, run_id: str) -> int:
        """Write the spans of ``run_id`` (its run span, a span per journaled
        call); returns how many. Spans carry the journal's times."""
        record = self.app.get_run(run_id)
        history = self.app.history(run_id)
        root = self.root_of(record)
        trace_id = trace_id_of(root)
        if record.parent_run_id is not None:  # a child's run span sits under its parent's
            parent_id = span_id_of(record.parent_run_id, "run")
        else:  # a root run's span hangs from a fixed anchor, so its trace id is the derived one
            parent_id = span_id_of(root, "trace")
        anchor = trace.NonRecordingSpan(SpanContext(trace_id, parent_id, is_remote=True,
                                                    trace_flags=TraceFlags(TraceFlags.SAMPLED)))
        context = trace.set_span_in_context(anchor)
        last = history[-1].at if history else record.created_at
        end = record.updated_at if record.status.terminal else last
        run_span = self.tracer.start_span(
            f"run {record.workflow}", context=context, kind=SpanKind.INTERNAL,
            start_time=_ns(record.created_at),
            attributes={"cairn.run_id": record.run_id, "cairn.workflow": record.workflow,
                        "cairn.workflow_version": record.workflow_version, "cairn.tenant": record.tenant,
                        "cairn.status": record.status.value, "cairn.queue": record.queue,
                        "cairn.recoveries": record.recoveries,
                        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": record.workflow})
        count = 1
        effects = {e.position: (e.detail or {}) for e in history
                   if e.event is EventType.OP_INTENT and e.position is not None}
        inside = trace.set_span_in_context(run_span)
        for event in history:
            if event.event in _LIFECYCLE_EVENTS:
                where: dict[str, Any] = {"cairn.worker": event.worker or "", "cairn.epoch": event.epoch}
                run_span.add_event(event.event.value, timestamp=_ns(event.at), attributes=where)
            ended = event.event in (EventType.STEP_COMPLETED, EventType.STEP_FAILED)
            if ended and event.position is not None:
                self._call_span(event, effects.get(event.position, {}), inside)
                count += 1
        if record.status in (RunStatus.FAILED, RunStatus.HALTED, RunStatus.QUARANTINED):
            message = str((record.error or {}).get("message", record.status.value))
            run_span.set_status(Status(StatusCode.ERROR, message))
        run_span.end(end_time=_ns(max(end, record.created_at)))
        return count

    def _call_span(self, event: HistoryEvent, intent: dict[str, Any], context: Any) -> None:
        name, attributes = call_attributes(event, intent)
        started = event.started_at if event.started_at is not None else event.at
        span = self.tracer.start_span(name, context=context, start_time=_ns(started), attributes=attributes)
        if event.event is EventType.STEP_FAILED:
            span.set_status(Status(StatusCode.ERROR, error_message(event)))
        span.end(end_time=_ns(max(event.at, started)))


def error_message(event: HistoryEvent) -> str:
    """The message of a failed attempt's recorded error."""
    detail = event.detail or {}
    error = detail.get("error") if isinstance(detail.get("error"), dict) else {}
    return str((error or {}).get("message", "failed"))


def call_attributes(event: HistoryEvent, intent: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The span name and attributes of a journaled call's entry (``intent``:
    the detail of its tool's ``op.intent``, if any), GenAI conventions first.
    The journal's export and the live spans share it, so both say the same."""
    detail = event.detail or {}
    kind = event.step_kind or "step"
    attributes: dict[str, Any] = {"cairn.position": event.position, "cairn.kind": kind,
                                  "cairn.attempt": event.attempt or 1, "cairn.worker": event.worker or "",
                                  "cairn.epoch": event.epoch}
    if kind == "model":
        usage = detail.get("usage") or {}
        model = str(detail.get("model") or event.name or "")
        name = f"chat {model}"
        attributes.update({"gen_ai.operation.name": "chat", "gen_ai.request.model": model,
                           "gen_ai.response.model": model,
                           "gen_ai.usage.input_tokens": int(usage.get("prompt_tokens") or 0),
                           "gen_ai.usage.output_tokens": int(usage.get("completion_tokens") or 0)})
        if detail.get("cost") is not None:
            attributes["cairn.cost"] = float(detail["cost"])
        if detail.get("latency_ms") is not None:
            attributes["cairn.latency_ms"] = float(detail["latency_ms"])
    elif kind == "tool":
        name = f"execute_tool {event.name}"
        attributes.update({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": event.name or ""})
        operation = detail.get("operation_id") or intent.get("operation_id")
        if operation:
            attributes["cairn.operation_id"] = str(operation)
        attributes["cairn.effect"] = str(intent.get("effect") or detail.get("effect") or "read")
        if detail.get("reconciled"):
            attributes["cairn.reconciled"] = str(detail["reconciled"])
    else:
        name = f"{kind} {event.name}"
    return name, attributes
