"""MCP tool calls from async workflows (``await server.acall(...)``), on
both backends against the real test server: the same ledger as a sync call
(effect classes, intents, the idempotency key), calls started together keep
their call order, the loop is never blocked by a call, a hanging server
times out, and a replay answers from the journal without the server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn.mcp import MCPServer
from cairn.store.records import EventType

MakeServer = Callable[..., MCPServer]
pytestmark = pytest.mark.slow  # every test starts an MCP server process


def test_async_calls_take_the_ledger_path_of_sync_ones(
    app: cairn.App, make_server: MakeServer, state: Path
) -> None:
    server = make_server()

    @app.workflow(name="async-use")
    async def use(ctx: cairn.Context) -> list[Any]:
        server.tools()
        looked = await server.acall("lookup", {"key": "k1"})
        stored = await server.acall("put", {"key": "k", "value": "v"})
        # started together: positions in call order, answers in the same order
        many = await asyncio.gather(*(server.acall("lookup", {"key": f"g{i}"}) for i in range(5)))
        sent = await server.acall("send", {"to": "ada", "text": "hi"})
        return [looked["text"], stored["text"], [m["text"] for m in many], sent["text"]]

    result = app.run(use, run_id="async-use")
    assert result == ["value of k1", "stored", [f"value of g{i}" for i in range(5)], "sent"]
    tools = [e for e in app.history("async-use") if e.event is EventType.STEP_COMPLETED
             and e.step_kind == "tool"]
    assert [e.name for e in tools] == ["t.lookup", "t.put"] + ["t.lookup"] * 5 + ["t.send"]
    intents = [e for e in app.history("async-use") if e.event is EventType.OP_INTENT]
    assert [e.name for e in intents] == ["t.put", "t.send"]
    [put_line] = [line for line in state.read_text().splitlines() if line.startswith("put")]
    assert put_line.split("key=")[1] == (intents[0].detail or {})["operation_id"]


def test_an_async_call_does_not_block_the_loop(app: cairn.App, make_server: MakeServer) -> None:
    """A ticker on the workflow's loop keeps ticking while a 1 s call is
    in flight (a blocking call would hold it until the answer)."""
    server = make_server()

    @app.workflow(name="ticking")
    async def ticking(ctx: cairn.Context) -> int:
        server.tools()
        await server.acall("lookup", {"key": "warm"})  # the session is open: only the call is timed
        ticks = 0
        done = False

        async def ticker() -> None:
            nonlocal ticks
            while not done:
                ticks += 1
                await asyncio.sleep(0.01)

        task = asyncio.ensure_future(ticker())
        await server.acall("slow_read", {"key": "s", "seconds": 1.0})
        done = True
        await task
        return ticks

    assert app.run(ticking, run_id="ticking") >= 10


def test_an_async_call_to_a_hanging_server_times_out(app: cairn.App, make_server: MakeServer) -> None:
    server = make_server(timeout=2.0)

    @app.workflow(name="async-hang")
    async def hang(ctx: cairn.Context) -> None:
        await server.acall("sleep", {"seconds": 60})

    started = time.monotonic()
    with pytest.raises(cairn.RunFailed, match=r"t\.sleep.*([Tt]imed out|did not answer|did not return)"):
        app.run(hang, run_id="async-hang")
    assert time.monotonic() - started < 45  # bounded by the timeout, not the server's 60 s


def test_a_replay_answers_from_the_journal(app: cairn.App, make_server: MakeServer, state: Path) -> None:
    """After a durable sleep the workflow runs again from the top: the
    recorded calls are not sent again (the write once in the world)."""
    server = make_server()

    @app.workflow(name="async-replay")
    async def replay(ctx: cairn.Context) -> str:
        server.tools()
        sent = await server.acall("send", {"to": "bo", "text": "once"})
        await ctx.sleep(0.2)
        return str(sent["text"])

    assert app.run(replay, run_id="async-replay") == "sent"
    assert state.read_text().splitlines() == ["send bo: once"]


def test_acall_from_a_sync_workflow_is_refused(app: cairn.App, make_server: MakeServer) -> None:
    server = make_server()

    @app.workflow(name="sync-acall")
    def sync_acall(ctx: cairn.Context) -> None:
        server.tools()
        server.acall("lookup", {"key": "k"})

    with pytest.raises(cairn.RunFailed, match=r"async tool 't\.lookup' called from a sync workflow"):
        app.run(sync_acall, run_id="sync-acall")
