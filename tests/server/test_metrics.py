"""``GET /metrics`` (``cairn serve --metrics``): the Prometheus text format,
parsed with prometheus_client's own parser, on SQLite and PostgreSQL.

- the store's series are there with the values of a known workload;
- a viewer sees its tenant's series only, even when another tenant's name
  is crafted to break out of a label (quotes, braces);
- a server not asked for metrics answers 404 (the matrix in
  ``test_authorization.py`` covers tokens and roles).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

pytest.importorskip("opentelemetry.exporter.prometheus", reason="the otel-export extra is not installed")

from prometheus_client.parser import text_string_to_metric_families

from .conftest import OTHER, TENANT, LiveServer, Setup

HOSTILE = 'evil"} 1 cairn_runs{cairn_tenant="acme'  # names refuse control characters: no newline


def _series(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return found


def _value(series: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float | None:
    values = [v for got, v in series.get(name, []) if all(got.get(k) == x for k, x in labels.items())]
    return sum(values) if values else None


def test_metrics_carry_the_store_series_of_the_tokens_tenant(setup: Setup, client: httpx.Client) -> None:
    app, wf = setup.app, setup.workflows
    done = [app.start(wf["echo"], f"hi {i}", tenant=TENANT) for i in range(2)]
    app.start(wf["echo"], "theirs", tenant=OTHER)
    app.start(wf["echo"], "hostile", tenant=HOSTILE)
    app.worker(poll_interval=0.05).run(install_signals=False, max_idle=0.3)
    assert [h.result(timeout=5) for h in done] == ["hi 0", "hi 1"]
    app.start(wf["echo"], "waits", tenant=TENANT, queue="parked")

    response = client.get("/metrics", headers=setup.headers("viewer"))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    series = _series(response.text)
    completed = _value(series, "cairn_runs", cairn_tenant=TENANT, cairn_workflow="echo",
                       cairn_status="completed")
    assert completed == 2
    assert _value(series, "cairn_runs", cairn_tenant=TENANT, cairn_status="pending") == 1
    assert {labels["cairn_tenant"] for labels, _ in series["cairn_runs"]} == {TENANT}
    assert OTHER not in response.text
    assert "evil" not in response.text
    # a queue's depth is every tenant's load: the installation's to see, not a tenant viewer's
    assert "cairn_queue_depth" not in series
    whole = _series(client.get("/metrics", headers=setup.headers("installation")).text)
    assert _value(whole, "cairn_queue_depth", cairn_queue="parked", cairn_state="runnable") == 1
    assert _value(whole, "cairn_queue_depth", cairn_queue="parked", cairn_state="running") == 0
    assert _value(whole, "cairn_runs", cairn_tenant=OTHER, cairn_status="completed") == 1

    # the hostile tenant's viewer gets its own name back, escaped, as one label
    hostile = app.tokens.mint(HOSTILE, "viewer", "evil-bot").secret
    theirs = client.get("/metrics", headers={"Authorization": f"Bearer {hostile}"})
    assert theirs.status_code == 200
    mine = _series(theirs.text)
    assert {labels["cairn_tenant"] for labels, _ in mine["cairn_runs"]} == {HOSTILE}
    assert _value(mine, "cairn_runs", cairn_tenant=HOSTILE, cairn_status="completed") == 1


def test_a_server_not_asked_for_metrics_answers_404(setup: Setup) -> None:
    with LiveServer(setup.app) as live, httpx.Client(base_url=live.url, timeout=10) as http:
        response = http.get("/metrics", headers=setup.headers("admin"))
        assert response.status_code == 404
        body: dict[str, Any] = response.json()
        assert body["error"] == "not_found"
        assert "--metrics" in body["message"]
        assert http.get("/metrics").status_code == 401  # still behind a token
