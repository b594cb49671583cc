"""A workflow calling one slow MCP tool, run in a child process that the
test SIGKILLs mid-call, then resumed by the test in its own process.

    python -m tests.mcptools.kill_app RUN_ID TOOL SECONDS

``$CAIRN_TEST_DB``: the store; ``$MCP_STATE``: the server's outside world.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import cairn
from cairn.mcp import MCPServer
from tests.mcptools.conftest import EGRESS, SERVER_SCRIPT


def register(app: cairn.App) -> tuple[Any, MCPServer]:
    server = MCPServer("k", command=[sys.executable, str(SERVER_SCRIPT), "stdio"], egress=EGRESS,
                       env={"MCP_STATE": os.environ["MCP_STATE"], "PATH": "/usr/bin:/bin",
                            **({"MCP_FAST": "1"} if os.environ.get("MCP_FAST") else {})}, timeout=60)

    @app.workflow(name="slow-call")
    def slow_call(ctx: cairn.Context, tool: str, seconds: float) -> str:
        return str(server.call(tool, {"key": ctx.run_id, "seconds": seconds})["text"])

    return slow_call, server


if __name__ == "__main__":
    app = cairn.App(db=os.environ["CAIRN_TEST_DB"], lease_seconds=0.5)
    flow, _ = register(app)
    app.run(flow, sys.argv[2], float(sys.argv[3]), run_id=sys.argv[1])
