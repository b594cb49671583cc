"""``cairn worker --otel``: live spans and metrics over OTLP/HTTP, received by
a local HTTP server standing in for an OpenTelemetry collector (the real
exporter, the real protobuf payloads, decoded with opentelemetry-proto)."""

from __future__ import annotations

import gzip
import importlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the otel-export extra is not installed")

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

import cairn
from cairn.api.telemetry import trace_id_of
from tests.acceptance.harness import wait_until

REPO = Path(__file__).resolve().parents[2]


class Collector:
    """Keeps every OTLP request body it receives, by path."""

    def __init__(self) -> None:
        self.bodies: dict[str, list[bytes]] = {}
        received = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    data = gzip.decompress(data)
                received.setdefault(self.path, []).append(data)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def collector() -> Iterator[Collector]:
    found = Collector()
    found.thread.start()
    yield found
    found.server.shutdown()
    found.server.server_close()


@pytest.mark.slow
def test_a_worker_exports_spans_and_metrics_over_otlp(tmp_path: Path, collector: Collector) -> None:
    db = f"sqlite:///{tmp_path}/cairn.db"
    env = {**os.environ, "CAIRN_DB": db, "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
           "OTEL_SERVICE_NAME": "otlp-test", "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "src")])}
    env.pop("CAIRN_TEST_SPANS", None)
    sys.modules.pop("tests.server.otel_app", None)
    os.environ["CAIRN_DB"] = db
    try:  # the worker's app, imported afresh on this test's database
        otel_app = importlib.import_module("tests.server.otel_app")
    finally:
        del os.environ["CAIRN_DB"]
    app: cairn.App = otel_app.app
    try:
        handle = app.start(otel_app.traced, 3, tenant="acme")
        command = [sys.executable, "-m", "cairn", "worker", "--app", "tests.server.otel_app:app", "--otel",
                   "--poll", "0.05"]
        worker = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        try:
            wait_until(lambda: app.get_run(handle.run_id).status.terminal, 60, "the worker ends the run")
            worker.send_signal(signal.SIGTERM)  # drains, then flushes the exporters
            output, _ = worker.communicate(timeout=60)
        finally:
            worker.kill()
        assert worker.returncode == 0, output
        assert f"telemetry: spans and metrics over OTLP/HTTP to {collector.url}" in output
        assert app.get_run(handle.run_id).status.value == "completed"
    finally:
        app.close()
        sys.modules.pop("tests.server.otel_app", None)

    spans = []
    for body in collector.bodies.get("/v1/traces", []):
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            service = {a.key: a.value.string_value for a in resource.resource.attributes}["service.name"]
            assert service == "otlp-test"
            spans.extend(span for scope in resource.scope_spans for span in scope.spans)
    assert {span.trace_id for span in spans} == {trace_id_of(handle.run_id).to_bytes(16, "big")}
    names = sorted(span.name for span in spans)
    assert names == sorted(["invoke_agent traced", "chat scripted-1", "step work", "step work", "step work",
                            "execute_tool notify"])
    metrics = set()
    for body in collector.bodies.get("/v1/metrics", []):
        request_m = ExportMetricsServiceRequest.FromString(body)
        for resource_m in request_m.resource_metrics:
            for scope_m in resource_m.scope_metrics:
                metrics.update(metric.name for metric in scope_m.metrics)
    assert {"cairn.step.duration", "cairn.claim.latency", "cairn.runs.ended", "cairn.claims",
            "gen_ai.client.token.usage"} <= metrics
