"""``cairn mcp serve`` driven by the official SDK's client, over stdio (a
``cairn mcp serve`` process acting as one token) and over streamable HTTP
(``cairn.mcpserve.http_app`` in uvicorn, each request with its own token):
every tool, tenant isolation, roles, and markup in data shown as data."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

import cairn
from cairn.mcpserve import http_app
from cairn.store.records import RunStatus
from tests.backends import StoreBackend
from tests.processes import REPO_ROOT, spawn
from tests.processes import run as run_child

pytestmark = pytest.mark.slow  # each test starts `cairn mcp serve`


class Client:
    """Calls tools of ``cairn mcp serve`` as one token: a process of its
    own over stdio, or the test's HTTP server (``url``)."""

    def __init__(self, db: str, token: str, url: str | None = None) -> None:
        self.token = token
        self.url = url
        self.params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "cairn", "mcp", "serve", "--app", "tests.mcptools.serve_app:app"],
            env={"CAIRN_TOKEN": token, "CAIRN_TEST_DB": db, "CAIRN_DB": db, "PATH": "/usr/bin:/bin",
                 "PYTHONPATH": f"{REPO_ROOT / 'src'}:{REPO_ROOT}"}, cwd=str(REPO_ROOT))

    @contextlib.asynccontextmanager
    async def _streams(self) -> AsyncIterator[tuple[Any, Any]]:
        if self.url is None:
            async with stdio_client(self.params) as (r, w):
                yield r, w
        else:
            headers = {"Authorization": f"Bearer {self.token}"}
            async with httpx.AsyncClient(headers=headers, timeout=30) as http, \
                    streamable_http_client(self.url, http_client=http) as (r, w, _):
                yield r, w

    def session(self, calls: list[tuple[str, dict[str, Any]]]) -> list[tuple[bool, Any]]:
        """Each call's (is_error, JSON or text), in one session."""
        async def go() -> list[tuple[bool, Any]]:
            out = []
            async with self._streams() as (r, w), ClientSession(r, w) as s:
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


class HTTPServer:
    """``http_app(app)`` served by uvicorn on 127.0.0.1, in a thread."""

    def __init__(self, app: cairn.App) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        config = uvicorn.Config(http_app(app, "127.0.0.1", self.port), host="127.0.0.1", port=self.port,
                                log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> HTTPServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


Connect = Callable[[str], Client]


@pytest.fixture(params=["stdio", "http"])
def connect(request: pytest.FixtureRequest, world: tuple[cairn.App, str]) -> Iterator[Connect]:
    """A client of one token, over the transport of the test's parameter."""
    app, db = world
    if request.param == "stdio":
        yield lambda secret: Client(db, secret)
        return
    with HTTPServer(app) as served:
        yield lambda secret: Client(db, secret, served.url)


def token(app: cairn.App, tenant: str, role: str) -> str:
    return app.tokens.mint(tenant, role, f"{tenant}-{role}").secret


def test_every_tool_start_read_approve_signal(world: tuple[cairn.App, str], connect: Connect) -> None:
    app, _ = world
    secret = token(app, "acme", "operator")
    acme = connect(secret)
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


def test_tenants_are_isolated(world: tuple[cairn.App, str], connect: Connect) -> None:
    app, _ = world
    [(_, started)] = connect(token(app, "acme", "operator")).session(
        [("start_run", {"workflow": "waiter", "run_id": "secret-run"})])
    theirs = started["run"]["run_id"]
    app.worker().run(max_idle=0.5)
    other = connect(token(app, "globex", "admin"))
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


def test_roles_as_in_the_http_api(world: tuple[cairn.App, str], connect: Connect) -> None:
    app, _ = world
    viewer = connect(token(app, "acme", "viewer"))
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


def test_over_http_each_request_presents_a_live_token(world: tuple[cairn.App, str]) -> None:
    """No token, a malformed one, an unknown one, a revoked one: 401 before
    the SDK reads the request, one line, nothing started. A session opened
    with one token and used with another acts as the other (its own rights):
    the session id is no credential."""
    app, _ = world
    revoked = app.tokens.mint("acme", "admin", "gone")
    app.tokens.revoke(revoked.record.token_id)
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    accept = {"Accept": "application/json, text/event-stream"}
    with HTTPServer(app) as served, httpx.Client(timeout=30) as http:
        for given in (None, "Basic abc", "Bearer", "Bearer cairn_0000000000000000_" + "x" * 40,
                      f"Bearer {revoked.secret}"):
            headers = {**accept, **({"Authorization": given} if given else {})}
            answer = http.post(served.url, json=initialize, headers=headers)
            assert answer.status_code == 401, (given, answer.text)
            assert answer.json()["error"] == "unauthorized"
            assert answer.headers["www-authenticate"] == "Bearer"
        operator = token(app, "acme", "operator")
        viewer = token(app, "acme", "viewer")
        opened = http.post(served.url, json=initialize,
                           headers={**accept, "Authorization": f"Bearer {viewer}"})
        assert opened.status_code == 200, opened.text
        session = opened.headers["mcp-session-id"]
        common = {**accept, "mcp-session-id": session, "mcp-protocol-version": "2025-06-18"}
        http.post(served.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                  headers={**common, "Authorization": f"Bearer {viewer}"})
        start = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                 "params": {"name": "start_run", "arguments": {"workflow": "waiter", "run_id": "w"}}}
        as_viewer = http.post(served.url, json=start, headers={**common, "Authorization": f"Bearer {viewer}"})
        refused = _rpc_result(as_viewer)
        assert refused["isError"] is True
        assert "this needs a operator token (this one is viewer)" in refused["content"][0]["text"]
        assert app.list_runs() == []
        as_nobody = http.post(served.url, json=start, headers=common)  # the session id alone
        assert as_nobody.status_code == 401
        assert app.list_runs() == []
        as_operator = http.post(served.url, json=start,
                                headers={**common, "Authorization": f"Bearer {operator}"})
        result = _rpc_result(as_operator)
        assert result["isError"] is False
        assert json.loads(result["content"][0]["text"])["created"] is True
        [run] = app.list_runs()
        assert app.store.started_with(run.run_id) == ("operator", app.tokens.check(operator).token_id)


def _rpc_result(answer: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC result of a streamable HTTP answer (JSON, or one SSE event)."""
    assert answer.status_code == 200, answer.text
    text = answer.text
    if answer.headers.get("content-type", "").startswith("text/event-stream"):
        text = next(line[len("data:"):] for line in text.splitlines() if line.startswith("data:"))
    result = json.loads(text)["result"]
    assert isinstance(result, dict)
    return result


def test_the_cli_serves_streamable_http(world: tuple[cairn.App, str], tmp_path: Path) -> None:
    """``cairn mcp serve --http HOST:PORT`` as a process: the SDK's client
    reaches it with a token; a bad address is one line and no server."""
    app, db = world
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    env = {"CAIRN_TEST_DB": db, "PYTHONPATH": f"{REPO_ROOT / 'src'}:{REPO_ROOT}"}
    child = spawn("cairn", ["mcp", "serve", "--app", "tests.mcptools.serve_app:app", "--db", db,
                            "--http", f"127.0.0.1:{port}"], env=env, log=tmp_path / "serve.log")
    try:
        deadline = time.monotonic() + 60
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert child.poll() is None, (tmp_path / "serve.log").read_text()
            assert time.monotonic() < deadline, "cairn mcp serve --http did not listen"
            time.sleep(0.1)
        client = Client(db, token(app, "acme", "viewer"), f"http://127.0.0.1:{port}/mcp")
        [(_, tools), (err, runs)] = client.session([("@tools", {}), ("list_runs", {})])
        assert "start_run" in tools
        assert (err, runs) == (False, {"runs": []})
    finally:
        child.terminate()
        child.wait(timeout=30)
    done = run_child("cairn", ["mcp", "serve", "--db", db, "--http", "nowhere"], timeout=60, env=env)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "expected HOST:PORT" in done.stderr
