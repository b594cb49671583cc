"""``/api/runs/{run_id}/checkpoints``: a graph run's history, states, diffs,
replay and fork over HTTP, on both backends; tenant-scoped (another
tenant's run is 404 as an unknown one, and its token can neither read nor
fork into another tenant); fork and replay idempotent on the
Idempotency-Key; bad input one JSON error and nothing created."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

import httpx
import pytest

import cairn

from .conftest import OTHER, TENANT, Setup


class Notes(TypedDict):
    notes: Annotated[list[str], cairn.append]
    n: int


def notes_graph(app: cairn.App) -> cairn.Workflow[Any]:
    g = cairn.Graph(Notes)

    def first(state: Notes) -> dict[str, Any]:
        return {"notes": ["first"], "n": state["n"] + 1}

    def second(state: Notes) -> dict[str, Any]:
        return {"notes": [f"second n={state['n']}"]}

    g.node(first)
    g.node(second)
    g.edge(cairn.START, "first")
    g.edge("first", "second")
    g.edge("second", cairn.END)
    return app.graph("notes", g)


@pytest.fixture
def graph_run(setup: Setup) -> str:
    workflow = setup.workflows["notes"] = notes_graph(setup.app)
    setup.app.run(workflow, {"notes": [], "n": 0}, run_id="g", tenant=TENANT)
    return "g"


def error_of(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "message"}
    assert "\n" not in body["message"]
    message: str = body["message"]
    return message


def test_history_state_and_diff(setup: Setup, client: httpx.Client, graph_run: str) -> None:
    viewer = setup.headers("viewer")
    page = client.get(f"/api/runs/{graph_run}/checkpoints?limit=2", headers=viewer).json()
    assert [c["step"] for c in page["checkpoints"]] == [2, 1]
    assert page["next_before"] == 1
    rest = client.get(f"/api/runs/{graph_run}/checkpoints?before=1", headers=viewer).json()
    assert [c["step"] for c in rest["checkpoints"]] == [0]
    assert rest["next_before"] is None
    state = client.get(f"/api/runs/{graph_run}/checkpoints/1", headers=viewer).json()
    assert state == {"run_id": "g", "step": 1, "state": {"notes": ["first"], "n": 1}}
    diff = client.get(f"/api/runs/{graph_run}/checkpoints/1/diff/2", headers=viewer).json()
    assert diff["changes"] == [{"path": ["notes"], "kind": "appended", "old": None, "new": ["second n=1"]}]


def test_fork_and_replay_are_idempotent_and_recorded(setup: Setup, client: httpx.Client,
                                                      graph_run: str) -> None:
    operator = {**setup.headers("operator"), "Idempotency-Key": "try-1"}
    url = f"/api/runs/{graph_run}/checkpoints/1/fork"
    made = client.post(url, headers=operator, json={"update": {"n": 41}})
    assert made.status_code == 201, made.text
    run = made.json()["run"]
    assert run["tenant"] == TENANT
    again = client.post(url, headers=operator, json={"update": {"n": 41}})
    assert again.status_code == 200
    assert again.json()["run"]["run_id"] == run["run_id"]
    other = client.post(url, headers=operator, json={"update": {"n": 42}})
    assert other.status_code == 422
    assert other.json()["error"] == "idempotency_key_reused"
    replayed = client.post(f"/api/runs/{graph_run}/checkpoints/0/replay", headers=setup.headers("operator"),
                           json={"run_id": "r"})
    assert replayed.status_code == 201, replayed.text
    assert setup.app.resume(run["run_id"])["notes"] == ["first", "second n=41"]
    shown = client.get(f"/api/runs/{run['run_id']}", headers=setup.headers("viewer")).json()
    assert shown["forked_from"] == {"run_id": "g", "step": 1, "edited": True}
    plain = client.get(f"/api/runs/{graph_run}", headers=setup.headers("viewer")).json()
    assert "forked_from" not in plain
    assert len(setup.app.list_runs(tenant=TENANT)) == 3


def test_another_tenant_can_neither_read_nor_fork(setup: Setup, client: httpx.Client, graph_run: str) -> None:
    intruder = setup.headers("other-admin")
    unknown = client.get("/api/runs/nope/checkpoints", headers=intruder)
    for response in (client.get(f"/api/runs/{graph_run}/checkpoints", headers=intruder),
                     client.get(f"/api/runs/{graph_run}/checkpoints/1", headers=intruder),
                     client.get(f"/api/runs/{graph_run}/checkpoints/0/diff/1", headers=intruder),
                     client.post(f"/api/runs/{graph_run}/checkpoints/1/fork", headers=intruder,
                                 json={"update": {"n": 1}}),
                     client.post(f"/api/runs/{graph_run}/checkpoints/1/replay", headers=intruder, json={})):
        assert response.status_code == 404, response.text
        assert response.json()["message"].replace(graph_run, "nope") == unknown.json()["message"]
    # their own graph run diffed against ours: ours is unknown to them
    theirs = "theirs"
    setup.app.run(setup.workflows["notes"], {"notes": [], "n": 0}, run_id=theirs, tenant=OTHER)
    response = client.get(f"/api/runs/{theirs}/checkpoints/0/diff/1?other={graph_run}", headers=intruder)
    assert response.status_code == 404
    # forking their own run with our run's id makes a run in their namespace, never ours
    forked = client.post(f"/api/runs/{theirs}/checkpoints/1/fork", headers=intruder,
                         json={"update": {"n": 5}, "run_id": graph_run})
    assert forked.status_code == 201, forked.text
    assert forked.json()["run"]["tenant"] == OTHER
    assert forked.json()["run"]["run_id"] != graph_run
    assert setup.app.get_run(graph_run).tenant == TENANT
    assert [r.run_id for r in setup.app.list_runs(tenant=TENANT)] == [graph_run]


def test_bad_input_is_one_json_error_and_nothing_is_created(setup: Setup, client: httpx.Client,
                                                            graph_run: str) -> None:
    echo = setup.app.start(setup.workflows["echo"], "hi", tenant=TENANT).run_id
    operator = setup.headers("operator")
    viewer = setup.headers("viewer")
    before = {r.run_id for r in setup.app.list_runs(tenant=TENANT)}
    assert "no checkpoint at super-step 9" in error_of(
        client.get(f"/api/runs/{graph_run}/checkpoints/9", headers=viewer), 404)
    for step in ("x", "-1", "1.5", "\u0661"):
        response = client.get(f"/api/runs/{graph_run}/checkpoints/{step}", headers=viewer)
        assert "super-step number" in error_of(response, 400)
    assert "not a graph run" in error_of(client.get(f"/api/runs/{echo}/checkpoints", headers=viewer), 422)
    assert "not a graph run" in error_of(client.get(f"/api/runs/{echo}/checkpoints/0", headers=viewer), 422)
    assert "no checkpoint at super-step 7" in error_of(
        client.get(f"/api/runs/{graph_run}/checkpoints/0/diff/7", headers=viewer), 404)
    assert error_of(client.get(f"/api/runs/{graph_run}/checkpoints?limit=0", headers=viewer), 400)
    fork = f"/api/runs/{graph_run}/checkpoints/1/fork"
    assert "field 'n'" in error_of(client.post(fork, headers=operator, json={"update": {"n": "x"}}), 422)
    assert "'zz' is not a field" in error_of(client.post(fork, headers=operator, json={"update": {"zz": 1}}),
                                             422)
    assert error_of(client.post(fork, headers=operator, json={"update": [1]}), 400)
    assert error_of(client.post(fork, headers=operator, json={"nope": 1}), 400)
    assert "not a graph run" in error_of(
        client.post(f"/api/runs/{echo}/checkpoints/0/replay", headers=operator, json={}), 422)
    assert "no checkpoint at super-step 5" in error_of(
        client.post(f"/api/runs/{graph_run}/checkpoints/5/replay", headers=operator, json={}), 404)
    assert error_of(client.post(f"/api/runs/{graph_run}/checkpoints/0/replay",
                                headers=setup.headers("viewer"), json={}), 403)
    assert {r.run_id for r in setup.app.list_runs(tenant=TENANT)} == before


def test_divergence_of_a_fork_and_its_origin(setup: Setup, client: httpx.Client, graph_run: str) -> None:
    viewer = setup.headers("viewer")
    made = client.post(f"/api/runs/{graph_run}/checkpoints/1/fork", headers=setup.headers("operator"),
                       json={"update": {"n": 41}, "run_id": "f"})
    assert made.status_code == 201, made.text
    fork = made.json()["run"]["run_id"]
    setup.app.resume(fork)
    same = client.get(f"/api/runs/{graph_run}/divergence?other={graph_run}", headers=viewer)
    assert same.json() == {"run_a": graph_run, "run_b": graph_run, "step": None}
    forked = client.get(f"/api/runs/{graph_run}/divergence?other={fork}", headers=viewer)
    assert forked.status_code == 200, forked.text
    expected = setup.app.graph_divergence(graph_run, fork)
    assert forked.json() == {"run_a": graph_run, "run_b": fork, "step": expected}
    assert forked.json()["step"] == 1  # the fork's edit is its checkpoint 1
    assert "`other`" in error_of(client.get(f"/api/runs/{graph_run}/divergence", headers=viewer), 400)
    intruder = setup.headers("other-admin")
    assert client.get(f"/api/runs/{graph_run}/divergence?other={fork}", headers=intruder).status_code == 404
    theirs = "theirs"
    setup.app.run(setup.workflows["notes"], {"notes": [], "n": 0}, run_id=theirs, tenant=OTHER)
    assert client.get(f"/api/runs/{theirs}/divergence?other={graph_run}", headers=intruder).status_code == 404
