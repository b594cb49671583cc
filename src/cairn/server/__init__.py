"""Cairn over the network: the HTTP API, its event streams and the dashboard
(``cairn serve``). Needs the ``server`` extra (Starlette, uvicorn, Jinja2)."""

from __future__ import annotations

from cairn.server.app import ROUTES, create_app

__all__ = ["ROUTES", "create_app"]
