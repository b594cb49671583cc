"""Live spans and metrics (``cairn.api.instrumentation``), with the SDK's
in-memory exporters, on SQLite and PostgreSQL:

- one trace per run across a worker SIGKILLed at a random step and the
  worker that takes the run over (the killed worker's spans reach a file,
  flushed per span, since its memory dies with it);
- the attributes of claim, step, model and tool spans;
- metric values after a known workload (3 runs completed, 1 failed), the
  step histogram's count equal to the journal's calls, the store's gauges;
- an observer that raises never breaks a run; without one the engine runs
  the plain ``Execution``.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import cairn
from cairn.api.instrumentation import Telemetry, due_since, instrument, uninstrument
from cairn.api.store_metrics import StoreMetrics
from cairn.api.telemetry import span_id_of, trace_id_of
from cairn.engine.execution import Execution, current, operation_id
from cairn.engine.executor import ObservedExecution
from cairn.models import Message
from cairn.models.base import ModelRequest, ModelResponse
from cairn.models.scripted import ScriptedModel
from cairn.store.records import EventType, HistoryEvent
from tests.acceptance.harness import wait_until
from tests.backends import StoreBackend

REPO = Path(__file__).resolve().parents[2]


class Exporters:
    """An in-memory span exporter and metric reader on providers of their own."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def points(self, name: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        found: list[Any] = []
        for resource in data.resource_metrics if data is not None else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        found.extend(metric.data.data_points)
        return found

    def value(self, name: str, **attributes: Any) -> float:
        """The sum of the points of ``name`` whose attributes include ``attributes``."""
        total = 0.0
        for point in self.points(name):
            if all(point.attributes.get(k) == v for k, v in attributes.items()):
                total += point.count if hasattr(point, "bucket_counts") else point.value
        return total


@pytest.fixture
def exporters() -> Iterator[Exporters]:
    found = Exporters()
    yield found
    found.tracer_provider.shutdown()
    found.meter_provider.shutdown()


def _load_otel_app(db: str) -> Any:
    sys.modules.pop("tests.server.otel_app", None)
    os.environ["CAIRN_DB"] = db
    try:  # imported afresh (``from tests.server import`` would find the last test's module)
        return importlib.import_module("tests.server.otel_app")
    finally:
        del os.environ["CAIRN_DB"]


def _file_spans(path: Path) -> list[dict[str, Any]]:
    """The spans a worker process wrote as JSON lines (a killed process may
    leave its last line cut short: only whole lines count)."""
    if not path.exists():
        return []
    spans = []
    for line in path.read_text().splitlines():
        try:
            spans.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return spans


@pytest.mark.slow
def test_one_live_trace_across_a_random_kill_and_a_takeover(
    backend: StoreBackend, tmp_path: Path, exporters: Exporters
) -> None:
    steps = 30
    spans_file = tmp_path / "doomed-spans.jsonl"
    env = {**os.environ, "CAIRN_DB": backend.url, "CAIRN_TEST_SPANS": str(spans_file),
           "CAIRN_TEST_STEP_SLEEP": "0.05", "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "src")])}
    otel_app = _load_otel_app(backend.url)
    app: cairn.App = otel_app.app
    try:
        handle = app.start(otel_app.traced, steps, tenant="acme")
        command = [sys.executable, "-m", "cairn", "worker", "--app", "tests.server.otel_app:app",
                   "--worker-id", "doomed", "--lease", "1"]
        doomed = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        kill_after = random.randint(2, steps // 2)  # steps recorded before the kill (half the run left)
        try:
            wait_until(lambda: sum(e.event is EventType.STEP_COMPLETED and e.step_kind == "step"
                                   for e in app.history(handle.run_id)) >= kill_after, 60,
                       f"the doomed worker records {kill_after} steps")
            doomed.send_signal(signal.SIGKILL)
        finally:
            doomed.kill()
            assert doomed.wait(30) == -signal.SIGKILL
        wait_until(lambda: app.get_run(handle.run_id).lease_expires_at is not None
                   and app.get_run(handle.run_id).lease_expires_at < time.time(), 10, "the lease expires")
        instrument(app, exporters.tracer_provider, exporters.meter_provider)
        app.worker(worker_id="rescuer", poll_interval=0.05).run(install_signals=False, max_idle=0.5)
        assert handle.result(timeout=10) == sum(range(steps))
        history = app.store.history(handle.run_id)
    finally:
        uninstrument(app)
        app.close()
        sys.modules.pop("tests.server.otel_app", None)

    trace_id = trace_id_of(handle.run_id)
    run_parent = span_id_of(handle.run_id, "run")
    dead = _file_spans(spans_file)
    alive = exporters.finished()
    # the killed worker's finished calls were exported, and are of the run's trace
    assert dead, "the doomed worker exported no span before it died"
    assert {int(s["context"]["trace_id"], 16) for s in dead} == {trace_id}
    assert {s.context.trace_id for s in alive} == {trace_id}
    # the rescuer's claim span hangs from the run's derived context and says it took over
    (claim,) = [s for s in alive if s.name == "invoke_agent traced"]
    assert claim.parent is not None
    assert claim.parent.span_id == run_parent
    assert claim.parent.is_remote
    assert claim.attributes is not None
    assert claim.attributes["cairn.takeover"] is True
    assert claim.attributes["cairn.recoveries"] == 1
    assert claim.attributes["cairn.outcome"] == "completed"
    calls = [s for s in alive if s is not claim]
    assert all(s.parent is not None and s.parent.span_id == claim.context.span_id for s in calls)
    # every journaled call is a span at most once, on one worker or the other
    # (the call the kill interrupted was not recorded, so it has no span from the dead worker)
    positions = [s["attributes"]["cairn.position"] for s in dead if "cairn.position" in s["attributes"]] + \
        [s.attributes["cairn.position"] for s in alive if s.attributes and "cairn.position" in s.attributes]
    assert len(positions) == len(set(positions))
    # A span is exported when its call ends, just after the call's record
    # commits: a kill between the two loses the span of that last record of
    # the dead worker's (spans are written in order, so only a tail of its
    # calls can be missing, and only its last: the next call starts after
    # the export). Every call the rescuer made is a span.
    doomed_done = sorted(e.position for e in history if e.event is EventType.STEP_COMPLETED
                         and e.position is not None and e.worker == "doomed")
    missing = sorted(set(range(steps + 2)) - set(positions))  # model, the steps, the tool
    assert missing == doomed_done[len(doomed_done) - len(missing):], (missing, doomed_done)
    assert len(missing) <= 1, missing
    dead_calls = [s for s in dead if "cairn.position" in s["attributes"]]
    assert {s["attributes"]["cairn.worker"] for s in dead_calls} == {"doomed"}
    # the rescuer counted the takeover, and no claim latency for it (no entry says when it was due)
    assert exporters.value("cairn.takeovers") == 1
    assert exporters.value("cairn.claim.latency") == 0
    assert exporters.value("cairn.runs.ended", **{"cairn.status": "completed"}) == 1


class PricedModel(ScriptedModel):
    """A scripted model whose every answer costs 0.25."""

    def complete(self, request: ModelRequest) -> ModelResponse:
        return msgspec.structs.replace(super().complete(request), cost=0.25)


def _workload_app(db: str) -> tuple[cairn.App, Any, Any]:
    app = cairn.App(db=db)
    llm = PricedModel(lambda request, n: Message(role="assistant", content="ok"))

    @app.step
    def tick(i: int) -> int:
        return i

    @app.step
    def explode(i: int) -> int:
        raise cairn.TerminalError(f"boom {i}")

    @app.tool(effect="idempotent")
    def send(op: cairn.Operation, to: str) -> str:
        return op.operation_id

    @app.workflow(name="work")
    def work(ctx: cairn.Context, n: int, fail: bool = False) -> int:
        ctx.model(llm, [Message(role="user", content="go")])
        total = sum(tick(i) for i in range(n))
        if fail:
            explode(n)
        send("ops")
        return total

    return app, work, llm


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        from tests.engine.conftest import postgres_url

        return postgres_url(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path}/cairn.db"


def test_metrics_after_a_known_workload(db: str, exporters: Exporters) -> None:
    app, work, _ = _workload_app(db)
    try:
        instrument(app, exporters.tracer_provider, exporters.meter_provider)
        StoreMetrics(app, exporters.meter_provider)
        handles = [app.start(work, n, tenant="acme") for n in (1, 2, 3)]
        failing = app.start(work, 2, True, tenant="acme")
        other = app.start(work, 1, tenant="globex")
        app.worker(poll_interval=0.05).run(install_signals=False, max_idle=0.5)
        assert [h.result(timeout=5) for h in handles] == [0, 1, 3]
        assert app.get_run(failing.run_id).status.value == "failed"
        assert other.result(timeout=5) == 0
        waiting = app.start(work, 1, tenant="acme", queue="later")  # nobody claims it: queue depth 1

        runs = [*handles, failing, other]
        calls = [e for h in runs for e in app.history(h.run_id)
                 if e.event in (EventType.STEP_COMPLETED, EventType.STEP_FAILED, EventType.STEP_RETRIED)]
        # counters
        value = exporters.value
        assert value("cairn.runs.ended", **{"cairn.status": "completed"}) == 4
        assert value("cairn.runs.ended", **{"cairn.status": "completed", "cairn.tenant": "acme"}) == 3
        assert exporters.value("cairn.runs.ended", **{"cairn.status": "failed"}) == 1
        assert exporters.value("cairn.claims") == 5
        assert exporters.value("cairn.takeovers") == 0
        # histograms: one point per journaled call, one claim latency per first claim
        assert exporters.value("cairn.step.duration") == len(calls)
        assert value("cairn.step.duration", **{"cairn.kind": "step", "cairn.outcome": "failed"}) == 1
        assert exporters.value("cairn.step.duration", **{"cairn.kind": "model"}) == 5
        assert exporters.value("cairn.step.duration", **{"cairn.kind": "tool"}) == 4
        assert exporters.value("cairn.claim.latency") == 5
        assert exporters.value("gen_ai.client.token.usage", **{"gen_ai.token.type": "input"}) == 5
        assert exporters.value("cairn.budget.spend") == pytest.approx(5 * 0.25)
        assert exporters.value("cairn.budget.spend", **{"cairn.tenant": "globex"}) == pytest.approx(0.25)
        # the store's gauges, read at collection
        assert exporters.value("cairn.runs", **{"cairn.tenant": "acme", "cairn.status": "completed"}) == 3
        assert exporters.value("cairn.runs", **{"cairn.tenant": "acme", "cairn.status": "failed"}) == 1
        assert exporters.value("cairn.runs", **{"cairn.tenant": "acme", "cairn.status": "pending"}) == 1
        assert exporters.value("cairn.runs", **{"cairn.tenant": "globex", "cairn.status": "completed"}) == 1
        assert value("cairn.queue.depth", **{"cairn.queue": "later", "cairn.state": "runnable"}) == 1
        assert value("cairn.queue.depth", **{"cairn.queue": "later", "cairn.state": "running"}) == 0
        assert waiting.run_id
    finally:
        uninstrument(app)
        app.close()


def test_span_attributes_follow_the_genai_conventions(tmp_path: Path, exporters: Exporters) -> None:
    app, work, _ = _workload_app(f"sqlite:///{tmp_path}/cairn.db")
    try:
        instrument(app, exporters.tracer_provider, exporters.meter_provider)
        handle = app.start(work, 2, tenant="acme")
        failing = app.start(work, 1, True, tenant="acme")
        app.worker(poll_interval=0.05).run(install_signals=False, max_idle=0.3)
        assert handle.result(timeout=5) == 1
    finally:
        uninstrument(app)
        app.close()
    spans = exporters.finished()
    mine = [s for s in spans if s.context.trace_id == trace_id_of(handle.run_id)]
    names = {s.name for s in mine}
    assert names == {"invoke_agent work", "chat scripted-1", "step tick", "execute_tool send"}
    (claim,) = [s for s in mine if s.name == "invoke_agent work"]
    assert claim.attributes is not None
    assert claim.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert claim.attributes["gen_ai.agent.name"] == "work"
    assert claim.attributes["cairn.run_id"] == handle.run_id
    assert claim.attributes["cairn.tenant"] == "acme"
    assert claim.attributes["cairn.takeover"] is False
    (model,) = [s for s in mine if s.name.startswith("chat ")]
    assert model.attributes is not None
    assert model.attributes["gen_ai.operation.name"] == "chat"
    assert model.attributes["gen_ai.request.model"] == "scripted-1"
    assert model.attributes["gen_ai.usage.input_tokens"] > 0
    assert model.attributes["gen_ai.usage.output_tokens"] > 0
    assert model.attributes["cairn.cost"] == pytest.approx(0.25)
    (tool,) = [s for s in mine if s.name == "execute_tool send"]
    assert tool.attributes is not None
    assert tool.attributes["gen_ai.tool.name"] == "send"
    assert tool.attributes["cairn.effect"] == "idempotent"
    position = int(str(tool.attributes["cairn.position"]))
    assert tool.attributes["cairn.operation_id"] == operation_id(handle.run_id, position)
    # a span's times are the journal's own
    entries = app_history(tmp_path, handle.run_id)
    history = {e.position: e for e in entries if e.event is EventType.STEP_COMPLETED}
    for span in mine:
        if span.attributes and "cairn.position" in span.attributes:
            entry = history[int(str(span.attributes["cairn.position"]))]
            assert span.end_time == int(entry.at * 1_000_000_000)
    # the failed step's span and its claim's span carry the error
    failed = [s for s in spans if s.context.trace_id == trace_id_of(failing.run_id)]
    (boom,) = [s for s in failed if s.name == "step explode"]
    assert boom.status.status_code.name == "ERROR"
    assert "boom 1" in str(boom.status.description)
    (failed_claim,) = [s for s in failed if s.name == "invoke_agent work"]
    assert failed_claim.status.status_code.name == "ERROR"
    assert failed_claim.attributes is not None
    assert failed_claim.attributes["cairn.outcome"] == "failed"


def app_history(tmp_path: Path, run_id: str) -> list[HistoryEvent]:
    reader = cairn.App(db=f"sqlite:///{tmp_path}/cairn.db")
    try:
        return reader.history(run_id)
    finally:
        reader.close()


class Exploding(Telemetry):
    """An observer whose every hook raises."""

    def claimed(self, execution: Execution) -> None:
        raise RuntimeError("observer down")

    def recorded(self, execution: Execution, event: HistoryEvent) -> None:
        raise RuntimeError("observer down")

    def ended(self, execution: Execution, outcome: Any) -> None:
        raise RuntimeError("observer down")


def test_an_observer_that_raises_never_breaks_a_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    app, work, _ = _workload_app(f"sqlite:///{tmp_path}/cairn.db")
    try:
        app.runtime.observer = Exploding()
        assert app.run(work, 3) == 3
        handle = app.start(work, 2)
        app.worker(poll_interval=0.05).run(install_signals=False, max_idle=0.3)
        assert handle.result(timeout=5) == 1
        assert "the observer failed" in caplog.text
    finally:
        uninstrument(app)
        app.close()


def test_without_an_observer_the_engine_runs_the_plain_execution(tmp_path: Path) -> None:
    app = cairn.App(db=f"sqlite:///{tmp_path}/cairn.db")
    kinds: list[type] = []

    @app.step
    def where() -> str:
        return "here"

    @app.workflow(name="probe")
    def probe(ctx: cairn.Context) -> str:
        kinds.append(type(current()))
        return where()

    try:
        assert app.run(probe) == "here"
        app.runtime.observer = Telemetry()  # the API's no-op providers: observed, exported nowhere
        assert app.run(probe) == "here"
    finally:
        uninstrument(app)
        app.close()
    assert kinds == [Execution, ObservedExecution]


def test_due_since_reads_when_a_run_became_due() -> None:
    def entry(event: EventType, at: float, **detail: Any) -> HistoryEvent:
        return HistoryEvent(run_id="r", seq=1, event=event, at=at, epoch=1, detail=detail or None)

    claim = entry(EventType.LEASE_CLAIMED, 10.0)
    assert due_since([entry(EventType.RUN_CREATED, 2.0), claim], 1) == 2.0
    assert due_since([entry(EventType.RUN_SUSPENDED, 2.0, wake_at=5.0), claim], 1) == 5.0
    assert due_since([entry(EventType.STEP_RETRIED, 2.0, next_at=4.0), claim], 1) == 4.0
    # woken by a signal or a child: no entry says when, so no latency is made up
    signalled = entry(EventType.RUN_SUSPENDED, 2.0, wake_at=9.0, waiting_for="signal:x")
    assert due_since([signalled, claim], 1) is None
    assert due_since([entry(EventType.RUN_SUSPENDED, 2.0, waiting_on="child"), claim], 1) is None
    assert due_since([claim], 0) is None


def test_a_child_run_joins_its_root_runs_trace(tmp_path: Path, exporters: Exporters) -> None:
    app = cairn.App(db=f"sqlite:///{tmp_path}/cairn.db")

    @app.step
    def leaf(i: int) -> int:
        return i

    @app.workflow(name="grandchild")
    def grandchild(ctx: cairn.Context) -> int:
        return leaf(3)

    @app.workflow(name="child")
    def child(ctx: cairn.Context) -> int:
        return leaf(2) + ctx.child(grandchild)

    @app.workflow(name="root")
    def root(ctx: cairn.Context) -> int:
        return leaf(1) + ctx.child(child)

    try:
        instrument(app, exporters.tracer_provider, exporters.meter_provider)
        handle = app.start(root)
        app.worker(poll_interval=0.05).run(install_signals=False, max_idle=0.5)
        assert handle.result(timeout=5) == 6
        runs = {s.attributes["cairn.workflow"]: s.attributes["cairn.run_id"]
                for s in exporters.finished() if s.attributes and s.name.startswith("invoke_agent")}
    finally:
        uninstrument(app)
        app.close()
    assert set(runs) == {"root", "child", "grandchild"}
    spans = exporters.finished()
    # every span of the three runs is in the root's trace; each claim hangs from its own run's context
    assert {s.context.trace_id for s in spans} == {trace_id_of(handle.run_id)}
    for span in spans:
        if span.name.startswith("invoke_agent") and span.attributes:
            assert span.parent is not None
            assert span.parent.span_id == span_id_of(str(span.attributes["cairn.run_id"]), "run")
    assert exporters.value("cairn.runs.ended", **{"cairn.status": "completed"}) == 3


def test_every_entry_a_claim_commits_has_its_span_whatever_path_wrote_it(
    tmp_path: Path, exporters: Exporters
) -> None:
    """Entries are committed by several paths (a plain append, a transaction,
    a consumed signal): each reaches the observer, because it hooks the
    journal every committed entry goes through, not each write path."""
    app = cairn.App(db=f"sqlite:///{tmp_path}/cairn.db")

    @app.transaction
    def book(tx: cairn.Tx, n: int) -> int:
        tx.execute("CREATE TABLE IF NOT EXISTS bookings (n INTEGER)")
        tx.execute("INSERT INTO bookings VALUES (?)", (n,))
        return n

    @app.step
    def double(n: int) -> int:
        return 2 * n

    @app.workflow(name="paths")
    def paths(ctx: cairn.Context) -> int:
        go = ctx.wait_for_signal("go", type_=int)
        return double(book(go))

    try:
        instrument(app, exporters.tracer_provider, exporters.meter_provider)
        handle = app.start(paths)
        app.signal(handle.run_id, "go", 21)
        app.worker(poll_interval=0.05).run(install_signals=False, max_idle=0.5)
        assert handle.result(timeout=5) == 42
    finally:
        uninstrument(app)
        app.close()
    entries = [e for e in app_history(tmp_path, handle.run_id)
               if e.event is EventType.STEP_COMPLETED and e.position is not None]
    assert len(entries) == 3
    spanned = {int(str(s.attributes["cairn.position"])) for s in exporters.finished()
               if s.attributes and "cairn.position" in s.attributes}
    assert spanned == {e.position for e in entries}
