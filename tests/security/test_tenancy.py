"""References are data: a hostile tenant names other tenants' secrets, and
damaged references arrive as input. On SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn.security.secrets import Access


def tenant_app(app: cairn.App, used: list[str]) -> cairn.Workflow[str]:
    @app.tool(effect="read")
    def call(token: cairn.SecretValue) -> str:
        used.append(token.reveal())
        return "ok"

    @app.workflow(name="t")
    def wf(ctx: cairn.Context, token: cairn.Secret) -> str:
        try:
            return call(token)
        except cairn.StepFailed as failed:
            return f"{failed.error_type}: {failed.message}"

    return wf


def test_a_tenant_reaches_only_its_own_secrets(app: cairn.App, tmp_path: Path) -> None:
    mount = tmp_path / "mount"
    (mount / "acme").mkdir(parents=True)
    (mount / "mallory").mkdir()
    (mount / "acme" / "api-token").write_text("acme-secret-token")
    (mount / "api-token").write_text("the-shared-root-token")
    app.secrets = {"files": cairn.FileSecrets(mount, per_tenant=True),
                   "env": cairn.EnvSecrets(per_tenant=True, environ={"CAIRN_SECRET_ACME_DB": "acme-db-pass"})}
    used: list[str] = []
    wf = tenant_app(app, used)
    assert app.run(wf, cairn.Secret("api-token"), tenant="acme") == "ok"
    assert app.run(wf, cairn.Secret("db", provider="env"), tenant="acme") == "ok"
    hostile = [cairn.Secret("api-token"), cairn.Secret("../acme/api-token"), cairn.Secret("acme/api-token"),
               cairn.Secret("..", provider="files"), cairn.Secret("db", provider="env"),
               cairn.Secret("acme-db", provider="env"), cairn.Secret("api-token", provider="vault")]
    for n, ref in enumerate(hostile):
        out = app.run(wf, ref, tenant="mallory", run_id=f"m{n}")
        assert out.startswith("SecretNotFound: "), (ref, out)
    assert used == ["acme-secret-token", "acme-db-pass"]


def test_an_allow_policy_refuses_before_the_provider_is_asked(app: cairn.App) -> None:
    asked: list[tuple[str, str | None]] = []

    def mint(ref: cairn.Secret, access: Access) -> str:
        asked.append((access.tenant, ref.scope))
        return f"delegated-token-for-{access.tenant}-{ref.scope}"

    grants = {"acme": {"payments:read"}}
    app.secrets = cairn.Secrets(cairn.CallableSecrets(mint),
                                allow=lambda ref, access: ref.scope in grants.get(access.tenant, set()))
    used: list[str] = []
    wf = tenant_app(app, used)
    assert app.run(wf, cairn.Secret("idp", scope="payments:read"), tenant="acme") == "ok"
    out = app.run(wf, cairn.Secret("idp", scope="payments:write"), tenant="acme", run_id="w")
    assert out == "SecretError: secret 'idp' is not available to tenant 'acme' (tool 'call')"
    out = app.run(wf, cairn.Secret("idp", scope="payments:read"), tenant="mallory", run_id="x")
    assert out.startswith("SecretError: secret 'idp' is not available to tenant 'mallory'")
    assert asked == [("acme", "payments:read")]
    assert used == ["delegated-token-for-acme-payments:read"]


@pytest.mark.parametrize("token", [
    {"$cairn": "secret", "name": ""},
    {"$cairn": "secret"},
    {"$cairn": "secret", "name": "a\u0000b"},
    {"$cairn": "secret", "name": 42},
    {"$cairn": "secret", "name": "x", "provider": ["files"]},
    {"$cairn": "password", "name": "x"},
    "plain-text-token",
    None,
])
def test_a_damaged_reference_in_the_input_is_refused_at_start(app: cairn.App, token: Any) -> None:
    tenant_app(app, [])
    with pytest.raises(cairn.PayloadError, match="input 'token' of workflow 't'") as err:
        app.start_json("t", {"token": token}, run_id="d")
    assert "\n" not in str(err.value)
    assert app.list_runs(workflow="t") == []


def test_a_reference_decoded_as_plain_json_is_still_resolved(app: cairn.App) -> None:
    """A workflow that takes its input untyped passes the reference on as a
    dict; the tool's SecretValue parameter still resolves it (and refuses a
    dict that is not a reference)."""
    app.secrets = cairn.CallableSecrets(lambda ref, access: f"value-of-{ref.name}")
    used: list[str] = []

    @app.tool(effect="read")
    def call(token: cairn.SecretValue) -> str:
        used.append(token.reveal())
        return "ok"

    @app.workflow(name="untyped")
    def untyped(ctx: cairn.Context, token: Any) -> str:
        try:
            return call(token)
        except cairn.PayloadError as exc:
            return str(exc)

    assert app.run(untyped, cairn.Secret("api")) == "ok"
    refused = app.run(untyped, {"$cairn": "secret", "name": ""}, run_id="bad")
    assert "takes a cairn.Secret reference, not a dict" in refused
    assert used == ["value-of-api"]
