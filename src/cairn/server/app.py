"""The ASGI application: ``create_app(cairn_app)`` is a Starlette app serving
the API under ``/api``, its OpenAPI document at ``/api/openapi.json`` and the
dashboard at ``/``. Mount it in an ASGI app of your own
(``Mount("/cairn", app=create_app(app))``) or serve it with ``cairn serve``.

It holds no state of its own beyond the ``App`` it is given: every read and
every action goes through ``App`` and the ``Operator`` acting as the token's
identity, never a second path to the store.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from cairn.api.app import App
from cairn.server import events
from cairn.server import metrics as prometheus
from cairn.server.errors import any_exception, http_exception
from cairn.server.openapi import document
from cairn.server.routes import ROUTES
from cairn.server.routing import ServerState, starlette_route


def create_app(
    app: App,
    *,
    heartbeat: float = 15.0,
    settle: float | None = None,
    max_poll: float = 0.5,
    max_streams: int = 32,
    dashboard: bool = True,
    metrics: bool = False,
) -> Starlette:
    """The ASGI app over ``app``. ``heartbeat``: seconds between comment lines
    on an idle event stream; ``settle``: how long the tenant stream holds a
    change back (default 0 on SQLite, 2 s on PostgreSQL: see
    ``cairn.server.events``); ``max_poll``: the longest wait between two
    looks at the store when no notification comes; ``max_streams``: event
    streams one token may hold open at once (429 beyond); ``metrics``: serve
    ``GET /metrics`` (Prometheus text; needs the ``otel-export`` extra)."""
    if settle is None:
        settle = 2.0 if (app.db_url or "").startswith(("postgres://", "postgresql://")) else 0.0
    state = ServerState(app, heartbeat=heartbeat, settle=settle, max_poll=max_poll, max_streams=max_streams)
    if metrics:
        state.extra["metrics"] = prometheus.Metrics(app)

    async def openapi(request: Request) -> Response:
        return JSONResponse(document(ROUTES))

    routes: list[BaseRoute] = [starlette_route(state, spec) for spec in ROUTES]
    routes.append(Route("/api/openapi.json", openapi, methods=["GET"]))
    if dashboard:
        from cairn.server import dashboard as pages

        routes.extend(pages.routes(state))
        routes.append(Mount("/static", app=StaticFiles(packages=[("cairn.server", "static")]), name="static"))

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            events.wakeup_of(state).close()
            if "metrics" in state.extra:
                state.extra["metrics"].close()

    handlers: dict[Any, Any] = {HTTPException: http_exception, Exception: any_exception}
    server = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)
    server.state.cairn = state
    return server
