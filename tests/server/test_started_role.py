"""A run started through the HTTP API records the token's role and id, so
a tool restricted by role (``cairn.ToolAccess(role=...)``) allows it the
rights of the token that started it, wherever it later executes."""

from __future__ import annotations

import httpx
import pytest

import cairn
from cairn.store.records import EventType
from tests.graph.test_fork_role import register as register_purger

from .conftest import TENANT, LiveServer, Setup


def test_a_run_started_over_http_has_the_tokens_rights(setup: Setup) -> None:
    ran: list[str] = []
    app = setup.app

    @app.tool(effect="write", access=cairn.ToolAccess(role="admin"))
    def rotate_keys(scope: str) -> str:
        ran.append(scope)
        return f"rotated {scope}"

    @app.workflow(name="rotate")
    def rotate(ctx: cairn.Context, scope: str) -> str:
        return rotate_keys(scope)

    with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=30) as http:
        started = {}
        for who in ("operator", "admin"):
            answer = http.post("/api/runs", headers=setup.headers(who),
                               json={"workflow": "rotate", "input": {"scope": who}, "run_id": f"by-{who}"})
            assert answer.status_code == 201, answer.text
            started[who] = answer.json()["run"]["run_id"]
    operator_token = app.tokens.check(setup.tokens["operator"]).token_id
    assert app.store.started_with(started["operator"]) == ("operator", operator_token)
    refused = rf"started as operator \(token {operator_token}\) may not call it"
    with pytest.raises(cairn.RunFailed, match=refused):
        app.resume(started["operator"])
    assert app.resume(started["admin"]) == "rotated admin"
    assert ran == ["admin"]
    [refused] = [e for e in app.history(started["operator"]) if e.event is EventType.STEP_FAILED]
    assert refused.name == "rotate_keys"


def test_a_fork_or_replay_over_http_has_the_forkers_rights_and_the_run_json_shows_them(
        setup: Setup, client: httpx.Client) -> None:
    """An operator's token forking a run an admin started gets an operator's
    run (a tool reserved to admin refuses it, recorded), never the origin's
    admin; a viewer's token cannot fork at all; GET /api/runs/{id} shows the
    role, the token and who started each run."""
    ran: list[str] = []
    app = setup.app
    graph = register_purger(app, ran)
    app.run(graph, {"n": 0, "done": []}, run_id="origin", tenant=TENANT, started_role="admin",
            started_token="tok-origin")
    tokens = {who: app.tokens.check(setup.tokens[who]) for who in ("viewer", "operator", "admin")}
    before = {r.run_id for r in app.list_runs(tenant=TENANT)}
    fork = "/api/runs/origin/checkpoints/1/fork"
    denied = client.post(fork, headers=setup.headers("viewer"), json={"update": {"n": 5}, "run_id": "v"})
    assert denied.status_code == 403, denied.text
    assert {r.run_id for r in app.list_runs(tenant=TENANT)} == before

    made = client.post(fork, headers=setup.headers("operator"), json={"update": {"n": 5}, "run_id": "by-op"})
    assert made.status_code == 201, made.text
    replayed = client.post("/api/runs/origin/checkpoints/1/replay", headers=setup.headers("admin"),
                           json={"run_id": "by-admin"})
    assert replayed.status_code == 201, replayed.text
    forked_id, replayed_id = made.json()["run"]["run_id"], replayed.json()["run"]["run_id"]

    shown = client.get(f"/api/runs/{forked_id}", headers=setup.headers("viewer")).json()
    operator = tokens["operator"]
    assert (shown["started_role"], shown["started_token"]) == ("operator", operator.token_id)
    assert shown["started_by"]["actor"] == operator.actor
    assert shown["started_by"]["role"] == "operator"
    assert shown["forked_from"] == {"run_id": "origin", "step": 1, "edited": True}
    origin = client.get("/api/runs/origin", headers=setup.headers("viewer")).json()
    assert (origin["started_role"], origin["started_token"]) == ("admin", "tok-origin")
    assert app.store.started_with(replayed_id) == ("admin", tokens["admin"].token_id)

    with pytest.raises(cairn.RunFailed, match=rf"started as operator \(token {operator.token_id}\) may not"):
        app.resume(forked_id)
    assert app.resume(replayed_id)["done"] == ["purged 1"]
    assert ran == ["purge 1", "purge 1"]
