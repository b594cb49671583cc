"""Live spans and metrics of the runs a process executes (``otel`` extra).

``instrument(app)`` sets a ``Telemetry`` as the app's observer
(``engine.observe``): from then on every claim a worker (or ``app.run``) of
this process executes is a span, each journaled call a span under it,
emitted the moment the call's entry is committed, and the metrics below are
recorded, all through the OpenTelemetry API. Which SDK, exporters and
readers receive them is the application's choice (OTLP, Prometheus, the
in-memory ones in tests); without an SDK the API's no-op providers make it
nearly free, and without ``instrument`` nothing at all runs.

**One trace per run, across workers and restarts.** A claim's span hangs
from a remote parent derived from the run, never from a process's memory:
trace id ``trace_id_of(root run id)``, span id ``span_id_of(run_id, "run")``.
Every worker that ever executes the run, the one that took it over after a
SIGKILL included, derives the same context, so its spans join the same
trace (and ``RunTracer``'s spans from the journal share the trace id). A
span is exported when it ends: the claim span of a worker that is killed
mid-claim is lost with it, the calls it finished before dying were
exported already.

Metrics (instrument names; attributes under ``cairn.*``):

- ``cairn.step.duration`` (s): each journaled call's attempt, by workflow,
  kind (step, tool, model, ...) and outcome (completed, failed, retried);
- ``cairn.claim.latency`` (s): how long a due run waited for a worker (new,
  released, retried runs and timers; not runs woken by a signal or a child,
  nor takeovers, whose due time no entry records);
- ``cairn.takeovers``, ``cairn.reconciliations`` (by outcome), ``cairn.claims``
  (by how the claim ended), ``cairn.runs.ended`` (by final status);
- ``cairn.budget.spend`` (USD) by tenant, workflow and model, and the GenAI
  conventions' ``gen_ai.client.token.usage`` and
  ``gen_ai.client.operation.duration``.

Runs by status and queue depth are the store's, not a process's: see
``cairn.api.store_metrics``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cairn.api.telemetry import call_attributes, error_message, span_id_of, trace_id_of
from cairn.engine.observe import Ending, Observed
from cairn.errors import MissingExtra
from cairn.store.records import EventType, HistoryEvent

if TYPE_CHECKING:
    from cairn.api.app import App

try:
    from opentelemetry import metrics, trace
    from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
except ImportError:  # pragma: no cover - the otel extra is not installed
    trace = None  # type: ignore[assignment]

log = logging.getLogger("cairn.telemetry")

_NS = 1_000_000_000
_CALL_ENDS = {EventType.STEP_COMPLETED: "completed", EventType.STEP_FAILED: "failed",
              EventType.STEP_RETRIED: "retried"}
#: a claim's entries besides ``lease.claimed`` / ``lease.taken_over`` itself
_CLAIM_ENTRIES = {EventType.LEASE_LOST, EventType.RUN_STARTED, EventType.RUN_WOKEN}
#: entries after which a run is due at once (their ``at``)
_DUE_AT_ONCE = {EventType.RUN_CREATED, EventType.RUN_RELEASED, EventType.RUN_RETRIED, EventType.RUN_REVIVED,
                EventType.RUN_REWOUND, EventType.RUN_BUDGET_CHANGED}
_ENDED_RUN = {"completed", "failed", "halted"}
_FAILED_CLAIM = {"failed", "halted", "lost", "abandoned", "incompatible"}
#: how many run ids' roots are remembered (child runs look their parents up once)
_ROOTS = 10_000


def instrument(app: App, tracer_provider: Any = None, meter_provider: Any = None) -> Telemetry:
    """Emit live spans and metrics for the runs this process executes with
    ``app`` (its workers and ``app.run``), through the given providers (the
    global ones by default). Returns the observer; ``uninstrument`` undoes it."""
    telemetry = Telemetry(tracer_provider, meter_provider)
    app.runtime.observer = telemetry
    return telemetry


def uninstrument(app: App) -> None:
    app.runtime.observer = None


def export_otlp(app: App, *, service_name: str = "cairn") -> Callable[[], None]:
    """``instrument(app)`` with the SDK exporting over OTLP/HTTP (the
    ``otel-export`` extra): spans in batches, metrics every 60 s (the SDK's
    ``OTEL_METRIC_EXPORT_INTERVAL``), both where the standard
    ``OTEL_EXPORTER_OTLP_*`` variables say (``http://localhost:4318`` by
    default); ``OTEL_SERVICE_NAME`` overrides ``service_name``. Returns the
    function that flushes and stops them (``cairn worker --otel`` calls it
    once the worker drained). The store's gauges are not added: one process
    should report those (``cairn serve --metrics``), not every worker."""
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise MissingExtra("OTLP export", "otel-export") from None
    named = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": service_name}
    resource = Resource.create(named)
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    meter_provider = MeterProvider(resource=resource,
                                   metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())])
    instrument(app, tracer_provider, meter_provider)

    def shutdown() -> None:
        uninstrument(app)
        tracer_provider.shutdown()
        meter_provider.shutdown()

    return shutdown


def due_since(history: list[HistoryEvent], claim_index: int) -> float | None:
    """When the run claimed by ``history[claim_index]`` became due, if an
    entry says so: the entry before the claim (a new, released or retried
    run: its time; a timer or a step's retry: the time it was set for)."""
    index = claim_index - 1
    while index >= 0 and history[index].event is EventType.LEASE_LOST:
        index -= 1
    if index < 0:
        return None
    before = history[index]
    detail = before.detail or {}
    if before.event in _DUE_AT_ONCE:
        return before.at
    if before.event is EventType.STEP_RETRIED and detail.get("next_at") is not None:
        return float(detail["next_at"])
    if before.event is EventType.RUN_SUSPENDED and detail.get("wake_at") is not None \
            and not detail.get("waiting_on") and not detail.get("waiting_for"):
        return max(before.at, float(detail["wake_at"]))
    return None


class _Claimed:
    """What the observer keeps of one claim while it executes."""

    __slots__ = ("attributes", "context", "span")

    def __init__(self, span: Any, context: Any, attributes: dict[str, Any]) -> None:
        self.span = span
        self.context = context
        self.attributes = attributes


class Telemetry:
    """The ``engine.observe.Observer`` that speaks OpenTelemetry."""

    def __init__(self, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        if trace is None:
            raise MissingExtra("OpenTelemetry instrumentation", "otel")
        self.tracer = trace.get_tracer("cairn", tracer_provider=tracer_provider)
        meter = metrics.get_meter("cairn", meter_provider=meter_provider)
        self.step_duration = meter.create_histogram(
            "cairn.step.duration", unit="s", description="Duration of each journaled call's attempt")
        self.claim_latency = meter.create_histogram(
            "cairn.claim.latency", unit="s", description="How long a due run waited to be claimed")
        self.takeovers = meter.create_counter(
            "cairn.takeovers", unit="{takeover}",
            description="Runs taken over from a worker whose lease expired")
        self.reconciliations = meter.create_counter(
            "cairn.reconciliations", unit="{reconciliation}",
            description="Uncertain write effects asked of the outside world, by answer")
        self.claims = meter.create_counter(
            "cairn.claims", unit="{claim}", description="Claims executed, by how they ended")
        self.runs_ended = meter.create_counter(
            "cairn.runs.ended", unit="{run}", description="Runs that ended on this process, by final status")
        self.spend = meter.create_counter(
            "cairn.budget.spend", unit="USD", description="Cost of the model calls recorded")
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}", description="Tokens of each model call")
        self.model_duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s", description="Duration of each model call")
        self._roots: dict[str, str] = {}
        self._lock = threading.Lock()

    # -- the observer ------------------------------------------------------------

    def claimed(self, execution: Observed) -> None:
        run = execution.run
        history = execution.claim.history
        claim_index = _claim_index(history, run.epoch)
        claimed_at = history[claim_index].at if claim_index is not None else time.time()
        takeover = claim_index is not None and history[claim_index].event is EventType.LEASE_TAKEN_OVER
        base = {"cairn.workflow": run.workflow, "cairn.tenant": run.tenant, "cairn.queue": run.queue}
        if takeover:
            self.takeovers.add(1, base)
        elif claim_index is not None:
            due = due_since(history, claim_index)
            if due is not None:
                self.claim_latency.record(max(0.0, claimed_at - due), base)
        parent = SpanContext(trace_id_of(self._root(execution)), span_id_of(run.run_id, "run"),
                             is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        span = self.tracer.start_span(
            f"invoke_agent {run.workflow}", context=trace.set_span_in_context(trace.NonRecordingSpan(parent)),
            kind=SpanKind.INTERNAL, start_time=int(claimed_at * _NS),
            attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": run.workflow,
                        "cairn.run_id": run.run_id, "cairn.workflow_version": run.workflow_version,
                        "cairn.worker": execution.worker, "cairn.epoch": run.epoch,
                        "cairn.recoveries": run.recoveries, "cairn.takeover": takeover, **base})
        execution.observed = _Claimed(span, trace.set_span_in_context(span), base)

    def recorded(self, execution: Observed, event: HistoryEvent) -> None:
        claimed: _Claimed | None = getattr(execution, "observed", None)
        if claimed is None:
            return
        ended = _CALL_ENDS.get(event.event)
        if ended is not None and event.position is not None:
            self._call(execution, claimed, event, ended)
        elif event.event is EventType.OP_RECONCILED:
            outcome = str((event.detail or {}).get("outcome", "unknown"))
            self.reconciliations.add(1, {**claimed.attributes, "cairn.outcome": outcome})
            where = {"cairn.position": event.position or 0, "cairn.outcome": outcome}
            claimed.span.add_event(event.event.value, timestamp=int(event.at * _NS), attributes=where)
        elif event.event is not EventType.OP_INTENT:
            claimed.span.add_event(event.event.value, timestamp=int(event.at * _NS))

    def ended(self, execution: Observed, outcome: Ending) -> None:
        claimed: _Claimed | None = getattr(execution, "observed", None)
        if claimed is None:
            return
        span = claimed.span
        span.set_attribute("cairn.outcome", outcome.status)
        if outcome.status in _FAILED_CLAIM:
            span.set_status(Status(StatusCode.ERROR, outcome.error or outcome.status))
        span.end()
        self.claims.add(1, {**claimed.attributes, "cairn.outcome": outcome.status})
        if outcome.status in _ENDED_RUN:
            self.runs_ended.add(1, {**claimed.attributes, "cairn.status": outcome.status})

    # -- internals ---------------------------------------------------------------

    def _call(self, execution: Observed, claimed: _Claimed, event: HistoryEvent, ended: str) -> None:
        intent = execution.journal.intents.get(event.position) if event.position is not None else None
        name, attributes = call_attributes(event, (intent.detail or {}) if intent is not None else {})
        started = event.started_at if event.started_at is not None else event.at
        finished = max(event.at, started)
        span = self.tracer.start_span(name, context=claimed.context, start_time=int(started * _NS),
                                      attributes=attributes)
        if ended != "completed":
            span.set_status(Status(StatusCode.ERROR, error_message(event)))
        span.end(end_time=int(finished * _NS))
        kind = event.step_kind or "step"
        self.step_duration.record(finished - started,
                                  {**claimed.attributes, "cairn.kind": kind, "cairn.outcome": ended})
        detail = event.detail or {}
        if kind == "model" and ended == "completed":
            model = {**claimed.attributes, "gen_ai.operation.name": "chat",
                     "gen_ai.request.model": str(attributes.get("gen_ai.request.model", ""))}
            self.tokens.record(int(attributes.get("gen_ai.usage.input_tokens", 0)),
                               {**model, "gen_ai.token.type": "input"})
            self.tokens.record(int(attributes.get("gen_ai.usage.output_tokens", 0)),
                               {**model, "gen_ai.token.type": "output"})
            self.model_duration.record(finished - started, model)
            if detail.get("cost"):
                self.spend.add(float(detail["cost"]), model)
        if detail.get("reconciled"):
            self.reconciliations.add(1, {**claimed.attributes, "cairn.outcome": str(detail["reconciled"])})

    def _root(self, execution: Observed) -> str:
        """The id of the root of ``execution``'s run tree (its trace)."""
        run = execution.run
        if run.parent_run_id is None:
            return run.run_id
        with self._lock:
            known = self._roots.get(run.run_id)
        if known is not None:
            return known
        seen, root = {run.run_id}, run.parent_run_id
        while root not in seen:
            seen.add(root)
            parent = execution.store.get_run(root)
            if parent is None or parent.parent_run_id is None:
                break
            root = parent.parent_run_id
        with self._lock:
            if len(self._roots) >= _ROOTS:
                self._roots.clear()
            self._roots[run.run_id] = root
        return root


def _claim_index(history: list[HistoryEvent], epoch: int) -> int | None:
    """Where the entry of the claim at ``epoch`` is in its history."""
    for index in range(len(history) - 1, -1, -1):
        event = history[index]
        if event.epoch == epoch and event.event in (EventType.LEASE_CLAIMED, EventType.LEASE_TAKEN_OVER):
            return index
        if event.event not in _CLAIM_ENTRIES:
            return None
    return None
