"""A tenant's own share of a shared queue over HTTP (issue 21): a tenant's
admin caps its own tenant's running runs and claim rate in a queue; the
tenant is the token's, never the request's; the share only ever holds that
tenant back."""

from __future__ import annotations

import httpx
import pytest

from cairn.store.admission import QueueLimits, QueueShare, Rate

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
    assert put.json() == {"queue": "emails", "tenant": TENANT, "concurrency": 1, "rate": None}
    assert _claimed_tenants(setup) == [TENANT, OTHER, OTHER, OTHER]
    assert _claimed_tenants(setup) == []  # acme's other two wait for its one slot
    shown = client.get("/api/queues/emails/share", headers=setup.headers("viewer"))
    assert shown.json() == {"queue": "emails", "tenant": TENANT, "concurrency": 1, "rate": None}
    theirs = client.get("/api/queues/emails/share", headers=setup.headers("other-admin"))
    assert theirs.json() == {"queue": "emails", "tenant": OTHER, "concurrency": None, "rate": None}


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
    ("/api/queues/emails/share", {"rate": "0/m"}),
    ("/api/queues/emails/share", {"rate": "abc"}),
    ("/api/queues/emails/share", {"rate": "1/0s"}),
    ("/api/queues/emails/share", {"rate": "1/"}),
    ("/api/queues/emails/share", {"rate": "\u0661/min"}),  # an Arabic-Indic digit
    ("/api/queues/emails/share", {"rate": 10}),
    ("/api/queues/emails/share", {"rate": "10/min", "burst": 20}),
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


@pytest.mark.parametrize("rate", ["0/m", "abc", "1/0s"])
def test_a_bad_rate_is_named_in_one_short_line(setup: Setup, client: httpx.Client, rate: str) -> None:
    refused = client.put("/api/queues/emails/share", json={"rate": rate}, headers=setup.headers("admin"))
    assert refused.status_code == 400, refused.text
    assert refused.json()["message"] == ("bad request body: Expected `str` of the form its pattern in "
                                         "/api/openapi.json gives - at `$.rate`")


def test_a_share_is_removed_with_null(setup: Setup, client: httpx.Client) -> None:
    setup.app.operator.set_queue_share(QueueShare("emails", OTHER, 2))
    assert client.put("/api/queues/emails/share", json={"concurrency": 3},
                      headers=setup.headers("admin")).status_code == 200
    assert client.put("/api/queues/emails/share", json={"concurrency": None},
                      headers=setup.headers("admin")).status_code == 200
    assert setup.app.operator.queue_shares() == [QueueShare("emails", OTHER, 2)]  # globex's stays


# -- the rate share --------------------------------------------------------------------------

HOURLY = {"limit": 2, "period": 3600.0, "burst": 2}


def test_a_tenant_admin_sets_its_own_rate_share_and_no_one_elses(setup: Setup, client: httpx.Client) -> None:
    """2 claims an hour for acme on emails: acme gets 2 of its 4 runs, globex
    all of its own; each tenant's token reads its own share only."""
    app, echo = setup.app, setup.workflows["echo"]
    for i in range(4):
        app.start(echo, f"mine {i}", tenant=TENANT, queue="emails")
        app.start(echo, f"theirs {i}", tenant=OTHER, queue="emails")
    put = client.put("/api/queues/emails/share", json={"rate": "2/h"}, headers=setup.headers("admin"))
    assert put.status_code == 200, put.text
    assert put.json() == {"queue": "emails", "tenant": TENANT, "concurrency": None, "rate": HOURLY}
    assert _claimed_tenants(setup) == [TENANT, TENANT, OTHER, OTHER, OTHER, OTHER]
    assert _claimed_tenants(setup) == []  # acme's other two wait for its tokens
    shown = client.get("/api/queues/emails/share", headers=setup.headers("viewer"))
    assert shown.json() == {"queue": "emails", "tenant": TENANT, "concurrency": None, "rate": HOURLY}
    theirs = client.get("/api/queues/emails/share", headers=setup.headers("other-admin"))
    assert theirs.json() == {"queue": "emails", "tenant": OTHER, "concurrency": None, "rate": None}


def test_a_hostile_tenant_cannot_set_or_read_another_tenants_rate_share(
    setup: Setup, client: httpx.Client
) -> None:
    """globex's admin, with its own token, tries to starve acme on a shared
    queue: a body naming acme is refused, a query naming it is not read, and
    what it sets is its own share, which leaves acme's claims alone."""
    app, echo = setup.app, setup.workflows["echo"]
    intruder = setup.headers("other-admin")
    mine = client.put("/api/queues/emails/share", json={"rate": "2/h"}, headers=setup.headers("admin"))
    assert mine.status_code == 200, mine.text
    for forged in ({"rate": "1/d", "tenant": TENANT}, {"rate": "1/d", "tenants": [TENANT]}):
        refused = client.put("/api/queues/emails/share", json=forged, headers=intruder)
        assert refused.status_code == 400, refused.text
    # a tenant in the query string is refused by name, on a write and on a read
    for method in ("PUT", "GET"):
        forged_query = client.request(method, f"/api/queues/emails/share?tenant={TENANT}", headers=intruder,
                                      json={"rate": "1/d"} if method == "PUT" else None)
        assert forged_query.status_code == 400, forged_query.text
        assert "'tenant'" in forged_query.json()["message"]
    assert setup.app.operator.queue_shares() == [QueueShare("emails", TENANT, rate=Rate(2, 3600))]
    put = client.put("/api/queues/emails/share", json={"rate": "1/d"}, headers=intruder)
    assert put.json()["tenant"] == OTHER, put.text
    read = client.get("/api/queues/emails/share", headers=intruder)
    assert read.json()["tenant"] == OTHER
    assert read.json()["rate"] == {"limit": 1, "period": 86400.0, "burst": 1}
    assert setup.app.operator.queue_shares() == [QueueShare("emails", TENANT, rate=Rate(2, 3600)),
                                                 QueueShare("emails", OTHER, rate=Rate(1, 86400))]
    for i in range(3):
        app.start(echo, f"mine {i}", tenant=TENANT, queue="emails")
    assert _claimed_tenants(setup) == [TENANT, TENANT]  # acme's own share, not globex's 1/d


def test_a_rate_share_above_the_installations_per_tenant_rate_is_refused(
    setup: Setup, client: httpx.Client
) -> None:
    limits = client.put("/api/queues/emails", json={"tenant_rate": "10/min"},
                        headers=setup.headers("installation"))
    assert limits.status_code == 200, limits.text
    for rate in ("20/min", "1/s", "11/min"):
        refused = client.put("/api/queues/emails/share", json={"concurrency": 2, "rate": rate},
                             headers=setup.headers("admin"))
        assert refused.status_code == 400, refused.text
        message = refused.json()["message"]
        assert "installation's per-tenant rate 10/min" in message
        assert "\n" not in message
    assert setup.app.operator.queue_shares() == []
    put = client.put("/api/queues/emails/share", json={"rate": "5/min"}, headers=setup.headers("admin"))
    assert put.status_code == 200, put.text


def test_a_rate_share_is_removed_with_null(setup: Setup, client: httpx.Client) -> None:
    headers = setup.headers("admin")
    assert client.put("/api/queues/emails/share", json={"concurrency": 3, "rate": "2/h"},
                      headers=headers).status_code == 200
    kept = client.put("/api/queues/emails/share", json={"concurrency": 3, "rate": None}, headers=headers)
    assert kept.json()["rate"] is None
    assert setup.app.operator.queue_shares() == [QueueShare("emails", TENANT, 3)]
    assert client.put("/api/queues/emails/share", json={}, headers=headers).status_code == 200
    assert setup.app.operator.queue_shares() == []
    shown = client.get("/api/queues/emails/share", headers=setup.headers("viewer"))
    assert shown.json() == {"queue": "emails", "tenant": TENANT, "concurrency": None, "rate": None}
