"""Actions through the API are the Operator's, acting as the token: the
history entry of each records the token's identity; starting is idempotent
on the run id / Idempotency-Key; resolving an uncertain write works end to
end; the journal pages without gaps."""

from __future__ import annotations

import httpx
import pytest

from cairn.engine.schedules import tick_run_id
from cairn.errors import InvalidArgument

from .conftest import OTHER, TENANT, Setup
from .workflows import drain


def _actor(setup: Setup, who: str) -> str:
    token_id = setup.tokens[who].split("_")[1]
    return f"http:{who}-bot#{token_id}"


def test_the_actor_in_history_is_the_tokens_identity(setup: Setup, client: httpx.Client) -> None:
    operator = setup.headers("operator")
    cancelled = client.post("/api/runs", json={"workflow": "echo", "input": "x"}, headers=operator).json()
    run_id = cancelled["run"]["run_id"]
    assert client.post(f"/api/runs/{run_id}/cancel", json={"reason": "no longer needed"},
                       headers=operator).status_code == 200
    entry = setup.app.history(run_id)[-1]
    assert entry.event.value == "run.cancelled"
    assert entry.detail is not None
    assert entry.detail["actor"] == _actor(setup, "operator")

    killed = setup.app.start(setup.workflows["echo"], "y", tenant=TENANT).run_id
    assert client.post(f"/api/runs/{killed}/kill", headers=operator).json()["killed"] == [killed]
    assert (setup.app.history(killed)[-1].detail or {})["actor"] == _actor(setup, "operator")
    assert client.post(f"/api/runs/{killed}/resume", headers=setup.headers("admin")).status_code == 200
    assert (setup.app.history(killed)[-1].detail or {})["actor"] == _actor(setup, "admin")
    budget = client.put(f"/api/runs/{killed}/budget", json={"tokens": 50}, headers=operator)
    assert budget.status_code == 200, budget.text
    assert budget.json()["run"]["budget"]["tokens"] == 50
    assert (setup.app.history(killed)[-1].detail or {})["actor"] == _actor(setup, "operator")


def test_a_run_started_over_http_records_the_tokens_permissions_context(setup: Setup,
                                                                       client: httpx.Client) -> None:
    """Issue 26: the token that started a run, its role and tenant, are in
    the run's ``run.created`` entry (so the audit chain covers them), and the
    audit log names the token for each action."""
    operator = setup.headers("operator")
    started = client.post("/api/runs", json={"workflow": "echo", "input": "x"}, headers=operator).json()
    run_id = started["run"]["run_id"]
    created = setup.app.history(run_id)[0]
    assert (created.detail or {})["started_by"] == {
        "actor": _actor(setup, "operator"), "auth": "api-token", "tenant": TENANT, "role": "operator"}
    client.post(f"/api/runs/{run_id}/cancel", json={"reason": "stop"}, headers=setup.headers("admin"))
    log = setup.app.audit.log(run_id=run_id)
    assert [(e.event, e.actor, e.auth) for e in log] == [
        ("run.created", _actor(setup, "operator"), "api-token"),
        ("run.cancelled", _actor(setup, "admin"), "api-token")]


def test_resolving_an_uncertain_write_through_the_api(setup: Setup, client: httpx.Client) -> None:
    operator = setup.headers("operator")
    run_id = client.post("/api/runs", json={"workflow": "payer", "input": "ada"},
                         headers=operator).json()["run"]["run_id"]
    drain(setup.app)
    ops = client.get(f"/api/runs/{run_id}/operations", headers=setup.headers("viewer")).json()
    assert ops["status"] == "needs_attention"
    (position,) = ops["needs_resolution"]
    op = next(o for o in ops["operations"] if o["position"] == position)
    assert op["effect"] == "write"
    assert op["status"] == "uncertain"
    assert op["arguments"] == {"to": "ada"}
    viewer = client.post(f"/api/runs/{run_id}/operations/{position}/resolve", json={"done": True},
                         headers=setup.headers("viewer"))
    assert viewer.status_code == 403
    resolved = client.post(f"/api/runs/{run_id}/operations/{position}/resolve",
                           json={"done": True, "result": "sent by hand"}, headers=operator)
    assert resolved.status_code == 200, resolved.text
    drain(setup.app)
    run = client.get(f"/api/runs/{run_id}", headers=operator).json()
    assert run["status"] == "completed"
    assert run["result"] == "sent by hand"
    settled = client.get(f"/api/runs/{run_id}/operations", headers=operator).json()["operations"][0]
    assert settled["resolution"]["how"] == "operator_done"
    assert settled["resolution"]["actor"] == _actor(setup, "operator")
    again = client.post(f"/api/runs/{run_id}/operations/{position}/resolve", json={"done": False},
                        headers=operator)
    assert again.status_code == 409
    assert again.json()["error"] == "conflict"


def test_starting_is_idempotent_on_the_key(setup: Setup, client: httpx.Client) -> None:
    operator = {**setup.headers("operator"), "Idempotency-Key": "order-42"}
    first = client.post("/api/runs", json={"workflow": "echo", "input": "a"}, headers=operator)
    again = client.post("/api/runs", json={"workflow": "echo", "input": "a"}, headers=operator)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["run"]["run_id"] == again.json()["run"]["run_id"] == f"tenant:{TENANT}:order-42"
    assert len(setup.app.list_runs(tenant=TENANT)) == 1
    differ = client.post("/api/runs", json={"workflow": "echo", "input": "a", "run_id": "other"},
                         headers=operator)
    assert differ.status_code == 422
    unknown = client.post("/api/runs", json={"workflow": "nope"}, headers=setup.headers("operator"))
    assert unknown.status_code == 422
    assert unknown.json()["error"] == "unknown_workflow"
    misfit = client.post("/api/runs", json={"workflow": "echo", "input": {"text": 5}},
                         headers=setup.headers("operator"))
    assert misfit.status_code == 422
    assert misfit.json()["error"] == "invalid_input"


def test_the_journal_pages_and_model_calls(setup: Setup, client: httpx.Client) -> None:
    viewer = setup.headers("viewer")
    setup.app.run(setup.workflows["ticker"], 7, tenant=TENANT)
    setup.app.run(setup.workflows["chat"], "why?", tenant=TENANT)
    ticker, chat = sorted(setup.app.list_runs(tenant=TENANT), key=lambda r: r.workflow, reverse=True)
    seqs: list[int] = []
    after: int | None = 0
    while after is not None:
        page = client.get(f"/api/runs/{ticker.run_id}/history", params={"after": after, "limit": 3},
                          headers=viewer).json()
        seqs += [e["seq"] for e in page["events"]]
        after = page["next_after"]
    assert seqs == [e.seq for e in setup.app.history(ticker.run_id)]
    calls = client.get(f"/api/runs/{chat.run_id}/model-calls", headers=viewer).json()["model_calls"]
    assert len(calls) == 1
    assert calls[0]["request"]["messages"][0]["content"] == "why?"
    assert calls[0]["response"]["content"].startswith("answer")
    listed = client.get("/api/runs", params={"status": "completed", "workflow": "chat"},
                        headers=viewer).json()
    assert [r["run_id"] for r in listed["runs"]] == [chat.run_id]


def test_a_tenant_cannot_take_the_run_ids_of_another_tenants_ticks(
    setup: Setup, client: httpx.Client
) -> None:
    """A schedule tick's run id is predictable; another tenant's token taking
    it first would make that tick start nothing (``store.runids``). An id a
    token chooses lands in its own tenant's namespace, so the tick's id stays
    free for the scheduler."""
    tick = tick_run_id(TENANT, "nightly", 1_800_000_000.0)
    for how in ({"json": {"workflow": "echo", "input": "a", "run_id": tick}},
                {"json": {"workflow": "echo", "input": "a"}, "headers": {"Idempotency-Key": tick}}):
        headers = {**setup.headers("other-admin"), **how.get("headers", {})}
        taken = client.post("/api/runs", json=how["json"], headers=headers)
        assert taken.status_code in (200, 201), taken.text
        assert taken.json()["run"]["run_id"] == f"tenant:{OTHER}:{tick}"
    assert setup.app.store.get_run(tick) is None
    own = client.post("/api/runs", json={"workflow": "echo", "input": "a", "run_id": tick},
                      headers=setup.headers("operator"))
    assert own.status_code == 201, own.text
    assert own.json()["run"]["run_id"] == f"tenant:{TENANT}:{tick}"
    assert setup.app.store.get_run(tick) is None  # the tick's own id is the scheduler's to take


def test_run_ids_and_idempotency_keys_are_scoped_per_tenant(setup: Setup, client: httpx.Client) -> None:
    """Two tenants choosing the same run id (or Idempotency-Key) each get a run
    of their own: no tenant learns whether another holds an id (201 for both,
    never a 409), and none can take an id another's client will ask for."""
    mine, theirs = setup.headers("operator"), setup.headers("other-admin")
    for how in ({"json": {"workflow": "echo", "input": "a", "run_id": "order-42"}},
                {"json": {"workflow": "echo", "input": "a"}, "headers": {"Idempotency-Key": "key-7"}}):
        created = {}
        for who, headers in (("theirs", theirs), ("mine", mine)):  # the other tenant goes first
            answer = client.post("/api/runs", json=how["json"], headers={**headers, **how.get("headers", {})})
            assert (answer.status_code, answer.json()["created"]) == (201, True), answer.text
            created[who] = answer.json()["run"]["run_id"]
        assert created["mine"] != created["theirs"]
        assert setup.app.get_run(created["mine"]).tenant == TENANT  # type: ignore[union-attr]
        assert setup.app.get_run(created["theirs"]).tenant == OTHER  # type: ignore[union-attr]
        assert client.get(f"/api/runs/{created['mine']}", headers=mine).status_code == 200
        assert client.get(f"/api/runs/{created['mine']}", headers=theirs).status_code == 404
    # an id spelled in my namespace by the other tenant stays in its own
    forged = client.post("/api/runs", json={"workflow": "echo", "input": "a",
                                            "run_id": f"tenant:{TENANT}:order-43"}, headers=theirs)
    assert forged.status_code == 201, forged.text
    assert forged.json()["run"]["run_id"] == f"tenant:{OTHER}:tenant:{TENANT}:order-43"
    assert setup.app.store.get_run(f"tenant:{TENANT}:order-43") is None
    # and through the library, a run of another tenant cannot take an id in my namespace
    with pytest.raises(InvalidArgument, match="is reserved"):
        setup.app.start("echo", "a", run_id=f"tenant:{TENANT}:order-44", tenant=OTHER)
