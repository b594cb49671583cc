"""``cairn mcp serve`` driven by the official SDK's client over stdio: every
tool, tenant isolation, roles, and markup in data shown as data."""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

import cairn
from cairn.store.records import RunStatus
from tests.backends import StoreBackend
from tests.processes import REPO_ROOT
from tests.processes import run as run_child

pytestmark = pytest.mark.slow  # each test starts `cairn mcp serve`


class Client:
    """Calls tools of one ``cairn mcp serve`` process (one token)."""

    def __init__(self, db: str, token: str) -> None:
        self.params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "cairn", "mcp", "serve", "--app", "tests.mcptools.serve_app:app"],
            env={"CAIRN_TOKEN": token, "CAIRN_TEST_DB": db, "CAIRN_DB": db, "PATH": "/usr/bin:/bin",
                 "PYTHONPATH": f"{REPO_ROOT / 'src'}:{REPO_ROOT}"}, cwd=str(REPO_ROOT))

    def session(self, calls: list[tuple[str, dict[str, Any]]]) -> list[tuple[bool, Any]]:
        """Each call's (is_error, JSON or text), in one session."""
        async def go() -> list[tuple[bool, Any]]:
            out = []
            async with stdio_client(self.params) as (r, w), ClientSession(r, w) as s:
                await s.initialize()
                for name, arguments in calls:
                    if name == "@resource":
                        from pydantic import AnyUrl

                        read = await s.read_resource(AnyUrl(arguments["uri"]))
                        out.append((False, json.loads(read.contents[0].text)))  # type: ignore[union-attr]
                        continue
                    if name == "@tools":
                        out.append((False, sorted(t.name for t in (await s.list_tools()).tools)))
                        continue
                    result = await s.call_tool(name, arguments)
                    text = "".join(getattr(c, "text", "") for c in result.content)
                    try:
                        value = json.loads(text)
                    except ValueError:
                        value = text
                    if result.isError:  # FastMCP says which tool failed, then the error's one line
                        value = text.split(": ", 1)[1] if text.startswith("Error executing tool") else text
                    out.append((result.isError, value))
            return out

        return asyncio.run(go())


@pytest.fixture
def world(backend: StoreBackend, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[cairn.App, str]]:
    """The app module on a fresh database, SQLite or PostgreSQL (the server process imports it too)."""
    db = backend.url
    monkeypatch.setenv("CAIRN_TEST_DB", db)
    sys.modules.pop("tests.mcptools.serve_app", None)
    serve_app = importlib.import_module("tests.mcptools.serve_app")
    try:
        yield serve_app.app, db
    finally:
        serve_app.app.close()
        sys.modules.pop("tests.mcptools.serve_app", None)


def token(app: cairn.App, tenant: str, role: str) -> str:
    return app.tokens.mint(tenant, role, f"{tenant}-{role}").secret


def test_every_tool_start_read_approve_signal(world: tuple[cairn.App, str]) -> None:
    app, db = world
    secret = token(app, "acme", "operator")
    acme = Client(db, secret)
    [(_, tools), (err, started), (err2, waiting)] = acme.session([
        ("@tools", {}),
        ("start_run", {"workflow": "payout", "input": {"cents": 1250}, "run_id": "p1"}),
        ("start_run", {"workflow": "waiter", "run_id": "w1"}),
    ])
    assert tools == ["approve", "get_run", "list_approvals", "list_runs", "reject", "signal", "start_run"]
    assert not err
    assert not err2
    assert started["created"] is True
    assert started["run"]["tenant"] == "acme"
    p1, w1 = started["run"]["run_id"], waiting["run"]["run_id"]
    # the run has the rights of the token that started it, wherever it runs (engine.startedwith)
    assert app.store.started_with(p1) == ("operator", app.tokens.check(secret).token_id)
    app.worker().run(max_idle=0.5)  # both runs now wait: for an approval, for a signal
    answers = acme.session([
        ("list_approvals", {}),
        ("list_runs", {"status": "suspended"}),
    ])
    [(_, approvals), (_, runs)] = answers
    [request] = approvals["approvals"]
    assert request["run_id"] == p1
    assert request["details"] == {"cents": 1250}
    assert {r["run_id"] for r in runs["runs"]} == {p1, w1}
    [(e1, decided), (e2, sent), (e3, again)] = acme.session([
        ("approve", {"run_id": p1, "request_id": request["request_id"], "comment": "ok"}),
        ("signal", {"run_id": w1, "name": "go", "data": "<b>now</b>"}),
        ("start_run", {"workflow": "payout", "input": {"cents": 1250}, "run_id": "p1"}),  # idempotent
    ])
    assert (e1, e2, e3) == (False, False, False)
    assert decided["status"] == "approved"
    assert decided["decided_by"].startswith("mcp:acme-operator#")
    assert sent["delivered"] is True
    assert again["created"] is False
    app.worker().run(max_idle=0.5)
    [(_, shown_p), (_, shown_w), (_, resource)] = acme.session([
        ("get_run", {"run_id": p1}), ("get_run", {"run_id": w1}), ("@resource", {"uri": f"cairn://runs/{w1}"}),
    ])
    assert shown_p["status"] == "completed"
    assert shown_p["result"] == "approved: 1250"
    assert shown_w["result"] == "got <b>now</b>"  # markup is data
    assert resource["run_id"] == w1
    assert app.get_run(p1).status is RunStatus.COMPLETED


def test_tenants_are_isolated(world: tuple[cairn.App, str]) -> None:
    app, db = world
    [(_, started)] = Client(db, token(app, "acme", "operator")).session(
        [("start_run", {"workflow": "waiter", "run_id": "secret-run"})])
    theirs = started["run"]["run_id"]
    app.worker().run(max_idle=0.5)
    other = Client(db, token(app, "globex", "admin"))
    answers = other.session([
        ("get_run", {"run_id": theirs}),
        ("signal", {"run_id": theirs, "name": "go", "data": "x"}),
        ("list_runs", {}),
        ("list_approvals", {"run_id": theirs}),
        ("get_run", {"run_id": "no-such-run"}),
        ("start_run", {"workflow": "waiter", "run_id": "secret-run"}),  # its own namespace: a new run
    ])
    assert answers[0] == (True, f"run {theirs!r} not found")
    assert answers[1] == (True, f"run {theirs!r} not found")
    assert answers[2] == (False, {"runs": []})
    assert answers[3][0] is True
    assert answers[4] == (True, "run 'no-such-run' not found")  # the same words as another tenant's run
    assert answers[5][0] is False
    assert answers[5][1]["run"]["run_id"] != theirs
    assert app.get_run(theirs).status is RunStatus.SUSPENDED  # no signal reached it


def test_roles_as_in_the_http_api(world: tuple[cairn.App, str]) -> None:
    app, db = world
    viewer = Client(db, token(app, "acme", "viewer"))
    answers = viewer.session([
        ("list_runs", {}),
        ("start_run", {"workflow": "waiter"}),
        ("signal", {"run_id": "x", "name": "go"}),
        ("approve", {"run_id": "x", "request_id": "1"}),
    ])
    assert answers[0] == (False, {"runs": []})
    for refused in answers[1:]:
        assert refused == (True, "refused: this needs a operator token (this one is viewer)")


def test_a_bad_token_is_one_line_and_no_server(world: tuple[cairn.App, str]) -> None:
    _, db = world
    done = run_child("cairn", ["mcp", "serve", "--db", db], timeout=60,
                     env={"CAIRN_TOKEN": "cairn_0000000000000000_" + "x" * 40,
                          "PYTHONPATH": f"{REPO_ROOT / 'src'}:{REPO_ROOT}"})
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
