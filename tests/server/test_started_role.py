"""A run started through the HTTP API records the token's role and id, so
a tool restricted by role (``cairn.ToolAccess(role=...)``) allows it the
rights of the token that started it, wherever it later executes."""

from __future__ import annotations

import httpx
import pytest

import cairn
from cairn.store.records import EventType

from .conftest import LiveServer, Setup


def test_a_run_started_over_http_has_the_tokens_rights(setup: Setup) -> None:
    ran: list[str] = []
    app = setup.app

    @app.tool(effect="write", access=cairn.ToolAccess(role="admin"))
    def rotate_keys(scope: str) -> str:
        ran.append(scope)
        return f"rotated {scope}"

    @app.workflow(name="rotate")
    def rotate(ctx: cairn.Context, scope: str) -> str:
        return rotate_keys(scope)

    with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=30) as http:
        started = {}
        for who in ("operator", "admin"):
            answer = http.post("/api/runs", headers=setup.headers(who),
                               json={"workflow": "rotate", "input": {"scope": who}, "run_id": f"by-{who}"})
            assert answer.status_code == 201, answer.text
            started[who] = answer.json()["run"]["run_id"]
    operator_token = app.tokens.check(setup.tokens["operator"]).token_id
    assert app.store.started_with(started["operator"]) == ("operator", operator_token)
    refused = rf"started as operator \(token {operator_token}\) may not call it"
    with pytest.raises(cairn.RunFailed, match=refused):
        app.resume(started["operator"])
    assert app.resume(started["admin"]) == "rotated admin"
    assert ran == ["admin"]
    [refused] = [e for e in app.history(started["operator"]) if e.event is EventType.STEP_FAILED]
    assert refused.name == "rotate_keys"
