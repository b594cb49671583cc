"""``cairn mcp serve``: the tenant's runs, approvals and signals as MCP tools
over stdio (``cairn.mcpserve``). Needs the ``mcp`` extra."""

from __future__ import annotations

import os

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
@db_option
@click.pass_context
def serve(ctx: click.Context, app_spec: str | None, token: str | None, db: str | None) -> None:
    """Serve MCP over stdio for one token: tools to list, read and start
    runs (starting needs --app), list and answer approvals, send signals;
    each run as the resource cairn://runs/{run_id}."""
    try:
        from cairn.mcpserve import build
    except MissingExtra:
        raise MissingExtra("cairn mcp serve", "mcp") from None
    if not token:
        raise click.ClickException("cairn mcp serve needs a token: --token or $CAIRN_TOKEN "
                                   "(cairn tokens mint --tenant T --role operator NAME)")
    db = db_from_context(ctx, db)
    if app_spec is not None:
        if db is not None:
            require_database(db)
        loaded = load_app(app_spec, db)
        app, close = loaded.app, loaded.close
    else:
        app = App(db, create=False)
        close = app.close
    try:
        try:
            principal = app.tokens.check(token)
        except TokenRefused as exc:
            raise click.ClickException(str(exc)) from None
        os.environ.pop("CAIRN_TOKEN", None)  # not inherited by anything this process starts
        build(app, principal).run(transport="stdio")
    finally:
        close()
