"""``/api/runs/{run_id}/archive`` and ``/restore`` (issue 26 item 5), on
both backends: an operator archives and restores a closed run of its own
tenant, a viewer may only see where it is, another tenant's admin gets the
404 an unknown run gets; the token's identity is recorded as who archived
and who restored (the operator log, authenticated by API token), and the
run reads the same while archived."""

from __future__ import annotations

from typing import Any

import httpx

from .conftest import OTHER, TENANT, Setup
from .workflows import drain


def test_archive_show_and_restore_a_run_over_http(setup: Setup, client: httpx.Client) -> None:
    app = setup.app
    run_id = app.start(setup.workflows["echo"], "archive me", tenant=TENANT).run_id
    drain(app)
    assert app.get_run(run_id).status.value == "completed"
    history = client.get(f"/api/runs/{run_id}/history", headers=setup.headers("viewer")).json()
    path = f"/api/runs/{run_id}"

    assert client.post(path + "/archive", headers=setup.headers("viewer")).status_code == 403
    for verb, where in (("POST", "/archive"), ("GET", "/archive"), ("POST", "/restore")):
        other = client.request(verb, path + where, headers=setup.headers("other-admin"))
        assert other.status_code == 404, other.text  # another tenant's run: unknown to it
    assert client.get(path + "/archive", headers=setup.headers("viewer")).json() == {
        "run_id": run_id, "archived": False, "archive": None}

    archived = client.post(path + "/archive", headers=setup.headers("operator"))
    assert archived.status_code == 201, archived.text
    operator = f"http:operator-bot#{app.tokens.check(setup.tokens['operator']).token_id}"
    assert (archived.json()["actor"], archived.json()["restored_by"]) == (operator, None)
    assert app.store.run_archive(run_id) is not None
    shown = client.get(path + "/archive", headers=setup.headers("viewer")).json()
    assert shown["archived"] is True
    assert shown["archive"]["ref"] == archived.json()["ref"]
    assert client.get(path + "/history", headers=setup.headers("viewer")).json() == history
    again = client.post(path + "/archive", headers=setup.headers("operator"))
    assert again.status_code == 409, again.text  # archived already

    restored = client.post(path + "/restore", headers=setup.headers("admin"))
    assert restored.status_code == 200, restored.text
    admin = f"http:admin-bot#{app.tokens.check(setup.tokens['admin']).token_id}"
    assert restored.json()["restored_by"] == admin
    assert app.store.run_archive(run_id) is None
    assert client.post(path + "/restore", headers=setup.headers("admin")).status_code == 409  # hot
    log = [(r[5], r[6], r[7]) for r in app.store.operator_log(tenant=TENANT) if r[4] == run_id]
    assert log == [("archive.move", operator, "api-token"), ("archive.restore", admin, "api-token")]
    assert not [r for r in app.store.operator_log(tenant=OTHER) if r[4] == run_id]


def test_only_a_closed_run_is_archived_over_http(setup: Setup, client: httpx.Client) -> None:
    run_id = setup.app.start(setup.workflows["echo"], "still pending", tenant=TENANT).run_id
    refused = client.post(f"/api/runs/{run_id}/archive", headers=setup.headers("operator"))
    assert refused.status_code == 409
    assert "only a closed run is archived" in refused.json()["message"]
    assert setup.app.store.run_archive(run_id) is None


def test_the_decided_approvals_inbox_lists_archived_runs_of_its_tenant_only(setup: Setup,
                                                                            client: httpx.Client) -> None:
    """``GET /api/approvals?pending=false`` (and the MCP and CLI listings over the same store
    call) answers the same after the runs are archived; the other tenant's never shows."""
    app = setup.app
    ours = [app.start(setup.workflows["payout"], "ada", i, tenant=TENANT).run_id for i in (1, 2)]
    theirs = app.start(setup.workflows["payout"], "eve", 9, tenant=OTHER).run_id
    drain(app)
    for run_id, who in ((ours[0], "operator"), (ours[1], "operator"), (theirs, "other-admin")):
        (request,) = client.get("/api/approvals", params={"run_id": run_id},
                                headers=setup.headers(who)).json()["approvals"]
        decided = client.post(f"/api/runs/{run_id}/approvals/{request['request_id']}/approve", json={},
                              headers=setup.headers(who))
        assert decided.status_code == 200, decided.text
    drain(app)

    def inbox(who: str, **query: Any) -> Any:
        found = client.get("/api/approvals", params={"pending": "false", **query}, headers=setup.headers(who))
        assert found.status_code == 200, found.text
        return found.json()["approvals"]

    hot = {"ours": inbox("viewer"), "first": inbox("viewer", limit=1), "theirs": inbox("other-admin")}
    # oldest request first (the runs' workers may ask in either order), then run and request id
    assert sorted(a["run_id"] for a in hot["ours"]) == sorted(ours)
    assert hot["ours"] == sorted(hot["ours"], key=lambda a: (a["requested_at"], a["run_id"], a["request_id"]))
    assert hot["first"] == hot["ours"][:1]
    assert [a["run_id"] for a in hot["theirs"]] == [theirs]
    for run_id in (*ours, theirs):
        assert app.get_run(run_id).status.value == "completed"
        app.operator.archive_run(run_id)
    assert {"ours": inbox("viewer"), "first": inbox("viewer", limit=1), "theirs": inbox("other-admin")} == hot
