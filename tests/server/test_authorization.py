"""The authorization matrix, generated from the route table: every endpoint
x {no token, malformed, revoked, each role (installation included), another
tenant's admin} x {own run, another tenant's run, an unknown id}. A new
endpoint without a sample request below fails
``test_every_endpoint_has_a_sample``, so none escapes; the role each needs
is written out in ``EXPECTED_ROLES``, not read from the table under test,
so lowering one fails too.

- no token, a malformed or a revoked one: 401, JSON error;
- a role below the endpoint's: 403 (before the run is looked up, so a
  forbidden caller learns nothing about ids);
- another tenant's run: 404 with exactly the body an unknown id gets;
- otherwise never 401/403/404 and never a 5xx.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from cairn.api.tokens import Role
from cairn.server import ROUTES
from cairn.server.routing import Endpoint

from .conftest import OTHER, TENANT, Setup
from .workflows import drain

#: a valid request for each endpoint: (body, path parameters other than run_id)
SAMPLES: dict[tuple[str, str], tuple[Any, dict[str, str]]] = {
    ("POST", "/api/runs"): ({"workflow": "echo", "input": {"text": "hi"}}, {}),
    ("GET", "/api/runs"): (None, {}),
    ("GET", "/api/runs/{run_id}"): (None, {}),
    ("GET", "/api/runs/{run_id}/history"): (None, {}),
    ("GET", "/api/runs/{run_id}/model-calls"): (None, {}),
    ("GET", "/api/runs/{run_id}/operations"): (None, {}),
    ("POST", "/api/runs/{run_id}/cancel"): ({}, {}),
    ("POST", "/api/runs/{run_id}/kill"): ({}, {}),
    ("POST", "/api/runs/{run_id}/resume"): (None, {}),
    ("POST", "/api/runs/{run_id}/retry"): (None, {}),
    ("PUT", "/api/runs/{run_id}/budget"): ({"tokens": 1000}, {}),
    ("POST", "/api/runs/{run_id}/operations/{position}/resolve"): ({"done": False}, {"position": "0"}),
    ("GET", "/api/runs/{run_id}/events"): (None, {}),
    ("GET", "/api/events"): (None, {}),
    ("GET", "/api/queues"): (None, {}),
    ("PUT", "/api/queues/{name}"): ({"concurrency": 5}, {"name": "emails"}),
    ("GET", "/api/queues/{name}/share"): (None, {"name": "emails"}),
    ("PUT", "/api/queues/{name}/share"): ({"concurrency": 2}, {"name": "emails"}),
    ("GET", "/api/whoami"): (None, {}),
    ("GET", "/api/tokens"): (None, {}),
    ("POST", "/api/tokens"): ({"name": "new-bot", "role": "viewer"}, {}),
    ("DELETE", "/api/tokens/{token_id}"): (None, {"token_id": "0000000000000000"}),
    ("POST", "/api/erasures"): ({"subject": "nobody-at-all"}, {}),
    ("GET", "/api/erasures"): (None, {}),
    ("GET", "/api/audit/log"): (None, {}),
    ("GET", "/api/keys"): (None, {}),
    ("GET", "/api/keys/verify"): (None, {}),
    ("POST", "/api/runs/{run_id}/archive"): (None, {}),
    ("GET", "/api/runs/{run_id}/archive"): (None, {}),
    ("POST", "/api/runs/{run_id}/restore"): (None, {}),
    ("GET", "/metrics"): (None, {}),
    ("POST", "/api/runs/{run_id}/signals/{name}"): ({"data": {"n": 1}}, {"name": "go"}),
    ("GET", "/api/runs/{run_id}/published/{key}"): (None, {"key": "stage"}),
    ("GET", "/api/approvals"): (None, {}),
    ("GET", "/api/runs/{run_id}/approvals"): (None, {}),
    ("GET", "/api/runs/{run_id}/approvals/{request_id}"): (None, {}),
    ("POST", "/api/runs/{run_id}/approvals/{request_id}/approve"): ({"comment": "ok"}, {}),
    ("POST", "/api/runs/{run_id}/approvals/{request_id}/reject"): ({}, {}),
    ("GET", "/api/schedules"): (None, {}),
    ("GET", "/api/runs/{run_id}/checkpoints"): (None, {}),
    ("GET", "/api/runs/{run_id}/checkpoints/{step}"): (None, {"step": "0"}),
    ("GET", "/api/runs/{run_id}/checkpoints/{a}/diff/{b}"): (None, {"a": "0", "b": "0"}),
    ("GET", "/api/runs/{run_id}/workspace"): (None, {}),
    ("GET", "/api/runs/{run_id}/workspace/{position}"): (None, {"position": "latest"}),
    ("GET", "/api/runs/{run_id}/workspace/{a}/diff/{b}"): (None, {"a": "0", "b": "latest"}),
    ("GET", "/api/runs/{run_id}/divergence"): (None, {"?": "other={run_id}"}),
    ("POST", "/api/runs/{run_id}/checkpoints/{step}/replay"): ({}, {"step": "0"}),
    ("POST", "/api/runs/{run_id}/checkpoints/{step}/fork"): ({"update": {}}, {"step": "0"}),
}

#: the least role of each endpoint, written out here and not read from the route table, so
#: lowering a route's role (minting tokens as an operator, approving as a viewer) fails the matrix
EXPECTED_ROLES: dict[tuple[str, str], Role] = {
    ("POST", "/api/runs"): Role.OPERATOR,
    ("GET", "/api/runs"): Role.VIEWER,
    ("GET", "/api/runs/{run_id}"): Role.VIEWER,
    ("GET", "/api/runs/{run_id}/history"): Role.VIEWER,
    ("GET", "/api/runs/{run_id}/model-calls"): Role.VIEWER,
    ("GET", "/api/runs/{run_id}/operations"): Role.VIEWER,
    ("POST", "/api/runs/{run_id}/cancel"): Role.OPERATOR,
    ("POST", "/api/runs/{run_id}/kill"): Role.OPERATOR,
    ("POST", "/api/runs/{run_id}/resume"): Role.OPERATOR,
    ("POST", "/api/runs/{run_id}/retry"): Role.OPERATOR,
    ("PUT", "/api/runs/{run_id}/budget"): Role.OPERATOR,
    ("POST", "/api/runs/{run_id}/operations/{position}/resolve"): Role.OPERATOR,
    ("GET", "/api/runs/{run_id}/events"): Role.VIEWER,
    ("GET", "/api/events"): Role.VIEWER,
    ("GET", "/api/queues"): Role.VIEWER,
    ("PUT", "/api/queues/{name}"): Role.INSTALLATION,
    ("GET", "/api/queues/{name}/share"): Role.VIEWER,
    ("PUT", "/api/queues/{name}/share"): Role.ADMIN,
    ("GET", "/api/whoami"): Role.VIEWER,
    ("GET", "/api/tokens"): Role.ADMIN,
    ("POST", "/api/tokens"): Role.ADMIN,
    ("DELETE", "/api/tokens/{token_id}"): Role.ADMIN,
    ("POST", "/api/erasures"): Role.ADMIN,
    ("GET", "/api/erasures"): Role.ADMIN,
    ("GET", "/api/audit/log"): Role.ADMIN,
    ("GET", "/api/keys"): Role.ADMIN,
    ("GET", "/api/keys/verify"): Role.ADMIN,
    ("POST", "/api/runs/{run_id}/archive"): Role.OPERATOR,
    ("GET", "/api/runs/{run_id}/archive"): Role.VIEWER,
    ("POST", "/api/runs/{run_id}/restore"): Role.OPERATOR,
    ("GET", "/metrics"): Role.VIEWER,
    ("POST", "/api/runs/{run_id}/signals/{name}"): Role.OPERATOR,
    ("GET", "/api/runs/{run_id}/published/{key}"): Role.VIEWER,
    ("GET", "/api/approvals"): Role.VIEWER,
    ("GET", "/api/runs/{run_id}/approvals"): Role.VIEWER,
    ("GET", "/api/runs/{run_id}/approvals/{request_id}"): Role.VIEWER,
    ("POST", "/api/runs/{run_id}/approvals/{request_id}/approve"): Role.OPERATOR,
    ("POST", "/api/runs/{run_id}/approvals/{request_id}/reject"): Role.OPERATOR,
    ("GET", "/api/schedules"): Role.VIEWER,
    ("GET", "/api/runs/{run_id}/checkpoints"): Role.VIEWER,
    ("GET", "/api/runs/{run_id}/checkpoints/{step}"): Role.VIEWER,
    ("GET", "/api/runs/{run_id}/checkpoints/{a}/diff/{b}"): Role.VIEWER,
    ("GET", "/api/runs/{run_id}/workspace"): Role.VIEWER,
    ("GET", "/api/runs/{run_id}/workspace/{position}"): Role.VIEWER,
    ("GET", "/api/runs/{run_id}/workspace/{a}/diff/{b}"): Role.VIEWER,
    ("GET", "/api/runs/{run_id}/divergence"): Role.VIEWER,
    ("POST", "/api/runs/{run_id}/checkpoints/{step}/replay"): Role.OPERATOR,
    ("POST", "/api/runs/{run_id}/checkpoints/{step}/fork"): Role.OPERATOR,
}

IDENTITIES = ["none", "malformed", "revoked", "viewer", "operator", "admin", "installation", "other-admin"]


def test_every_endpoint_has_a_sample() -> None:
    assert {(e.method, e.path) for e in ROUTES} == set(SAMPLES)


def test_every_endpoint_needs_the_role_this_table_expects() -> None:
    assert {(e.method, e.path): e.role for e in ROUTES} == EXPECTED_ROLES


def _headers(setup: Setup, who: str) -> dict[str, str]:
    if who == "none":
        return {}
    if who == "malformed":
        return {"Authorization": "Bearer cairn_not-a-token"}
    return setup.headers(who)


def _call(http: httpx.Client, spec: Endpoint, headers: dict[str, str], target: str | None,
          requests: dict[str, str] | None = None) -> httpx.Response:
    body, params = SAMPLES[(spec.method, spec.path)]
    params = dict(params)
    if target is not None:
        params = {**params, ("token_id" if "{token_id}" in spec.path else "run_id"): target}
    if "{request_id}" in spec.path:  # the run's approval request (an unknown run: any id)
        params["request_id"] = (requests or {}).get(str(target), "0" * 32)
    query = params.pop("?", None)  # a required query parameter, formatted like the path
    path = spec.path.format(**params) + ("" if query is None else "?" + query.format(**params))
    if spec.stream is not None:
        with http.stream(spec.method, path, headers=headers) as response:
            response.read() if response.status_code != 200 else None
            return response
    return http.request(spec.method, path, headers=headers, json=body)


def _json_error(response: httpx.Response) -> dict[str, Any]:
    assert response.headers["content-type"].startswith("application/json"), response.text
    body = response.json()
    assert set(body) == {"error", "message"}, body
    assert isinstance(body["message"], str), body
    return body


def _role(who: str) -> Role | None:
    return {"viewer": Role.VIEWER, "operator": Role.OPERATOR, "admin": Role.ADMIN,
            "installation": Role.INSTALLATION, "other-admin": Role.ADMIN}.get(who)


def _awaiting_approval(setup: Setup, count: int) -> tuple[list[str], list[str], dict[str, str]]:
    """``count`` runs of each tenant waiting for a decision, and their requests' ids."""
    start = setup.app.start
    own = [start(setup.workflows["payout"], "ada", 5, tenant=TENANT).run_id for _ in range(count)]
    theirs = [start(setup.workflows["payout"], "bob", 6, tenant=OTHER).run_id for _ in range(count)]
    drain(setup.app)
    requests = {a.run_id: a.request_id for a in setup.app.approvals()}
    assert set(requests) == {*own, *theirs}
    return own, theirs, requests


def test_the_authorization_matrix(setup: Setup, client: httpx.Client) -> None:
    app, wf = setup.app, setup.workflows
    unknown = "01a00000-0000-7000-8000-000000000000"
    unknown_token = "0000000000000000"
    deciding = sum("{request_id}" in spec.path for spec in ROUTES) * len(IDENTITIES)
    own_waiting, their_waiting, requests = _awaiting_approval(setup, deciding)
    checked = 0
    for spec in ROUTES:
        for who in IDENTITIES:
            targets: list[str | None] = [None]
            if "{request_id}" in spec.path:  # each caller its own pending requests: one may decide
                own, theirs = own_waiting.pop(), their_waiting.pop()
                targets = [own, theirs, unknown]
            elif "{run_id}" in spec.path:
                own = app.start(wf["echo"], "own", tenant=TENANT).run_id
                theirs = app.start(wf["echo"], "theirs", tenant=OTHER).run_id
                targets = [own, theirs, unknown]
            elif "{token_id}" in spec.path:
                own = app.tokens.mint(TENANT, "viewer", "victim").record.token_id
                theirs = app.tokens.mint(OTHER, "viewer", "victim").record.token_id
                targets = [own, theirs, unknown_token]
            answers: dict[str | None, httpx.Response] = {}
            for target in targets:
                response = _call(client, spec, _headers(setup, who), target, requests)
                answers[target] = response
                checked += 1
                where = f"{spec.method} {spec.path} as {who} on {target}"
                assert response.status_code < 500, f"{where}: {response.status_code} {response.text}"
                role = _role(who)
                if role is None:
                    assert response.status_code == 401, where
                    assert _json_error(response)["error"] == "unauthorized"
                elif not role.allows(EXPECTED_ROLES[(spec.method, spec.path)]):
                    assert response.status_code == 403, where
                    assert _json_error(response)["error"] == "forbidden"
                elif target is not None and (target in (unknown, unknown_token)
                                             or (target == theirs) != (who == "other-admin")):
                    assert response.status_code == 404, f"{where}: {response.status_code} {response.text}"
                else:
                    assert response.status_code not in (401, 403, 404), f"{where}: {response.text}"
            if len(targets) == 3 and who in ("viewer", "operator", "admin", "installation"):
                other, missing = answers[targets[1]], answers[targets[2]]
                if other.status_code == 404:
                    expected = missing.json()["message"].replace(str(targets[2]), str(targets[1]))
                    assert other.json() == {**missing.json(), "message": expected}, \
                        "another tenant's id answers unlike an unknown one"
    assert checked > 250


@pytest.mark.parametrize("header", ["Basic abc", "Bearer", "bearer  x y", "Token abc",
                                    "Bearer cairn_0123456789abcdef_" + "x" * 43])
def test_malformed_authorization_headers_are_401(setup: Setup, client: httpx.Client, header: str) -> None:
    response = client.get("/api/runs", headers={"Authorization": header})
    assert response.status_code == 401
    assert _json_error(response)["error"] == "unauthorized"
    assert response.headers["www-authenticate"].startswith("Bearer")


def test_a_cookie_alone_cannot_act_without_the_csrf_header(setup: Setup, client: httpx.Client) -> None:
    run_id = setup.app.start(setup.workflows["echo"], "x", tenant=TENANT).run_id
    client.cookies.set("cairn_token", setup.tokens["admin"])
    assert client.get(f"/api/runs/{run_id}").status_code == 200
    refused = client.post(f"/api/runs/{run_id}/cancel")
    assert refused.status_code == 403
    assert setup.app.get_run(run_id).status.value == "pending"
    allowed = client.post(f"/api/runs/{run_id}/cancel", headers={"X-Cairn-CSRF": "1"})
    assert allowed.status_code == 200
    assert setup.app.get_run(run_id).status.value == "cancelled"


def test_a_run_id_of_another_tenant_cannot_be_started_over(setup: Setup, client: httpx.Client) -> None:
    """Another tenant's run id given as the key names a run of this tenant's
    own namespace: a new run (201, as for any unused id, so nothing is learnt
    of the other's), the other's run untouched."""
    theirs = setup.app.start(setup.workflows["echo"], "theirs", tenant=OTHER).run_id
    before = (setup.app.get_run(theirs), setup.app.history(theirs))
    response = client.post("/api/runs", json={"workflow": "echo", "input": "mine"},
                           headers={**setup.headers("operator"), "Idempotency-Key": theirs})
    assert response.status_code == 201, response.text
    assert response.json()["run"]["run_id"] == f"tenant:{TENANT}:{theirs}"
    assert "theirs" not in response.text
    assert (setup.app.get_run(theirs), setup.app.history(theirs)) == before
