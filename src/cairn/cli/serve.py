"""``cairn serve``: the HTTP API and the dashboard (``cairn.server``), run by
uvicorn. Needs the ``server`` extra."""

from __future__ import annotations

import signal
from types import FrameType

import click

from cairn.api.app import App
from cairn.errors import CairnError, MissingExtra

from .loading import load_app, require_database
from .options import app_option, database_label, db_from_context, db_option
from .terminal import echo


@click.command()
@app_option(required=False)
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0: every interface; put TLS in front).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--heartbeat", type=click.FloatRange(min=0.1), default=15.0, show_default=True,
              help="Seconds between heartbeats on idle event streams.")
@click.option("--metrics", is_flag=True, default=False,
              help="Serve GET /metrics in the Prometheus text format (viewer tokens; "
                   "needs the otel-export extra).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
@db_option
@click.pass_context
def serve(ctx: click.Context, app_spec: str | None, host: str, port: int, heartbeat: float, metrics: bool,
          log_level: str, db: str | None) -> None:
    """Serve the HTTP API (/api, OpenAPI at /api/openapi.json) and the
    dashboard (/). Starting runs needs --app (the workflows); everything else
    works on the database alone. Requests authenticate with tokens from
    'cairn tokens mint'."""
    # one line naming the extra, the command's own (cairn.server's says "cairn.server")
    try:
        import uvicorn
    except ImportError:
        raise MissingExtra("cairn serve", "server") from None
    try:
        from cairn.server import create_app
    except MissingExtra:
        raise MissingExtra("cairn serve", "server") from None
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
        asgi = create_app(app, heartbeat=heartbeat, metrics=metrics)
    except CairnError as exc:
        close()
        raise click.ClickException(str(exc)) from None
    # uvicorn drains on SIGTERM, then raises the signal again under the
    # handler it found: make that a clean exit that closes the App
    signal.signal(signal.SIGTERM, _exit_cleanly)
    try:
        echo(f"cairn serve: database {database_label(app.db_url or '?')}; http://{host}:{port}/ "
             f"(API at /api, OpenAPI at /api/openapi.json)", err=True)
        uvicorn.run(asgi, host=host, port=port, log_level=log_level,
                    timeout_graceful_shutdown=2)
    finally:
        close()


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)
