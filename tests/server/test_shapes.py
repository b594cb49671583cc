"""Issue 22 item 3: one JSON shape per object. For the same runs, what
``cairn ... --json`` prints and what the HTTP API answers are equal, object
by object (run, run detail, event, operation, approval), on both backends;
and the OpenAPI document describes each of those answers closely enough
that the real responses validate against it (``jsonschema``)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import httpx
import jsonschema
import pytest
from click.testing import CliRunner

from cairn.cli.main import main
from cairn.server import ROUTES
from cairn.server.openapi import document

from .conftest import TENANT, Setup
from .workflows import drain


def cli(setup: Setup, *args: str) -> str:
    assert setup.app.db_url is not None
    result = CliRunner().invoke(main, [*args, "--db", setup.app.db_url], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.stderr
    return result.stdout


def lines(text: str) -> list[Any]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def path(run_id: str) -> str:
    return f"/api/runs/{quote(run_id, safe='')}"


@pytest.fixture
def runs(setup: Setup) -> dict[str, str]:
    """One run in each state an object shows differently: completed with
    steps, with a model call, needing attention (an uncertain write), and
    waiting for an approval."""
    wf = setup.workflows
    started = {"ticker": setup.app.start(wf["ticker"], 3, tenant=TENANT).run_id,
               "chat": setup.app.start(wf["chat"], "hello", tenant=TENANT).run_id,
               "payer": setup.app.start(wf["payer"], "bob", tenant=TENANT).run_id,
               "payout": setup.app.start(wf["payout"], "ada", 5, tenant=TENANT).run_id}
    drain(setup.app)
    return started


def test_a_run_is_one_shape(setup: Setup, client: httpx.Client, runs: dict[str, str]) -> None:
    listed = client.get("/api/runs", headers=setup.headers("viewer")).json()["runs"]
    assert lines(cli(setup, "runs", "--json")) == listed


def test_a_run_detail_is_one_shape(setup: Setup, client: httpx.Client, runs: dict[str, str]) -> None:
    for name, run_id in runs.items():
        shown = json.loads(cli(setup, "show", run_id, "--json"))
        answered = client.get(path(run_id), params={"journal": "true"}, headers=setup.headers("viewer"))
        assert answered.status_code == 200, answered.text
        assert shown == answered.json(), name
        # without ?journal the API leaves the journal out (it is paged at /history), nothing else
        short = client.get(path(run_id), headers=setup.headers("viewer")).json()
        assert short == {k: v for k, v in shown.items() if k != "journal"}, name
    payer = json.loads(cli(setup, "show", runs["payer"], "--json"))
    assert payer["attention"]["tool"] == "send"
    payout = json.loads(cli(setup, "show", runs["payout"], "--json"))
    assert [a["action"] for a in payout["approvals"]] == ["pay"]


def test_an_event_is_one_shape(setup: Setup, client: httpx.Client, runs: dict[str, str]) -> None:
    for name, run_id in runs.items():
        page = client.get(f"{path(run_id)}/history", params={"limit": 1000},
                          headers=setup.headers("viewer")).json()
        assert lines(cli(setup, "events", run_id, "--json")) == page["events"], name


def test_an_operation_is_one_shape(setup: Setup, client: httpx.Client, runs: dict[str, str]) -> None:
    run_id = runs["payer"]
    listed = json.loads(cli(setup, "ops", run_id, "--json"))
    answered = client.get(f"{path(run_id)}/operations", headers=setup.headers("viewer")).json()
    (op,) = answered["operations"]
    assert (op["tool"], op["status"], op["attempt"]) == ("send", "uncertain", 1)
    assert listed["operations"] == answered["operations"]
    # the CLI adds the shell commands that resolve each uncertain one, and nothing else
    assert {k: v for k, v in listed.items() if k != "resolve"} == answered
    assert [r["position"] for r in listed["resolve"]] == answered["needs_resolution"]
    assert setup.app.operations(run_id) == answered["operations"]


def test_an_approval_is_one_shape(setup: Setup, client: httpx.Client, runs: dict[str, str]) -> None:
    listed = lines(cli(setup, "approvals", "--json", "--all"))
    answered = client.get("/api/approvals", params={"pending": "false"},
                          headers=setup.headers("viewer")).json()["approvals"]
    assert [a["action"] for a in answered] == ["pay"]
    assert listed == answered
    (request,) = answered
    one = client.get(f"{path(request['run_id'])}/approvals/{request['request_id']}",
                     headers=setup.headers("viewer")).json()
    assert one == request


# -- the OpenAPI document describes the real answers -------------------------------------------


def _validator(method: str, route: str) -> jsonschema.Draft202012Validator:
    spec = document(ROUTES)
    schema = spec["paths"][route][method]["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema != {"type": "object"}, f"{method.upper()} {route} answers an undocumented object"
    return jsonschema.Draft202012Validator({**schema, "components": spec["components"]})


def test_the_documented_schemas_validate_the_real_answers(
    setup: Setup, client: httpx.Client, runs: dict[str, str]
) -> None:
    viewer = setup.headers("viewer")
    answers: list[tuple[str, str, Any]] = [
        ("get", "/api/runs", client.get("/api/runs", headers=viewer).json()),
        ("get", "/api/approvals", client.get("/api/approvals", params={"pending": "false"},
                                             headers=viewer).json()),
    ]
    for run_id in runs.values():
        for params in ({}, {"journal": "true"}):
            answers.append(("get", "/api/runs/{run_id}", client.get(path(run_id), params=params,
                                                                    headers=viewer).json()))
        for tail in ("/history", "/operations", "/approvals", "/model-calls"):
            answers.append(("get", "/api/runs/{run_id}" + tail,
                            client.get(path(run_id) + tail, headers=viewer).json()))
    for method, route, body in answers:
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                  for e in _validator(method, route).iter_errors(body)]
        assert not errors, (route, errors[:5])
    # strict enough to catch a renamed field: an operation answered as it once was fails
    ops = client.get(f"{path(runs['payer'])}/operations", headers=viewer).json()
    ops["operations"][0]["attempts"] = ops["operations"][0].pop("attempt")
    assert not _validator("get", "/api/runs/{run_id}/operations").is_valid(ops)
