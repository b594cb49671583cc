"""Fixtures of the server tests: a real App on SQLite and PostgreSQL, tokens
of every role for two tenants, an in-process client, and a real uvicorn on
127.0.0.1 for the streams and the browser."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn

import cairn
from cairn.server import create_app
from tests.engine.conftest import postgres_url
from tests.timing import SLACK

from .workflows import register

TENANT, OTHER = "acme", "globex"
ROLES = ("viewer", "operator", "admin")


@dataclass
class Setup:
    app: cairn.App
    workflows: dict[str, Any]
    #: role -> token of TENANT ("installation" included); "other-admin": an admin token of OTHER
    tokens: dict[str, str]

    def headers(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}"}


@pytest.fixture(params=["sqlite", "postgres"])
def setup(request: pytest.FixtureRequest) -> Iterator[Setup]:
    if request.param == "postgres":
        app = cairn.App(db=postgres_url(request.getfixturevalue("pg_url")), lease_seconds=5.0)
    else:
        app = cairn.App(db=request.getfixturevalue("sqlite_url"), lease_seconds=5.0)
    workflows = register(app)
    tokens = {role: app.tokens.mint(TENANT, role, f"{role}-bot").secret for role in ROLES}
    tokens["other-admin"] = app.tokens.mint(OTHER, "admin", "intruder").secret
    tokens["installation"] = app.tokens.mint(TENANT, "installation", "installation-bot").secret
    revoked = app.tokens.mint(TENANT, "admin", "revoked-bot")
    app.tokens.revoke(revoked.record.token_id)
    tokens["revoked"] = revoked.secret
    yield Setup(app, workflows, tokens)
    app.close()


@pytest.fixture
def sqlite_setup(sqlite_url: str) -> Iterator[Setup]:
    app = cairn.App(db=sqlite_url, lease_seconds=5.0)
    workflows = register(app)
    tokens = {role: app.tokens.mint(TENANT, role, f"{role}-bot").secret for role in ROLES}
    tokens["other-admin"] = app.tokens.mint(OTHER, "admin", "intruder").secret
    yield Setup(app, workflows, tokens)
    app.close()


@pytest.fixture
def server(setup: Setup) -> Iterator[LiveServer]:
    with LiveServer(setup.app, heartbeat=0.5, metrics=True) as live:
        yield live


@pytest.fixture
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        yield http


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiveServer:
    """A real uvicorn serving ``create_app(app)`` on 127.0.0.1, in a thread."""

    def __init__(self, app: cairn.App, wrap: Any = None, **options: Any) -> None:
        self.port = free_port()
        asgi = create_app(app, **options)
        config = uvicorn.Config(wrap(asgi) if wrap is not None else asgi, host="127.0.0.1", port=self.port,
                                log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 10 * SLACK
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
