"""MCP servers' tools as journaled Cairn tools, against real MCP servers
written with the official SDK (tests/mcptools/mcp_server.py) over stdio and
streamable HTTP: effect classes from annotations (pessimistically) and from
the app, the tool list journaled once per run, a lying server, a changing
tool list, a hanging server, a 10 MB answer, a server crashing mid-call,
refused tenants and workflows, and the egress rule."""

from __future__ import annotations

import re
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn.mcp import Egress, EgressRefused, MCPServer, ToolAccess
from cairn.mcp.server import Listed, OutputCheck, _result
from cairn.store.records import EventType, HistoryEvent, RunStatus
from tests.backends import StoreBackend
from tests.mcptools.conftest import EGRESS, SERVER_SCRIPT
from tests.processes import spawn

MakeServer = Callable[..., MCPServer]
pytestmark = pytest.mark.slow  # every test starts an MCP server process


def entries(app: cairn.App, run_id: str, kind: str, event: EventType = EventType.STEP_COMPLETED,
            ) -> list[HistoryEvent]:
    return [e for e in app.history(run_id) if e.step_kind == kind and e.event is event]


def world(state: Path) -> list[str]:
    return state.read_text().splitlines()


def test_effect_classes_come_from_annotations_and_the_list_is_journaled_once(
    app: cairn.App, make_server: MakeServer, state: Path
) -> None:
    server = make_server()

    @app.workflow(name="use")
    def use(ctx: cairn.Context) -> list[Any]:
        specs = server.tools()
        again = server.tools()
        looked = server.call("t__lookup", {"key": "k1"})  # as a model names it
        stored = server.call("put", {"key": "k", "value": "v"})
        sent = server.call("send", {"to": "ada", "text": "hi"})
        assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,64}", spec["function"]["name"]) for spec in specs)
        return [len(specs), specs == again, looked["text"], stored["text"], sent["text"]]

    count, same, *texts = app.run(use, run_id="use")
    assert same
    assert count >= 8
    assert texts == ["value of k1", "stored", "sent"]
    [listing] = entries(app, "use", "mcp")  # once per run
    listed = {t.name: t for t in app.runtime.payloads.load(listing.payload, list[Listed],  # type: ignore[arg-type]
                                                             what="the list")}
    assert {n: listed[n].effect for n in ("lookup", "put", "send", "lie", "crash")} == {
        "lookup": "read", "put": "idempotent", "send": "write", "lie": "read", "crash": "write"}
    # the intents of the idempotent and write calls are journaled before they run (not the read's)
    intents = [e for e in app.history("use") if e.event is EventType.OP_INTENT]
    assert [e.name for e in intents] == ["t.put", "t.send"]
    # the idempotent tool got the operation id as its idempotency key
    [put_line] = [line for line in world(state) if line.startswith("put")]
    assert put_line.split("key=")[1] == (intents[0].detail or {})["operation_id"], intents[0].detail


def test_the_apps_configuration_overrides_a_lying_servers_hints(
    app: cairn.App, make_server: MakeServer, state: Path
) -> None:
    """``lie`` says it is read-only and writes: configured as a write, its
    intent is recorded before it runs, and a server crash mid-call sends
    the run to needs_attention instead of repeating the effect."""
    server = make_server(effects={"lie": "write", "crash": "write"})

    @app.workflow(name="careful")
    def careful(ctx: cairn.Context) -> str:
        server.call("lie", {"text": "once"})
        return str(server.call("crash", {"text": "mid-call"}))

    handle = app.start(careful, run_id="careful")
    app.worker().run(max_idle=0.5)
    record = app.store.get_run("careful")  # type: ignore[attr-defined]
    assert record is not None
    assert record.status is RunStatus.NEEDS_ATTENTION
    assert [e.name for e in app.history("careful") if e.event is EventType.OP_INTENT] == ["t.lie", "t.crash"]
    assert world(state) == ["lie once", "crash mid-call"]  # each effect once
    assert handle.run_id == "careful"


def test_a_changing_tool_list_does_not_change_the_runs_list(
    app: cairn.App, make_server: MakeServer
) -> None:
    server = make_server()

    @app.workflow(name="changing")
    def changing(ctx: cairn.Context) -> str:
        before = [s["function"]["name"] for s in server.tools()]
        server.call("remove_lookup", {})
        after = [s["function"]["name"] for s in server.tools()]
        assert before == after  # the run's list, not the server's
        server.call("lookup", {"key": "gone"})  # the server no longer has it: its error result
        return "unreachable"

    with pytest.raises(cairn.RunFailed, match=r"MCPToolError: MCP tool t\.lookup answered with an error"):
        app.run(changing, run_id="changing")
    assert len(entries(app, "changing", "mcp")) == 1


def test_a_tool_missing_from_the_runs_list_is_refused_and_recorded(
    app: cairn.App, make_server: MakeServer
) -> None:
    server = make_server()

    @app.workflow(name="missing")
    def missing(ctx: cairn.Context) -> None:
        server.call("drop_database", {})

    with pytest.raises(cairn.RunFailed, match=r"ToolRefused: the run's list of MCP server 't' has no tool"):
        app.run(missing, run_id="missing")
    [refused] = entries(app, "missing", "tool", EventType.STEP_FAILED)
    assert refused.name == "t.drop_database"


def test_an_unauthorized_tenant_or_workflow_is_refused_and_recorded(
    app: cairn.App, make_server: MakeServer, state: Path
) -> None:
    server = make_server(access={"send": ToolAccess(tenants=frozenset({"acme"})),
                                 "put": ToolAccess(workflows=frozenset({"admin"}))})

    @app.workflow(name="intruder")
    def intruder(ctx: cairn.Context, tool: str) -> None:
        server.call(tool, {"key": "k", "value": "v"} if tool == "put" else {"to": "x", "text": "y"})

    with pytest.raises(cairn.RunFailed, match=r"tool t\.send refused: tenant 'default' may not call it"):
        app.run(intruder, "send", run_id="wrong-tenant")
    with pytest.raises(cairn.RunFailed, match=r"tool t\.put refused: workflow 'intruder' may not call it"):
        app.run(intruder, "put", run_id="wrong-workflow")
    assert len(entries(app, "wrong-tenant", "tool", EventType.STEP_FAILED)) == 1
    assert world(state) == []  # never sent

    @app.workflow(name="acme-agent")
    def allowed(ctx: cairn.Context) -> str:
        return str(server.call("send", {"to": "x", "text": "allowed"})["text"])

    assert app.run(allowed, run_id="acme-run", tenant="acme") == "sent"
    assert world(state) == ["send x: allowed"]


def test_a_run_started_below_the_tools_role_is_refused_and_recorded(
    app: cairn.App, make_server: MakeServer, state: Path
) -> None:
    """The role is the run's, recorded at its start: a viewer's run calling
    a tool the app reserves to admin is refused, before anything is sent."""
    server = make_server(access={"send": ToolAccess(role="admin")})

    @app.workflow(name="mailer")
    def mailer(ctx: cairn.Context, text: str) -> str:
        return str(server.call("send", {"to": "x", "text": text})["text"])

    with pytest.raises(cairn.RunFailed, match=r"tool t\.send refused: a run started as viewer \(token tv\) "
                                              r"may not call it: it needs admin"):
        app.run(mailer, "from a viewer", run_id="viewer-run", started_role="viewer", started_token="tv")
    [refused] = entries(app, "viewer-run", "tool", EventType.STEP_FAILED)
    assert refused.name == "t.send"
    assert world(state) == []  # never sent
    assert app.run(mailer, "from an admin", run_id="admin-run", started_role="admin") == "sent"
    assert world(state) == ["send x: from an admin"]


def test_a_hanging_server_times_out(app: cairn.App, make_server: MakeServer) -> None:
    server = make_server(timeout=2.0)

    @app.workflow(name="hang")
    def hang(ctx: cairn.Context) -> None:
        server.call("sleep", {"seconds": 60})

    started = time.monotonic()
    # whichever fires first: the tool's timeout in the ledger, or the SDK's own
    with pytest.raises(cairn.RunFailed, match=r"t\.sleep.*([Tt]imed out|did not answer|did not return)"):
        app.run(hang, run_id="hang")
    assert time.monotonic() - started < 30


def test_a_10_mb_answer_is_stored_by_reference(app: cairn.App, make_server: MakeServer) -> None:
    # 10 MB through stdio and the SDK's validation took over 20 s at load ~20 on two cores: the
    # tool's timeout here bounds a hang, not the speed under test
    server = make_server(timeout=180.0)

    @app.workflow(name="large")
    def large(ctx: cairn.Context) -> int:
        return len(server.call("big", {"megabytes": 10})["text"])

    assert app.run(large, run_id="large") == 10 * 1024 * 1024
    [done] = [e for e in entries(app, "large", "tool") if e.name == "t.big"]
    assert done.payload is not None
    assert done.payload.ref is not None  # an artifact, not inline in the history row


def test_an_error_result_is_a_definite_failure(app: cairn.App, make_server: MakeServer) -> None:
    server = make_server(effects={"fail": "write"})

    @app.workflow(name="failing")
    def failing(ctx: cairn.Context) -> None:
        server.call("fail", {"why": "no such account"})

    with pytest.raises(cairn.RunFailed, match="no such account"):
        app.run(failing, run_id="failing")  # failed, not needs_attention: the server said it did not


@pytest.mark.parametrize("name", ["a.b", "a__b", "", "x" * 33, "<b>"])
def test_a_server_name_is_one_providers_accept_in_tool_names(name: str) -> None:
    with pytest.raises(cairn.InvalidArgument, match="an MCP server name is 1 to 32 letters"):
        MCPServer(name, command=[sys.executable], egress=EGRESS)


def test_structured_output_is_checked_against_the_output_schema() -> None:
    from mcp import types

    listed = Listed(name="typed", effect="read", input_schema={},
                    output_schema={"type": "object", "properties": {"double": {"type": "integer"}},
                                   "required": ["double"]})
    good = types.CallToolResult(content=[], structuredContent={"double": 4})
    assert _result("t", listed, good)["structured"] == {"double": 4}
    for bad in ({"double": "four"}, None):
        with pytest.raises(cairn.errors.ToolResultInvalid, match="typed"):
            _result("t", listed, types.CallToolResult(content=[], structuredContent=bad))
    # compiled once per listed tool: a schema its metaschema refuses still fails each call, naming it
    broken = Listed(name="typed", effect="read", input_schema={}, output_schema={"type": 5})
    check = OutputCheck("t", broken)
    for _ in range(2):
        with pytest.raises(cairn.errors.ToolResultInvalid, match=r"typed.*outputSchema is invalid"):
            _result("t", broken, good, check)


def test_the_egress_rule_refuses_commands_and_urls(app: cairn.App, tmp_path: Path) -> None:
    marker = tmp_path / "started"
    server = MCPServer("evil", command=["/usr/bin/touch", str(marker)], egress=EGRESS)
    remote = MCPServer("far", url="http://127.0.0.10:9/mcp", egress=EGRESS)

    @app.workflow(name="egress")
    def egress(ctx: cairn.Context, which: str) -> None:
        (server if which == "evil" else remote).tools()

    with pytest.raises(cairn.RunFailed, match=r"egress refused: the app may not start MCP server command"):
        app.run(egress, "evil", run_id="evil")
    with pytest.raises(cairn.RunFailed, match=r"egress refused: the app may not reach MCP server"):
        app.run(egress, "far", run_id="far")
    assert not marker.exists()
    with pytest.raises(EgressRefused):
        Egress(urls=["http://127.0.0.1:80"]).check_url("http://127.0.0.1:8080/mcp")


# -- streamable HTTP ------------------------------------------------------------------------


@pytest.fixture
def http_url(tmp_path: Path, state: Path) -> Iterator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    child = spawn(SERVER_SCRIPT, ["http", str(port)], env={"MCP_STATE": str(state)},
                  log=tmp_path / "http.log")
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        child.kill()
        child.wait()


def test_a_server_over_streamable_http(app: cairn.App, http_url: str, state: Path) -> None:
    server = MCPServer("h", url=http_url, egress=EGRESS, timeout=20)
    try:
        @app.workflow(name="remote")
        def remote(ctx: cairn.Context) -> list[Any]:
            names = sorted(s["function"]["name"] for s in server.tools())
            return [names[:2], server.call("lookup", {"key": "r"})["text"],
                    server.call("send", {"to": "bo", "text": "over http"})["text"]]

        assert app.run(remote, run_id="remote") == [["h__big", "h__crash"], "value of r", "sent"]
        assert world(state) == ["send bo: over http"]
    finally:
        server.close()
    assert sys.executable  # the server ran under this interpreter (tests/processes.spawn)


# -- a SIGKILL of the worker mid-call, for each effect class ------------------------------


@pytest.mark.parametrize(("tool", "effect"), [("slow_read", "read"), ("slow_put", "idempotent"),
                                              ("slow_send", "write")])
def test_a_sigkill_of_the_worker_mid_call(
    backend: StoreBackend, tmp_path: Path, state: Path, monkeypatch: pytest.MonkeyPatch, tool: str,
    effect: str,
) -> None:
    """The worker (and the stdio server it started: its process group) dies
    while the tool runs. Resumed: a read runs again; an idempotent call is
    sent again with the same operation id as its key; a write is never sent
    again blindly: the run waits in needs_attention."""
    import os
    import signal

    from tests.mcptools import kill_app

    env = {"CAIRN_TEST_DB": backend.url, "MCP_STATE": str(state)}
    child = spawn("tests.mcptools.kill_app", ["killed", tool, "30"], env=env, log=tmp_path / "child.log")
    deadline = time.monotonic() + 60
    while not any(line.startswith("start") for line in world(state)):
        assert time.monotonic() < deadline, (tmp_path / "child.log").read_text()[-2000:]
        assert child.poll() is None, (tmp_path / "child.log").read_text()[-2000:]
        time.sleep(0.05)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    app = cairn.App(db=env["CAIRN_TEST_DB"], lease_seconds=0.5)
    monkeypatch.setenv("MCP_STATE", str(state))
    monkeypatch.setenv("MCP_FAST", "1")  # the server started by the resumed run does not sleep
    _, server = kill_app.register(app)
    try:
        time.sleep(0.6)  # the dead worker's lease runs out
        if effect == "write":
            app.worker().run(max_idle=1.0)
            record = app.store.get_run("killed")  # type: ignore[attr-defined]
            assert record is not None
            assert record.status is RunStatus.NEEDS_ATTENTION
            assert [line.split()[0] for line in world(state)] == ["start"]  # never sent again
        else:
            assert app.resume("killed") == f"{effect} killed done"
            starts = [line for line in world(state) if line.startswith("start")]
            assert len(starts) == 2  # sent again after the crash
            if effect == "idempotent":
                assert starts[0] == starts[1]  # with the same operation id as its key
                assert len(starts[0].split()[-1]) == 36  # (a key was sent: a uuid)
    finally:
        server.close()
        app.close()
