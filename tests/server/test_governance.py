"""``/api/audit/log``, ``/api/keys`` and ``/api/keys/verify`` (issue 26),
on both backends, with tokens of two tenants: each admin reads its own
tenant's log (its runs' entries, an archived run's included, and its operator
actions) and key status, never the other's, whatever it asks; a viewer or an
operator is refused; the log is ``cairn audit log --json``'s shape; the key
routes answer ids, versions and counts, never a key's material."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

import cairn
from cairn.api.keys import Keys
from cairn.cli.main import main
from cairn.security.keyring import LocalKeyring
from tests.engine.conftest import postgres_url

from .conftest import OTHER, TENANT, LiveServer, Setup
from .test_shapes import _validator
from .workflows import drain, register


def _log(client: httpx.Client, setup: Setup, who: str, **query: Any) -> httpx.Response:
    return client.get("/api/audit/log", params=query, headers=setup.headers(who))


def _whole(client: httpx.Client, setup: Setup, who: str, **query: Any) -> list[dict[str, Any]]:
    """Every page, newest first, each answer as documented; the entries oldest first."""
    found: list[dict[str, Any]] = []
    while True:
        answer = _log(client, setup, who, **query)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert not list(_validator("get", "/api/audit/log").iter_errors(body))  # as documented
        found += body["entries"]
        if body["next_after"] is None:
            return found[::-1]
        query["after"] = body["next_after"]


def test_each_tenants_admin_reads_only_its_own_log(setup: Setup, client: httpx.Client) -> None:
    app = setup.app
    ours = [app.start(setup.workflows["echo"], f"ours {i}", tenant=TENANT).run_id for i in range(2)]
    theirs = app.start(setup.workflows["echo"], "theirs", tenant=OTHER).run_id
    drain(app)
    app.operator.archive_run(ours[0])  # its entries are read from its archive

    entries = _whole(client, setup, "admin", limit=1000)
    assert entries, "the test would prove nothing"
    assert {e["tenant"] for e in entries} == {TENANT}
    assert {e["run_id"] for e in entries if e["kind"] == "run"} == set(ours)
    assert {"token.mint", "archive.move"} <= {e["event"] for e in entries if e["kind"] != "run"}
    assert theirs not in json.dumps(entries)
    assert _whole(client, setup, "admin", limit=3) == entries  # pages of 3 put together
    oldest = _log(client, setup, "admin", limit=5, order="oldest").json()
    assert oldest["entries"] == entries[:5]
    assert oldest["next_after"] is not None

    hostile = _whole(client, setup, "other-admin", limit=1000)
    assert hostile, "the other tenant has its run and its token: an empty answer would prove nothing"
    assert {e["tenant"] for e in hostile} == {OTHER}
    assert {e["run_id"] for e in hostile if e["kind"] == "run"} == {theirs}
    assert not any(run in json.dumps(hostile) for run in ours)
    # our cursor holds a place in the log, not our tenant: with it the other admin pages its own entries
    ours_next = _log(client, setup, "admin", limit=2).json()["next_after"]
    assert _whole(client, setup, "other-admin", after=ours_next, limit=1) == [
        e for e in hostile if (e["at"], e["run_id"], e["seq"]) < (entries[-2]["at"], entries[-2]["run_id"],
                                                                  entries[-2]["seq"])]
    for run_id in ours:  # naming our run is the 404 of an unknown run, archived or not
        assert _log(client, setup, "other-admin", run_id=run_id).status_code == 404
    refused = _log(client, setup, "other-admin", tenant=TENANT)
    assert refused.status_code == 400, refused.text  # a tenant is never named: the token's it is

    for who in ("viewer", "operator"):
        assert _log(client, setup, who).status_code == 403

    one = _whole(client, setup, "admin", run_id=ours[1], limit=2)
    assert one == [e for e in entries if e["kind"] == "run" and e["run_id"] == ours[1]]
    tokens = _whole(client, setup, "admin", kind="token", limit=1000)
    assert tokens == [e for e in entries if e["kind"] == "token"]
    assert _log(client, setup, "admin", limit=1).json()["entries"] == entries[-1:]  # the newest
    for bad, status in (({"after": "not-a-cursor"}, 422), ({"after": "a cursor?"}, 400),
                        ({"limit": 1001}, 400), ({"order": "sideways"}, 400)):
        refused = _log(client, setup, "admin", **bad)
        assert refused.status_code == status, (bad, refused.text)
        assert "\n" not in refused.json()["message"], refused.text

    assert app.db_url is not None
    printed = CliRunner().invoke(main, ["audit", "log", "--tenant", TENANT, "--limit", "10000", "--json",
                                        "--db", app.db_url])
    assert printed.exit_code == 0, printed.output
    assert [json.loads(line) for line in printed.stdout.splitlines()] == entries


KEK = os.urandom(32)


@pytest.fixture(params=["sqlite", "postgres"])
def sealed_setup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Setup]:
    url = (postgres_url(request.getfixturevalue("pg_url")) if request.param == "postgres"
           else f"sqlite:///{tmp_path}/cairn.db")
    app = cairn.App(db=url, keyring=LocalKeyring({"kek1": KEK}, "kek1"), lease_seconds=5.0)
    workflows = register(app)
    tokens = {role: app.tokens.mint(TENANT, role, f"{role}-bot").secret for role in ("viewer", "admin")}
    tokens["other-admin"] = app.tokens.mint(OTHER, "admin", "intruder").secret
    yield Setup(app, workflows, tokens)
    app.close()


def test_key_status_and_verify_are_the_tenants_own_and_hold_no_key_material(sealed_setup: Setup) -> None:
    setup, app = sealed_setup, sealed_setup.app
    for i in range(2):
        app.start(setup.workflows["echo"], f"ours {i}", tenant=TENANT)
    app.start(setup.workflows["echo"], "theirs", tenant=OTHER)
    drain(app)
    with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        mine = client.get("/api/keys", headers=setup.headers("admin"))
        hostile = client.get("/api/keys", headers=setup.headers("other-admin"))
        verified = client.get("/api/keys/verify", headers=setup.headers("admin"))
        verified_hostile = client.get("/api/keys/verify", headers=setup.headers("other-admin"))
        named = client.get("/api/keys", params={"tenant": TENANT}, headers=setup.headers("other-admin"))
        viewer = [client.get(p, headers=setup.headers("viewer")).status_code
                  for p in ("/api/keys", "/api/keys/verify")]
    assert mine.status_code == 200, mine.text
    status = mine.json()
    assert (status["tenant"], status["encrypted"]) == (TENANT, True)
    assert status["versions"], "the tenant's data key: the test would prove nothing"
    assert all(set(v) == {"version", "kek", "created_at"} and v["kek"] == "kek1" for v in status["versions"])
    assert sum(status["values"].values()) > 0
    assert status == {"encrypted": True, **Keys(app.store).status(TENANT)[0].as_dict()}
    assert hostile.json()["tenant"] == OTHER
    assert named.status_code == 400, named.text
    assert viewer == [403, 403]
    for answer in (mine, hostile, verified, verified_hostile):  # no KEK, no data key, wrapped or not
        for secret in _material(app):
            assert secret not in answer.content
    assert verified.json() == {"tenant": TENANT, "runs": 2, "artifacts": 0, "failures": []}
    for route, answer in (("/api/keys", mine), ("/api/keys/verify", verified)):  # as documented
        assert not list(_validator("get", route).iter_errors(answer.json())), route
    assert verified_hostile.json() == {"tenant": OTHER, "runs": 1, "artifacts": 0, "failures": []}


def _material(app: cairn.App) -> list[bytes]:
    """Every form a key's bytes could take in an answer: the KEK and each
    data key as stored (wrapped), raw, base64 and hex."""
    found = [KEK]
    for tenant in (TENANT, OTHER):
        for row in app.store.inner.data_keys(tenant):  # type: ignore[attr-defined]
            found.append(bytes(row.wrapped))
    forms = []
    for raw in found:
        forms += [raw, base64.b64encode(raw), base64.urlsafe_b64encode(raw).rstrip(b"="), raw.hex().encode()]
    return forms


def test_key_status_says_when_encryption_is_off(setup: Setup, client: httpx.Client) -> None:
    status = client.get("/api/keys", headers=setup.headers("admin"))
    assert status.json() == {"tenant": TENANT, "encrypted": False, "versions": [], "values": {}, "old": 0,
                             "old_artifacts": 0, "artifacts": {}}
    refused = client.get("/api/keys/verify", headers=setup.headers("admin"))
    assert refused.status_code == 409  # the database's state, not the request's fault
    assert "encryption at rest is off" in refused.json()["message"]
