"""Bad input never produces a 5xx: a fuzz-ish matrix of hostile bodies,
query strings, path parameters and stream cursors against every endpoint,
each answered with a JSON error of the right 4xx (and nothing changed)."""

from __future__ import annotations

import random
from typing import Any

import httpx

from cairn.server import ROUTES

from .conftest import TENANT, Setup
from .test_authorization import SAMPLES

BODIES: list[bytes] = [
    b"{", b"[]", b"null", b"42", b'"text"', b"\xff\xfe\x00", b'{"workflow": NaN}', b"{" * 5000,
    b'{"workflow": 12}', b'{"workflow": ""}', b'{"workflow": "echo", "priority": 1e400}',
    b'{"workflow": "echo", "unknown_field": 1}', b'{"done": "yes"}', b'{"tokens": -1}',
    b'{"concurrency": 0}', b'{"rate": "lots"}', b'{"rate": "0/min"}', b'{"workflow": "echo\\u0000"}',
    b'{"workflow": "echo", "run_id": "a\\nb"}', b'{"name": ""}', b'{"role": "god", "name": "x"}',
    b'{"workflow": "echo", "budget": {"cost": "free"}}', b'{"reason": ""}',
    b'{"workflow": "echo", "input": ' + b"[" * 3000 + b"]" * 3000 + b"}",
    # lone surrogates: valid JSON escapes, but no text any database can store
    b'{"workflow": "echo", "run_id": "\\ud800"}', b'{"workflow": "echo", "thread_id": "\\udfff"}',
    b'{"workflow": "echo", "input": "\\ud800"}', b'{"name": "\\ud800"}', b'{"reason": "\\udc00x"}',
    b'{"workflow": "echo", "queue": "\\ud800"}', b'{"data": "\\ud800"}', b'{"comment": "\\ud800"}',
]

QUERIES: list[dict[str, str]] = [
    {"limit": "-1"}, {"limit": "abc"}, {"limit": "100000"}, {"status": "bogus"}, {"after": "-5"},
    {"after": "1e99"}, {"after": "\x00"}, {"workflow": "x" * 300},
]

IDS = ["-1", "abc", "%00", "x" * 5000, "..%2F..%2Fetc", "%E2%80%AE",
       "01a00000-0000-7000-8000-000000000000%0A",
       "%C3%28", "%FF"]


def _assert_client_error(response: httpx.Response, where: str) -> None:
    assert 400 <= response.status_code < 500, f"{where}: {response.status_code} {response.text[:300]}"
    body = response.json()
    assert set(body) == {"error", "message"}, f"{where}: {body}"


def test_hostile_input_gets_json_4xx_never_5xx(setup: Setup, client: httpx.Client) -> None:
    rng = random.Random(13)
    admin = setup.headers("admin")
    own = setup.app.start(setup.workflows["echo"], "own", tenant=TENANT).run_id
    before = [(r.run_id, r.status, r.epoch) for r in setup.app.list_runs()]
    tried = 0
    for spec in ROUTES:
        body, params = SAMPLES[(spec.method, spec.path)]
        path = spec.path.format(**{"run_id": own, "request_id": "0" * 32, **params})
        if body is not None:
            for raw in BODIES:
                response = client.request(spec.method, path, content=raw,
                                          headers={**admin, "Content-Type": "application/json"})
                if response.status_code < 400:  # a body this endpoint legitimately accepts
                    continue
                _assert_client_error(response, f"{spec.method} {spec.path} body {raw[:40]!r}")
                tried += 1
        for query in QUERIES:
            if spec.stream is not None or spec.method != "GET":
                continue
            response = client.request(spec.method, path, params=query, headers=admin)
            assert response.status_code < 500, f"{spec.method} {spec.path} {query}: {response.text[:300]}"
            tried += 1
        for name in spec.parameters:
            for bad in rng.sample(IDS, len(IDS)):
                raw_path = spec.path.replace("{" + name + "}", bad)
                for other in spec.parameters:
                    raw_path = raw_path.replace("{" + other + "}", {"run_id": own, **params}.get(other, "x"))
                response = client.request(spec.method, raw_path, headers=admin,
                                          json=body if spec.method != "GET" else None)
                named = "/{name}" in spec.path or spec.path.endswith("/{key}")
                if named and response.status_code < 400:
                    continue  # any queue or signal name (a queue's share too), any event key, is a name
                _assert_client_error(response, f"{spec.method} {raw_path[:80]}")
                tried += 1
    after = {(r.run_id, r.status, r.epoch) for r in setup.app.list_runs()}
    assert set(before) <= after
    assert tried > 150


def test_bad_stream_cursors_and_oversized_bodies(setup: Setup, client: httpx.Client) -> None:
    viewer = setup.headers("viewer")
    own = setup.app.start(setup.workflows["echo"], "own", tenant=TENANT).run_id
    for cursor in ["-1", "abc", "1.5", "9" * 40, "\u202e"]:
        response = client.get(f"/api/runs/{own}/events", params={"after": cursor}, headers=viewer)
        _assert_client_error(response, f"run cursor {cursor!r}")
    for cursor in ["nonsense", "inf/x", "nan/x", "1e999/x", "/"]:
        response = client.get("/api/events", params={"after": cursor}, headers=viewer)
        _assert_client_error(response, f"tenant cursor {cursor!r}")
    huge: dict[str, Any] = {"workflow": "echo", "input": "x" * (2 << 20)}
    response = client.post("/api/runs", json=huge, headers=setup.headers("operator"))
    assert response.status_code == 413
    assert response.json()["error"] == "too_large"
    assert setup.app.list_runs(tenant=TENANT, workflow="echo", limit=10)[0].run_id == own
    missing = client.get("/api/nothing-here", headers=viewer)
    assert missing.status_code == 404
    assert missing.json()["error"] == "not_found"
    wrong = client.delete("/api/runs", headers=viewer)
    assert wrong.status_code == 405
    assert wrong.json()["error"] == "method_not_allowed"


def test_unknown_or_repeated_query_parameters_are_refused_by_name(setup: Setup, client: httpx.Client) -> None:
    """A misspelt ``limt`` used to mean the default, silently; a repeated
    ``limit`` meant whichever the framework kept. Every endpoint now names
    the parameter it does not take."""
    viewer = setup.headers("viewer")
    run_id = setup.app.start(setup.workflows["echo"], "q", tenant=TENANT).run_id
    cases = {
        "/api/runs?limt=5": "'limt'",
        "/api/runs?limit=1&limit=2": "given more than once",
        f"/api/runs/{run_id}/history?afterr=3": "'afterr'",
        f"/api/runs/{run_id}/events?since=0": "'since'",
        "/api/events?after=&after=": "given more than once",
        "/api/queues?x=<b>1</b>": "'x'",
    }
    for path, named in cases.items():
        response = client.get(path, headers=viewer)
        _assert_client_error(response, path)
        assert named in response.json()["message"], (path, response.json())
    assert client.get("/api/runs?limit=1", headers=viewer).status_code == 200
    assert client.get(f"/api/runs/{run_id}/history?after=0&limit=5", headers=viewer).status_code == 200


def test_a_cursor_beyond_64_bits_is_a_client_error(setup: Setup, client: httpx.Client) -> None:
    """A history or model-call cursor (``after``) larger than any stored seq
    reached the database as it was: SQLite raised OverflowError (a 500) and
    PostgreSQL "bigint out of range" (a 503 "unavailable"). It is a 400 naming
    the parameter; the largest 64-bit cursor is a valid, empty page."""
    viewer = setup.headers("viewer")
    run_id = setup.app.start(setup.workflows["echo"], "q", tenant=TENANT).run_id
    for page in ("history", "model-calls"):
        path = f"/api/runs/{run_id}/{page}?after=24544848699546745719236571768553472"
        response = client.get(path, headers=viewer)
        _assert_client_error(response, path)
        assert "after" in response.json()["message"], response.json()
        last = client.get(f"/api/runs/{run_id}/{page}?after={2**63 - 1}", headers=viewer)
        assert last.status_code == 200, last.json()
        assert last.json()["next_after"] is None
