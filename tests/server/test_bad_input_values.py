"""Issue 21 item 3: one rule for ids and values, never a 5xx for bad input,
never a database address in a client message. Each on both backends.

Every case here answered 500 or 503 (or was accepted) before: an integer
beyond 64 bits next to a ``null``; a value at the accepted nesting limit,
stored, then every read of its run; a NUL in a comment or a name on
PostgreSQL (503, naming the database's host, port and name); run ids with
line breaks or ``.``/``..``; ``PUT /budget`` answering ``changed: false``
after a change; non-ASCII digits taken as a cursor.
"""

from __future__ import annotations

import logging
import math
import socket
import time
from typing import Any
from urllib.parse import quote

import httpx
import pytest

import cairn
from cairn.codec.values import MAX_DEPTH
from cairn.errors import InvalidArgument, StoreError
from cairn.server.errors import as_api_error
from cairn.store.records import RunFilter
from tests.timing import SLACK

from .conftest import TENANT, Setup
from .workflows import drain

HUGE = 2**70


def _keep(setup: Setup) -> None:
    @setup.app.workflow(name="keep")
    def keep(ctx: cairn.Context, value: Any) -> Any:
        return value


def _nested(depth: int) -> Any:
    """A JSON value ``depth`` arrays deep (``[]`` is 1)."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def _assert_client_error(response: httpx.Response, where: str = "") -> dict[str, Any]:
    assert 400 <= response.status_code < 500, f"{where}: {response.status_code} {response.text[:300]}"
    body = response.json()
    assert set(body) == {"error", "message"}, body
    return dict(body)


@pytest.mark.parametrize(("field", "bad"), [
    ("run_id", "x\n"), ("run_id", "x\r\nevent: forged"), ("run_id", "."), ("run_id", ".."),
    ("run_id", "a\x85b"), ("thread_id", "t\n"), ("queue", ".."), ("queue", "q\n"),
])
def test_ids_that_break_the_rule_are_refused(setup: Setup, client: httpx.Client, field: str,
                                             bad: str) -> None:
    response = client.post("/api/runs", json={"workflow": "echo", "input": {"text": "x"}, field: bad},
                           headers=setup.headers("operator"))
    _assert_client_error(response, repr(bad))
    assert setup.app.store.list_runs(RunFilter()) == []


def test_a_lookup_of_an_id_no_run_can_have_is_not_found(setup: Setup, client: httpx.Client) -> None:
    for raw in ("%2E", "%2E%2E", "x%0A", "x%0D%0A"):
        response = client.get(f"/api/runs/{raw}", headers=setup.headers("viewer"))
        assert response.status_code == 404, (raw, response.text)


def test_an_integer_beyond_64_bits_is_bad_input_everywhere(setup: Setup, client: httpx.Client) -> None:
    operator = setup.headers("operator")
    _keep(setup)
    for value in ([HUGE, None], {"a": -HUGE, "b": None}, HUGE):
        started = client.post("/api/runs", json={"workflow": "keep", "input": {"value": value}},
                              headers=operator)
        body = _assert_client_error(started, f"start {value}")
        assert "64" in body["message"]
    assert setup.app.store.list_runs(RunFilter()) == []
    run_id = setup.app.start(setup.workflows["listener"], tenant=TENANT).run_id
    signal = client.post(f"/api/runs/{quote(run_id, safe='')}/signals/go", json={"data": [HUGE, None]},
                         headers=operator)
    _assert_client_error(signal, "signal")
    # the largest and smallest 64-bit integers are values like any other
    edge = client.post("/api/runs", json={"workflow": "keep", "input": {"value": [2**64 - 1, -2**63, None]}},
                       headers=operator)
    assert edge.status_code == 201, edge.text


def test_an_edit_with_an_integer_beyond_64_bits_is_bad_input(setup: Setup, client: httpx.Client) -> None:
    operator = setup.headers("operator")
    run_id = setup.app.start(setup.workflows["payout"], "ada", 5, tenant=TENANT).run_id
    drain(setup.app)
    (request,) = client.get("/api/approvals", headers=operator).json()["approvals"]
    one = f"/api/runs/{quote(run_id, safe='')}/approvals/{request['request_id']}"
    edited = client.post(f"{one}/approve", json={"edit": {"to": "bob", "amount": HUGE}, "comment": None},
                         headers=operator)
    _assert_client_error(edited, "approve with edit")
    assert client.get(one, headers=operator).json()["status"] == "pending"  # nothing stored


def test_a_step_returning_an_integer_beyond_64_bits_fails_its_run_with_a_message(setup: Setup) -> None:
    @setup.app.workflow(name="huge")
    def huge(ctx: cairn.Context) -> Any:
        return [HUGE, None]

    handle = setup.app.start(huge, tenant=TENANT)
    drain(setup.app)
    record = setup.app.get_run(handle.run_id)
    assert record.status.value == "failed"
    assert record.error is not None
    assert "64" in record.error["message"]
    assert record.error["type"] != "OverflowError"


def test_a_value_at_the_nesting_limit_round_trips_and_one_beyond_is_refused(setup: Setup,
                                                                           client: httpx.Client) -> None:
    operator = setup.headers("operator")
    _keep(setup)
    # the stored input is {"value": ...}: one level of its own
    deepest = _nested(MAX_DEPTH - 1)
    started = client.post("/api/runs", json={"workflow": "keep", "input": {"value": deepest}},
                          headers=operator)
    assert started.status_code == 201, started.text
    run_id = started.json()["run"]["run_id"]
    drain(setup.app)
    path = f"/api/runs/{quote(run_id, safe='')}"
    shown = client.get(path, headers=operator)
    assert shown.status_code == 200, shown.text
    assert shown.json()["input"] == {"value": deepest}
    assert shown.json()["result"] == deepest
    history = client.get(f"{path}/history", headers=operator)
    assert history.status_code == 200, history.text
    assert setup.app.handle(run_id).result(timeout=5) == deepest
    beyond = client.post("/api/runs", json={"workflow": "keep", "input": {"value": _nested(MAX_DEPTH)}},
                         headers=operator)
    body = _assert_client_error(beyond, "beyond the limit")
    assert "nested" in body["message"]
    assert [r.run_id for r in setup.app.store.list_runs(RunFilter())] == [run_id]


def test_a_nul_in_text_is_never_an_outage_nor_names_the_database(setup: Setup, client: httpx.Client) -> None:
    operator, admin = setup.headers("operator"), setup.headers("admin")
    run_id = setup.app.start(setup.workflows["payout"], "ada", 5, tenant=TENANT).run_id
    drain(setup.app)
    (request,) = client.get("/api/approvals", headers=operator).json()["approvals"]
    approve = client.post(f"/api/runs/{quote(run_id, safe='')}/approvals/{request['request_id']}/approve",
                          json={"comment": "fine\x00by me"}, headers=operator)
    token = client.post("/api/tokens", json={"name": "bot\x00", "role": "viewer"}, headers=admin)
    signal = client.post(f"/api/runs/{quote(run_id, safe='')}/signals/a%00b", json={}, headers=operator)
    for response in (approve, token, signal):
        assert response.status_code < 500, response.text
        for word in ("127.0.0.1", "cairn_test", "PostgreSQL error"):
            assert word not in response.text
    # one rule on both backends (SQLite could store these, PostgreSQL cannot): refused, nothing stored
    for response, names in ((approve, "NUL"), (token, "$.name")):
        assert response.status_code == 400, response.text
        assert names in response.json()["message"]
    with pytest.raises(InvalidArgument, match="control characters"):  # the library's rule, below the schema
        setup.app.tokens.mint(TENANT, "viewer", "bot\x00")
    assert client.get("/api/approvals", headers=operator).json()["approvals"][0]["status"] == "pending"
    assert not [t for t in setup.app.tokens.list(TENANT) if t.name.startswith("bot")]


def test_a_store_failure_answers_503_without_the_database_address() -> None:
    error = as_api_error(StoreError("PostgreSQL error (127.0.0.1:5432/production): connection refused"))
    assert error.status == 503
    assert "127.0.0.1" not in error.message
    assert "production" not in error.message


def test_put_budget_says_changed_after_a_change(setup: Setup, client: httpx.Client) -> None:
    operator = setup.headers("operator")
    run_id = setup.app.start(setup.workflows["ticker"], 1, tenant=TENANT).run_id
    path = f"/api/runs/{quote(run_id, safe='')}/budget"
    first = client.put(path, json={"tokens": 50}, headers=operator)
    assert first.status_code == 200, first.text
    assert first.json()["changed"] is True
    assert first.json()["run"]["budget"]["tokens"] == 50
    again = client.put(path, json={"tokens": 50}, headers=operator)
    assert again.json()["changed"] is False


@pytest.mark.parametrize("cursor", ["\u0661", "\u00b2", "\uff11", "\u0967"])
def test_non_ascii_digits_are_not_cursors(setup: Setup, client: httpx.Client, cursor: str) -> None:
    operator = setup.headers("operator")
    run_id = setup.app.start(setup.workflows["ticker"], 1, tenant=TENANT).run_id
    path = f"/api/runs/{quote(run_id, safe='')}"
    _assert_client_error(client.get(f"{path}/history", params={"after": cursor}, headers=operator), cursor)
    resolve = client.post(f"{path}/operations/{quote(cursor)}/resolve", json={"done": False},
                          headers=operator)
    assert resolve.status_code == 400, resolve.text  # not read as position 1 (then: 409, not uncertain)
    assert "position must be a non-negative integer" in resolve.json()["message"]
    for how in ({"params": {"after": cursor}}, {"headers": {"Last-Event-ID": cursor.encode()}}):  # the stream
        stream = client.get(f"{path}/events", params=how.get("params"),
                            headers={**operator, **how.get("headers", {})})
        assert stream.status_code == 400, stream.text  # not resumed after seq 1
        assert "must be a sequence number" in stream.json()["message"]


def test_a_cut_off_body_writes_no_error_traceback(setup: Setup, server: Any,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """A client that declares a body and hangs up halfway is not a bug of
    the server: it used to log ``unexpected error`` with a traceback at
    ERROR, as often as anyone cared to send one."""
    caplog.set_level(logging.INFO, logger="cairn.server")
    token = setup.tokens["operator"]
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", server.port)) as conn:
            conn.sendall(f"POST /api/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                         "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                         '{"workflow"'.encode())
    with httpx.Client(base_url=server.url, timeout=30) as client:  # served after them, so they were handled
        assert client.get("/api/runs", headers=setup.headers("viewer")).status_code == 200
    deadline = time.monotonic() + 10 * SLACK
    while time.monotonic() < deadline and not any("cut off" in r.getMessage() for r in caplog.records):
        time.sleep(0.05)
    assert any("cut off" in r.getMessage() for r in caplog.records)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]


def test_a_response_is_rendered_inside_the_error_handling(setup: Setup) -> None:
    """A handler's answer that JSON cannot render (here a NaN) is answered
    as the API's JSON error, never a raw exception out of the endpoint."""
    import asyncio

    from starlette.requests import Request

    from cairn.api.tokens import Role
    from cairn.server.routing import Endpoint, ServerState, endpoint_function

    spec = Endpoint("GET", "/x", Role.VIEWER, "a handler with an unrenderable answer",
                    lambda call: {"value": math.nan})
    endpoint = endpoint_function(ServerState(setup.app), spec)
    token = setup.tokens["viewer"].encode()
    scope = {"type": "http", "method": "GET", "path": "/x", "query_string": b"", "path_params": {},
             "headers": [(b"authorization", b"Bearer " + token)]}
    response = asyncio.run(endpoint(Request(scope)))
    assert response.status_code == 500
    assert b'"internal"' in response.body
