"""The HTTP paths of the operator log (issue 26): a token minted or revoked,
a queue's limits and a tenant's share set through the API are recorded with
the presented token's identity (``http:name#id``, authenticated by the API
token) in the tenant's chain, and the chain verifies."""

from __future__ import annotations

import httpx

from .conftest import TENANT, Setup


def _actor(setup: Setup, who: str) -> str:
    return f"http:{who}-bot#{setup.tokens[who].split('_')[1]}"


def test_http_mutations_record_the_tokens_identity(setup: Setup, client: httpx.Client) -> None:
    admin = setup.headers("admin")
    before = len(setup.app.audit.log(kind="token"))  # the fixture's own tokens, minted in-process
    assert before == 7  # six minted, one revoked
    made = client.post("/api/tokens", json={"name": "ci", "role": "viewer"}, headers=admin)
    assert made.status_code == 201, made.text
    token_id = made.json()["token_id"]
    assert client.delete(f"/api/tokens/{token_id}", headers=admin).json()["revoked"] is True
    limits = client.put("/api/queues/emails", json={"concurrency": 4}, headers=setup.headers("installation"))
    assert limits.status_code == 200, limits.text
    share = client.put("/api/queues/emails/share", json={"concurrency": 1}, headers=admin)
    assert share.status_code == 200, share.text
    found = [(e.tenant, e.kind, e.object_id, e.event, e.actor, e.auth)
             for e in setup.app.audit.log() if e.kind != "run"][before:]
    assert found == [
        (TENANT, "token", token_id, "token.mint", _actor(setup, "admin"), "api-token"),
        (TENANT, "token", token_id, "token.revoke", _actor(setup, "admin"), "api-token"),
        ("", "queue", "emails", "queue.set", _actor(setup, "installation"), "api-token"),
        (TENANT, "queue_share", "emails", "queue_share.set", _actor(setup, "admin"), "api-token"),
    ]
    assert made.json()["token"] not in repr(setup.app.audit.log(kind="token"))
    assert setup.app.audit.verify().problems == []
    # the app's own Tokens still act as the app (a request never changes them)
    assert setup.app.tokens.actor == setup.app.operator.actor
