"""A real MCP server (the official SDK's FastMCP) for the cairn.mcp tests.

    python tests/mcp/mcp_server.py stdio
    python tests/mcp/mcp_server.py http PORT

Every tool that changes anything appends a line to ``$MCP_STATE`` (the
"outside world" the tests inspect). ``lie`` claims to be read-only and
writes; ``crash`` writes, then the whole server dies mid-call; ``sleep``
hangs; ``big`` answers 10 MB; ``remove_lookup`` removes ``lookup`` from the
tool list (the list changes mid-run); ``typed`` has structured output with
its schema; ``fail`` answers with an error result.
"""

from __future__ import annotations

import os
import sys
import time

from mcp.server.fastmcp import FastMCP
from mcp.types import ToolAnnotations

port = int(sys.argv[2]) if len(sys.argv) > 2 else 8000
server = FastMCP("test-tools", host="127.0.0.1", port=port, log_level="WARNING")
READ = ToolAnnotations(readOnlyHint=True)


def world(line: str) -> None:
    with open(os.environ["MCP_STATE"], "a") as out:
        out.write(line + "\n")
        out.flush()
        os.fsync(out.fileno())


@server.tool(annotations=READ)
def lookup(key: str) -> str:
    """Read a record."""
    return f"value of {key}"


@server.tool(annotations=ToolAnnotations(idempotentHint=True))
def put(key: str, value: str, idempotency_key: str = "") -> str:
    """Store a record (deduplicated by idempotency_key)."""
    world(f"put {key}={value} key={idempotency_key}")
    return "stored"


@server.tool()
def send(to: str, text: str) -> str:
    """Send a message (no hints: a write)."""
    world(f"send {to}: {text}")
    return "sent"


@server.tool(annotations=READ)
def lie(text: str) -> str:
    """Says it is read-only; writes."""
    world(f"lie {text}")
    return "looked"


@server.tool()
def crash(text: str) -> str:
    """Writes, then the server dies before answering."""
    world(f"crash {text}")
    os._exit(3)


@server.tool(annotations=READ)
def sleep(seconds: float) -> str:
    """Hangs."""
    time.sleep(seconds)
    return "woke"


@server.tool(annotations=READ)
def big(megabytes: int) -> str:
    """A large answer."""
    return "x" * (megabytes * 1024 * 1024)


@server.tool(annotations=READ)
def remove_lookup() -> str:
    """Changes the tool list: lookup is gone from now on."""
    server.remove_tool("lookup")
    return "removed"


@server.tool(annotations=READ)
def typed(n: int) -> dict[str, int]:
    """Structured output with a schema."""
    return {"double": 2 * n}


@server.tool(annotations=READ)
def fail(why: str) -> str:
    """Answers with an error result."""
    raise ValueError(why)


def _slow(effect: str, key: str, seconds: float, idempotency_key: str = "") -> str:
    world(f"start {effect} {key} {idempotency_key}".rstrip())
    time.sleep(0 if os.environ.get("MCP_FAST") else seconds)
    world(f"done {effect} {key}")
    return f"{effect} {key} done"


@server.tool(annotations=READ)
def slow_read(key: str, seconds: float) -> str:
    """A slow read (the test kills the worker while it runs)."""
    return _slow("read", key, seconds)


@server.tool(annotations=ToolAnnotations(idempotentHint=True))
def slow_put(key: str, seconds: float, idempotency_key: str = "") -> str:
    """A slow idempotent write."""
    return _slow("idempotent", key, seconds, idempotency_key)


@server.tool()
def slow_send(key: str, seconds: float) -> str:
    """A slow write."""
    return _slow("write", key, seconds)


if __name__ == "__main__":
    server.run(transport="stdio" if sys.argv[1] == "stdio" else "streamable-http")
