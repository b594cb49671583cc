"""``/api/erasures``: an admin erases a subject of its own tenant, never
another tenant's (the tenant is the token's, not the request's); viewers
and operators are refused; the erasure record names the token that did it."""

from __future__ import annotations

import httpx

from .conftest import OTHER, TENANT, Setup


def test_only_an_admin_erases_and_only_its_own_tenants_subject(setup: Setup, client: httpx.Client) -> None:
    app = setup.app
    answer = client.post("/api/runs", headers=setup.headers("admin"),
                         json={"workflow": "echo", "input": {"text": "zoe's words"}, "subject": "zoe"})
    assert answer.status_code == 201, answer.text
    mine = answer.json()["run"]["run_id"]
    theirs = app.start("echo", "globex's zoe", tenant=OTHER, subject="zoe").run_id
    assert app.store.run_subject(mine) == "zoe"

    for who in ("viewer", "operator"):
        refused = client.post("/api/erasures", headers=setup.headers(who), json={"subject": "zoe"})
        assert refused.status_code == 403, refused.text
    for body in ({}, {"subject": "zoe", "thread": "t"}, {"subject": "zoe", "tenant": TENANT}):
        answer = client.post("/api/erasures", headers=setup.headers("admin"), json=body)
        assert answer.status_code in (400, 422), answer.text

    # the other tenant's admin names the same subject: its own tenant's zoe goes, never ours
    other = client.post("/api/erasures", headers=setup.headers("other-admin"), json={"subject": "zoe"})
    assert other.status_code == 201, other.text
    assert other.json()["tenant"] == OTHER
    assert other.json()["counts"]["runs"] == 1
    assert app.store.get_run(theirs) is None
    assert app.store.get_run(mine) is not None

    planned = client.post("/api/erasures", headers=setup.headers("admin"), json={"subject": "zoe",
                                                                                   "dry_run": True})
    assert planned.status_code == 200
    assert planned.json()["counts"]["runs"] == 1
    assert app.store.get_run(mine) is not None
    done = client.post("/api/erasures", headers=setup.headers("admin"), json={"subject": "zoe"})
    assert done.status_code == 201, done.text
    assert app.store.get_run(mine) is None
    admin = app.tokens.check(setup.tokens["admin"])
    listed = client.get("/api/erasures", headers=setup.headers("admin")).json()["erasures"]
    assert [(r["tenant"], r["actor"]) for r in listed] == [(TENANT, f"http:admin-bot#{admin.token_id}")]
    # the operator log of the tenant has the erasure's start and finish, by the token (issue 26)
    logged = [(e.event, e.actor, e.auth) for e in app.audit.log(kind="erasure", tenant=TENANT)]
    assert logged == [(action, f"http:admin-bot#{admin.token_id}", "api-token")
                      for action in ("erasure.start", "erasure.finish")]
    assert "zoe" not in str(listed)
