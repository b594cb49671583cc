"""Cairn over the network: the HTTP API, its event streams and the dashboard
(``cairn serve``). Needs the ``server`` extra (Starlette, uvicorn, Jinja2)."""

from __future__ import annotations

from cairn.errors import MissingExtra

try:  # every module of the package imports these: one message for all of them
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:
    raise MissingExtra("cairn.server", "server") from exc

from cairn.server.app import create_app
from cairn.server.routes import ROUTES

__all__ = ["ROUTES", "create_app"]
