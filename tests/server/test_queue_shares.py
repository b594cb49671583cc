"""A tenant's own share of a shared queue over HTTP (issue 21): a tenant's
admin caps its own tenant's running runs in a queue; the tenant is the
token's, never the request's; the share only ever holds that tenant back."""

from __future__ import annotations

import httpx
import pytest

from cairn.store.admission import QueueLimits, QueueShare

from .conftest import OTHER, TENANT, Setup


def _claimed_tenants(setup: Setup) -> list[str]:
    """Claim through the store's claim path (what every worker calls)."""
    return sorted(c.run.tenant for c in setup.app.store.claim_runs("w1", ["echo"], 20, 30.0, 3))


def test_a_tenant_admin_caps_its_own_share_and_no_one_elses(setup: Setup, client: httpx.Client) -> None:
    app, echo = setup.app, setup.workflows["echo"]
    for i in range(3):
        app.start(echo, f"mine {i}", tenant=TENANT, queue="emails")
        app.start(echo, f"theirs {i}", tenant=OTHER, queue="emails")
    put = client.put("/api/queues/emails/share", json={"concurrency": 1}, headers=setup.headers("admin"))
    assert put.status_code == 200, put.text
    assert put.json() == {"queue": "emails", "tenant": TENANT, "concurrency": 1}
    assert _claimed_tenants(setup) == [TENANT, OTHER, OTHER, OTHER]
    assert _claimed_tenants(setup) == []  # acme's other two wait for its one slot
    shown = client.get("/api/queues/emails/share", headers=setup.headers("viewer"))
    assert shown.json() == {"queue": "emails", "tenant": TENANT, "concurrency": 1}
    theirs = client.get("/api/queues/emails/share", headers=setup.headers("other-admin"))
    assert theirs.json() == {"queue": "emails", "tenant": OTHER, "concurrency": None}


@pytest.mark.parametrize("forged", [
    {"concurrency": 1, "tenant": OTHER},
    {"concurrency": 1, "tenants": [OTHER]},
])
def test_a_tenant_cannot_set_another_tenants_share(setup: Setup, client: httpx.Client,
                                                   forged: dict[str, object]) -> None:
    refused = client.put("/api/queues/emails/share", json=forged, headers=setup.headers("admin"))
    assert refused.status_code == 400, refused.text
    assert setup.app.operator.queue_shares() == []
    # a tenant in the query string is refused by name: the share is the token's own
    forged_query = client.put(f"/api/queues/emails/share?tenant={OTHER}", json={"concurrency": 1},
                              headers=setup.headers("admin"))
    assert forged_query.status_code == 400, forged_query.text
    assert "'tenant'" in forged_query.json()["message"]
    assert setup.app.operator.queue_shares() == []
    put = client.put("/api/queues/emails/share", json={"concurrency": 1}, headers=setup.headers("admin"))
    assert put.json()["tenant"] == TENANT, put.text
    assert setup.app.operator.queue_shares() == [QueueShare("emails", TENANT, 1)]
    # another tenant's admin sets its own share only
    theirs = client.put("/api/queues/emails/share", json={"concurrency": 2},
                        headers=setup.headers("other-admin"))
    assert theirs.status_code == 200, theirs.text
    assert setup.app.operator.queue_shares() == [QueueShare("emails", TENANT, 1),
                                                 QueueShare("emails", OTHER, 2)]


def test_a_share_above_the_queue_limit_does_not_raise_it(setup: Setup, client: httpx.Client) -> None:
    app, echo = setup.app, setup.workflows["echo"]
    app.operator.set_queue(QueueLimits("emails", tenant_concurrency=1))
    for i in range(3):
        app.start(echo, f"mine {i}", tenant=TENANT, queue="emails")
    put = client.put("/api/queues/emails/share", json={"concurrency": 100}, headers=setup.headers("admin"))
    assert put.status_code == 200, put.text
    assert _claimed_tenants(setup) == [TENANT]
    assert _claimed_tenants(setup) == []


@pytest.mark.parametrize("who", ["viewer", "operator"])
def test_below_admin_may_not_set_a_share(setup: Setup, client: httpx.Client, who: str) -> None:
    refused = client.put("/api/queues/emails/share", json={"concurrency": 1}, headers=setup.headers(who))
    assert refused.status_code == 403, refused.text
    assert setup.app.operator.queue_shares() == []


@pytest.mark.parametrize(("path", "body"), [
    ("/api/queues/emails/share", {"concurrency": -1}),
    ("/api/queues/emails/share", {"concurrency": 0}),
    ("/api/queues/emails/share", {"concurrency": 10**12}),
    ("/api/queues/emails/share", {"concurrency": "\u0663"}),  # an Arabic-Indic digit
    ("/api/queues/emails/share", {"concurrency": "3"}),
    ("/api/queues/emails/share", {"concurrency": 1.5}),
    ("/api/queues/emails/share", {"rate": "1000000000/ms"}),
    ("/api/queues/em%00ails/share", {"concurrency": 1}),
    ("/api/queues/em%01ails/share", {"concurrency": 1}),
    ("/api/queues/emails%0A/share", {"concurrency": 1}),  # a final LF: a bare $ in the rule let it in
])
def test_bad_shares_are_refused_and_nothing_is_written(setup: Setup, client: httpx.Client, path: str,
                                                       body: dict[str, object]) -> None:
    refused = client.put(path, json=body, headers=setup.headers("admin"))
    assert 400 <= refused.status_code < 500, refused.text
    message = refused.json()["message"]
    assert message
    assert "\n" not in message
    assert setup.app.operator.queue_shares() == []


def test_a_share_is_removed_with_null(setup: Setup, client: httpx.Client) -> None:
    setup.app.operator.set_queue_share(QueueShare("emails", OTHER, 2))
    assert client.put("/api/queues/emails/share", json={"concurrency": 3},
                      headers=setup.headers("admin")).status_code == 200
    assert client.put("/api/queues/emails/share", json={"concurrency": None},
                      headers=setup.headers("admin")).status_code == 200
    assert setup.app.operator.queue_shares() == [QueueShare("emails", OTHER, 2)]  # globex's stays
