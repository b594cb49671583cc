"""An ``Idempotency-Key`` names one request: repeating it answers that
request's result, and reusing it for another request (another workflow or
input, another signal or data) is a 422, with nothing started or sent,
never the old result with the new request silently dropped. Both backends."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from .conftest import TENANT, Setup


def _start(client: httpx.Client, setup: Setup, body: dict[str, Any],
           key: str | None = "order-42") -> httpx.Response:
    headers = {**setup.headers("operator"), **({"Idempotency-Key": key} if key else {})}
    return client.post("/api/runs", json=body, headers=headers)


@pytest.mark.parametrize("how", ["header", "run_id"])
def test_a_key_reused_for_another_start_is_refused(setup: Setup, client: httpx.Client, how: str) -> None:
    def start(body: dict[str, Any]) -> httpx.Response:
        if how == "header":
            return _start(client, setup, body)
        return _start(client, setup, {**body, "run_id": "order-42"}, key=None)

    first = start({"workflow": "echo", "input": {"text": "a"}})
    assert first.status_code == 201, first.text
    run_id = first.json()["run"]["run_id"]
    again = start({"workflow": "echo", "input": {"text": "a"}})
    assert again.status_code == 200, again.text
    assert again.json()["run"]["run_id"] == run_id
    assert start({"workflow": "echo", "input": "a"}).status_code == 200  # the same input, written otherwise
    for other in ({"workflow": "echo", "input": {"text": "b"}}, {"workflow": "ticker", "input": {"n": 2}},
                  {"workflow": "echo", "input": ["c"]}):
        refused = start(other)
        assert refused.status_code == 422, f"{other}: {refused.status_code} {refused.text}"
        assert refused.json()["error"] == "idempotency_key_reused"
        assert "order-42" in refused.json()["message"]
    runs = setup.app.list_runs(tenant=TENANT)
    assert [r.run_id for r in runs] == [run_id]
    assert runs[0].workflow == "echo"


def test_a_key_reused_for_another_signal_is_refused(setup: Setup, client: httpx.Client) -> None:
    run_id = setup.app.start(setup.workflows["listener"], tenant=TENANT).run_id
    headers = {**setup.headers("operator"), "Idempotency-Key": "send-1"}

    def send(name: str, data: Any) -> httpx.Response:
        return client.post(f"/api/runs/{run_id}/signals/{name}", json={"data": data}, headers=headers)

    assert send("go", {"n": 1}).status_code == 201
    assert send("go", {"n": 1}).status_code == 200
    for name, data in (("stop", {"n": 1}), ("go", {"n": 2}), ("go", None)):
        refused = send(name, data)
        assert refused.status_code == 422, f"{name} {data}: {refused.status_code} {refused.text}"
        assert refused.json()["error"] == "idempotency_key_reused"
    mailbox = setup.app.operator.mailbox(run_id)
    assert [(d.key, d.dedupe) for d in mailbox] == [(mailbox[0].key, "send-1")]
