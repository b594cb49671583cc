"""Fixtures for the cairn.mcp tests: an App on each backend, the outside
world of the test MCP server (a file), and servers that are always closed."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn.mcp import Egress, MCPServer
from tests.engine.conftest import BACKENDS, postgres_url

SERVER_SCRIPT = Path(__file__).with_name("mcp_server.py")
EGRESS = Egress(commands=[sys.executable], urls=["http://127.0.0.1:*"])


@pytest.fixture(params=BACKENDS)
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[cairn.App]:
    if request.param == "postgres":
        application = cairn.App(db=postgres_url(request.getfixturevalue("pg_url")), lease_seconds=5.0)
    else:
        application = cairn.App(db=f"sqlite:///{tmp_path}/cairn.db", lease_seconds=5.0)
    yield application
    application.close()


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """The file the server's writing tools append to."""
    path = tmp_path / "world"
    path.touch()
    return path


@pytest.fixture
def make_server(state: Path) -> Iterator[Callable[..., MCPServer]]:
    made: list[MCPServer] = []

    def make(name: str = "t", **options: Any) -> MCPServer:
        options.setdefault("command", [sys.executable, str(SERVER_SCRIPT), "stdio"])
        options.setdefault("env", {"MCP_STATE": str(state), "PATH": "/usr/bin:/bin"})
        options.setdefault("egress", EGRESS)
        options.setdefault("timeout", 20.0)
        server = MCPServer(name, **options)
        made.append(server)
        return server

    yield make
    for server in made:
        server.close()
