"""``cairn mcp serve``: the tenant's runs, approvals and signals as MCP tools
over stdio, or streamable HTTP with ``--http`` (``cairn.mcpserve``). Needs
the ``mcp`` extra (and uvicorn, the ``server`` extra, for HTTP)."""

from __future__ import annotations

import os
from collections.abc import Callable

import click

from cairn.api.app import App
from cairn.api.tokens import TokenRefused
from cairn.errors import MissingExtra

from .loading import load_app, require_database
from .options import app_option, db_from_context, db_option


@click.group(name="mcp")
def mcp() -> None:
    """Cairn as an MCP server."""


@mcp.command()
@app_option(required=False)
@click.option("--token", envvar="CAIRN_TOKEN", default=None,
              help="The HTTP API token it acts as (default $CAIRN_TOKEN): its tenant and role decide "
                   "what the client sees and may do.")
@click.option("--http", "http", metavar="HOST:PORT", default=None,
              help="Serve streamable HTTP at http://HOST:PORT/mcp instead of stdio: each request "
                   "presents its own API token (Authorization: Bearer), as with cairn serve.")
@db_option
@click.pass_context
def serve(ctx: click.Context, app_spec: str | None, token: str | None, http: str | None,
          db: str | None) -> None:
    """Serve MCP over stdio for one token (or over HTTP, --http, for each
    request's token): tools to list, read and start runs (starting needs
    --app), list and answer approvals, send signals; each run as the
    resource cairn://runs/{run_id}."""
    try:
        from cairn.mcpserve import build, http_app
    except MissingExtra:
        raise MissingExtra("cairn mcp serve", "mcp") from None
    where = _host_port(http) if http is not None else None
    if where is not None:
        try:
            import uvicorn
        except ImportError:
            raise MissingExtra("cairn mcp serve --http", "server") from None
    elif not token:
        raise click.ClickException("cairn mcp serve needs a token: --token or $CAIRN_TOKEN "
                                   "(cairn tokens mint --tenant T --role operator NAME), or --http")
    app, close = _open_app(ctx, app_spec, db)
    try:
        if where is not None:
            host, port = where
            click.echo(f"MCP over streamable HTTP at http://{host}:{port}/mcp", err=True)
            uvicorn.run(http_app(app, host, port), host=host, port=port, log_level="warning", lifespan="on")
            return
        assert token is not None
        try:
            principal = app.tokens.check(token)
        except TokenRefused as exc:
            raise click.ClickException(str(exc)) from None
        os.environ.pop("CAIRN_TOKEN", None)  # not inherited by anything this process starts
        build(app, principal).run(transport="stdio")
    finally:
        close()


def _open_app(ctx: click.Context, app_spec: str | None, db: str | None) -> tuple[App, Callable[[], None]]:
    db = db_from_context(ctx, db)
    if app_spec is not None:
        if db is not None:
            require_database(db)
        loaded = load_app(app_spec, db)
        return loaded.app, loaded.close
    app = App(db, create=False)
    return app, app.close


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter(f"expected HOST:PORT (e.g. 127.0.0.1:8765), not {text!r}",
                                 param_hint="'--http'")
    return host, int(port)
