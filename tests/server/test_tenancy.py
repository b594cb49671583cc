"""Tenancy and identity over HTTP: a token is its secret, not its id; what
every tenant shares (queue-wide limits, every queue's load) is the
installation's, not a tenant admin's; no token mints a role above its own."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from cairn.api.tokens import Role, TokenRefused
from cairn.store.admission import QueueLimits
from cairn.store.lifecycle import approver_matches

from .conftest import OTHER, TENANT, LiveServer, Setup
from .workflows import drain


def _with_secret(token: str, secret: str) -> str:
    prefix, token_id, _ = token.split("_", 2)
    return f"{prefix}_{token_id}_{secret}"


def test_a_known_token_id_with_a_wrong_secret_is_refused(sqlite_setup: Setup) -> None:
    tokens = sqlite_setup.app.tokens
    minted = tokens.mint(TENANT, "admin", "ada")
    assert tokens.check(minted.secret).token_id == minted.record.token_id
    other_secret = tokens.mint(TENANT, "viewer", "bob").secret.split("_", 2)[2]
    for wrong in (other_secret, "x" * 43, minted.secret.split("_", 2)[2][:-1] + "A"):
        if wrong == minted.secret.split("_", 2)[2]:
            continue
        with pytest.raises(TokenRefused):
            tokens.check(_with_secret(minted.secret, wrong))


def test_over_http_a_known_token_id_with_a_wrong_secret_is_401(setup: Setup, client: httpx.Client) -> None:
    forged = _with_secret(setup.tokens["admin"], "y" * 43)
    response = client.get("/api/whoami", headers={"Authorization": f"Bearer {forged}"})
    assert response.status_code == 401
    assert response.json()["error"] == "unauthorized"
    assert client.get("/api/whoami", headers=setup.headers("admin")).status_code == 200


def test_a_tenant_admin_cannot_set_the_limits_every_tenant_shares(setup: Setup, client: httpx.Client) -> None:
    refused = client.put("/api/queues/default", json={"rate": "1/d"}, headers=setup.headers("admin"))
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"] == "forbidden"
    assert all(q.limits.unlimited for q in setup.app.operator.queues())
    allowed = client.put("/api/queues/default", json={"rate": "1/d"}, headers=setup.headers("installation"))
    assert allowed.status_code == 200, allowed.text
    (default,) = [q for q in setup.app.operator.queues() if q.limits.name == "default"]
    assert default.limits.rate is not None
    assert default.limits.rate.limit == 1


@pytest.mark.parametrize("role", ["installation"])
def test_a_tenant_admin_cannot_mint_a_role_above_its_own(setup: Setup, client: httpx.Client,
                                                         role: str) -> None:
    before = {t.token_id for t in setup.app.tokens.list()}
    refused = client.post("/api/tokens", json={"name": "root", "role": role}, headers=setup.headers("admin"))
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"] == "forbidden"
    assert {t.token_id for t in setup.app.tokens.list()} == before
    minted = client.post("/api/tokens", json={"name": "peer", "role": "admin"},
                         headers=setup.headers("admin"))
    assert minted.status_code == 201, minted.text
    assert setup.app.tokens.check(minted.json()["token"]).role is Role.ADMIN


def test_a_viewer_sees_only_its_tenants_queues_and_load(setup: Setup, client: httpx.Client) -> None:
    app, echo = setup.app, setup.workflows["echo"]
    for i in range(3):
        app.start(echo, f"theirs {i}", tenant=OTHER, queue="globex-secret-project")
        app.start(echo, f"theirs {i}", tenant=OTHER)
    app.start(echo, "mine", tenant=TENANT)
    app.operator.set_queue(QueueLimits("emails", concurrency=5))
    listed = client.get("/api/queues", headers=setup.headers("viewer"))
    assert listed.status_code == 200, listed.text
    queues = {q["queue"]: q for q in listed.json()["queues"]}
    assert "globex-secret-project" not in queues
    assert queues["default"]["runnable"] == 1, "another tenant's load is shown"
    assert queues["emails"]["concurrency"] == 5  # the installation's limits are everyone's to read
    everything = client.get("/api/queues", headers=setup.headers("installation")).json()["queues"]
    every = {q["queue"]: q for q in everything}
    assert every["globex-secret-project"]["runnable"] == 3
    assert every["default"]["runnable"] == 4


CROSS_SITE = [{"Origin": "https://evil.example"}, {"Sec-Fetch-Site": "cross-site"},
              {"Sec-Fetch-Site": "same-site", "Origin": "https://sub.evil.example"}, {"Origin": "null"}]


@pytest.mark.parametrize("cross", CROSS_SITE)
def test_a_cross_site_form_neither_signs_in_nor_out(sqlite_setup: Setup, cross: dict[str, str]) -> None:
    """Login CSRF: a form on another site posting its own token would swap a
    signed-in user's session for another tenant's (or sign the user out)."""
    setup = sqlite_setup
    theirs = setup.app.tokens.mint(OTHER, "admin", "mallory").secret
    with LiveServer(setup.app) as live, httpx.Client(base_url=live.url, timeout=10) as http:
        http.cookies.set("cairn_token", setup.tokens["viewer"])
        login = http.post("/login", data={"token": theirs, "next": "/"}, headers=cross)
        assert login.status_code == 403, login.text
        assert "set-cookie" not in login.headers
        logout = http.post("/logout", headers=cross)
        assert logout.status_code == 403, logout.text
        assert "set-cookie" not in logout.headers
        same = {"Origin": live.url, "Sec-Fetch-Site": "same-origin"}
        ok = http.post("/login", data={"token": theirs, "next": "/"}, headers=same)
        assert ok.status_code == 303
        assert "cairn_token=" in ok.headers["set-cookie"]
        plain = http.post("/logout")  # no browser headers at all (curl): nothing to forge
        assert plain.status_code == 303


def _token_actor(setup: Setup, secret: str) -> str:
    return setup.app.tokens.check(secret).actor


def test_an_approver_is_an_identity_the_restrained_admin_cannot_mint(setup: Setup,
                                                                     client: httpx.Client) -> None:
    """``approvers=["ada"]`` restrains the tenant's admin; that admin mints
    tokens of any name (``ada``, ``ada@mallory``), so a bare name matches no
    token, and a token approves only when named by its whole identity,
    whose id the installation assigns."""
    app = setup.app
    ada = app.tokens.mint(TENANT, "operator", "ada").secret
    forged = [client.post("/api/tokens", json={"name": name, "role": "operator"},
                          headers=setup.headers("admin")).json()["token"] for name in ("ada", "ada@mallory")]
    by_name = app.start(setup.workflows["payout"], "x", 1, ["ada"], tenant=TENANT).run_id
    exact = [_token_actor(setup, ada)]
    by_identity = app.start(setup.workflows["payout"], "y", 2, exact, tenant=TENANT).run_id
    drain(app)
    requests = {a.run_id: a.request_id for a in app.approvals()}

    def approve(run_id: str, token: str) -> httpx.Response:
        return client.post(f"/api/runs/{run_id}/approvals/{requests[run_id]}/approve", json={},
                           headers={"Authorization": f"Bearer {token}"})

    for token in (*forged, ada, setup.tokens["admin"]):
        refused = approve(by_name, token)
        assert refused.status_code == 403, f"{_token_actor(setup, token)}: {refused.text}"
        assert refused.json()["error"] == "not_an_approver"
    for token in (*forged, setup.tokens["admin"]):
        assert approve(by_identity, token).status_code == 403
    assert approve(by_identity, ada).status_code == 200
    assert app.operator.approval(by_name, requests[by_name]).status.value == "pending"


@pytest.mark.parametrize(("approver", "actor", "matches"), [
    ("ada", "cli:ada@laptop", True),
    ("ada", "cli:ada@mallory@laptop", False),
    ("ada", "cli:adam@laptop", False),
    ("ada", "http:ada#0123456789abcdef", False),
    ("ada", "http:ada@mallory#0123456789abcdef", False),
    ("ada", "app:4242", False),
    ("ada", "ada", True),
    ("http:ada#0123456789abcdef", "http:ada#0123456789abcdef", True),
    ("http:ada#0123456789abcdef", "http:ada#fedcba9876543210", False),
    ("cli:ada@laptop", "cli:ada@desk", False),
])
def test_the_approver_rule(approver: str, actor: str, matches: bool) -> None:
    assert approver_matches(approver, actor) is matches


def test_a_sign_in_link_does_not_replace_a_session_by_itself(sqlite_setup: Setup) -> None:
    """``/login#token=...`` signs in by the page's own script (same origin),
    so any site could link a signed-in user into another tenant's session:
    with a session, the page asks instead of submitting."""
    setup = sqlite_setup
    with LiveServer(setup.app) as live, httpx.Client(base_url=live.url, timeout=10) as http:
        fresh = http.get("/login")
        assert 'data-signed-in' not in fresh.text
        http.cookies.set("cairn_token", setup.tokens["viewer"])
        signed_in = http.get("/login")
        assert 'id="login" data-signed-in="1"' in signed_in.text
        assert "viewer-bot" in signed_in.text
    script = (Path(__file__).resolve().parents[2] / "src/cairn/server/static/app.js").read_text("utf-8")
    assert "if (!form.dataset.signedIn) form.submit();" in script
