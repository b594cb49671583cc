"""OpenTelemetry spans from the journal (``cairn.api.telemetry``), with the
SDK's in-memory exporter: one trace per run across a worker SIGKILL and a
takeover by another worker; GenAI attributes on model and tool spans."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cairn

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cairn.api.telemetry import RunTracer, trace_id_of
from tests.timing import wait_until_lease_lapsed

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_one_trace_per_run_across_a_kill_and_a_takeover(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/cairn.db"
    env = {**os.environ, "CAIRN_DB": db, "CAIRN_TEST_DIE_AT": "3",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "src")])}
    sys.modules.pop("tests.server.otel_app", None)
    os.environ["CAIRN_DB"] = db
    try:  # imported afresh (``from tests.server import`` would find another test's module)
        otel_app = importlib.import_module("tests.server.otel_app")
    finally:
        del os.environ["CAIRN_DB"]
    app = otel_app.app
    try:
        handle = app.start(otel_app.traced, 5, tenant="acme")
        dead = subprocess.run([sys.executable, "-m", "cairn", "worker", "--app", "tests.server.otel_app:app",
                               "--worker-id", "doomed", "--lease", "1"], env=env, cwd=REPO, timeout=60,
                              capture_output=True, text=True, check=False)
        assert dead.returncode == -9, dead.stderr
        wait_until_lease_lapsed(app, handle.run_id)  # the killed worker's lease
        app.worker(worker_id="rescuer", poll_interval=0.05).run(install_signals=False, max_idle=0.5)
        assert handle.result(timeout=10) == 10

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        spans = RunTracer(app, provider).export(handle.run_id)
        finished = exporter.get_finished_spans()
        assert len(finished) == spans == 1 + 1 + 5 + 1  # run, model, 5 steps, tool
        assert {s.context.trace_id for s in finished} == {trace_id_of(handle.run_id)}
        (run,) = [s for s in finished if s.name == "run traced"]
        assert run.attributes is not None
        assert run.attributes["cairn.recoveries"] == 1
        assert "lease.taken_over" in [e.name for e in run.events]
        workers = {str(s.attributes["cairn.worker"]) for s in finished
                   if s.attributes and s.name.startswith("step")}
        assert any(w.startswith("doomed") for w in workers)
        assert any(w.startswith("rescuer") for w in workers)
        assert all(s.parent is not None and s.parent.span_id == run.context.span_id
                   for s in finished if s is not run)
        (model,) = [s for s in finished if s.name.startswith("chat ")]
        assert model.attributes is not None
        assert model.attributes["gen_ai.operation.name"] == "chat"
        assert model.attributes["gen_ai.usage.output_tokens"] >= 0
        assert model.attributes["gen_ai.request.model"]
        (tool,) = [s for s in finished if s.name == "execute_tool notify"]
        assert tool.attributes is not None
        assert tool.attributes["cairn.effect"] == "idempotent"
        assert tool.attributes["gen_ai.tool.name"] == "notify"
        assert str(tool.attributes["cairn.operation_id"])
        # exporting again (another process, after a restart) writes the same trace
        again = InMemorySpanExporter()
        provider2 = TracerProvider()
        provider2.add_span_processor(SimpleSpanProcessor(again))
        RunTracer(app, provider2).export(handle.run_id)
        assert {s.context.trace_id for s in again.get_finished_spans()} == {trace_id_of(handle.run_id)}
        assert cairn.App  # the public App is what otel_app builds on
    finally:
        app.close()
        sys.modules.pop("tests.server.otel_app", None)
