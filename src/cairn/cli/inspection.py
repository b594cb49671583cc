"""``cairn runs``, ``cairn show``, ``cairn events``: reading runs and their
histories, as text or JSON (the JSON shapes are ``cairn.api.views``, shared
with the HTTP API). They open the database read-only and never migrate it."""

from __future__ import annotations

import sys
import time

import click

from cairn.api import views
from cairn.store.records import RunStatus

from . import render
from .approvals import pending_of, print_pending
from .loading import open_session
from .options import app_option, db_option
from .options import db_from_context as _db
from .options import stdout_console as _stdout
from .terminal import echo, echo_json


@click.command()
@click.option("--status", type=click.Choice([s.value for s in RunStatus]), default=None)
@click.option("--tenant", default=None)
@click.option("--workflow", default=None)
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@app_option(required=False)
@db_option
@click.pass_context
def runs(
    ctx: click.Context, status: str | None, tenant: str | None, workflow: str | None, limit: int,
    as_json: bool, app_spec: str | None, db: str | None,
) -> None:
    """List runs, newest first."""
    with open_session(_db(ctx, db), app_spec, read_only=True) as session:
        records = session.app.list_runs(status=status, tenant=tenant, workflow=workflow, limit=limit)
        if as_json:
            for record in records:
                echo_json(views.run_json(record))
        elif records:
            render.print_runs(_stdout(), records)
        else:
            echo("no runs", err=True)


@click.command()
@click.argument("run_id", metavar="RUN")
@click.option("--json", "as_json", is_flag=True)
@app_option(required=False)
@db_option
@click.pass_context
def show(ctx: click.Context, run_id: str, as_json: bool, app_spec: str | None, db: str | None) -> None:
    """Show a run: its state, its journal step by step, and its result or error."""
    with open_session(_db(ctx, db), app_spec, read_only=True) as session:
        record = session.app.get_run(run_id)
        if as_json:  # the shape of GET /api/runs/{id}?journal=true
            echo_json(views.run_detail(session.operator, record, journal=True, inspecting=True), indent=2)
        else:
            history = session.app.history(run_id)
            pending = pending_of(session, run_id)
            waiting = session.operator.waiting_for_worker(record)  # no live worker serves its bundle
            archived = session.operator.run_archive(run_id)
            console = _stdout()
            render.print_run(console, session.codec, record, history)
            print_pending(console, pending)
            if waiting is not None:
                echo(waiting)
            if archived is not None:  # read from its archive: say so, and how to bring it back
                echo(f"archived {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(archived.archived_at))} UTC "
                     f"by {archived.actor or '-'} (object {archived.ref[:16]}...; cairn archive restore "
                     f"{run_id})")


@click.command()
@click.argument("run_id", metavar="RUN")
@click.option("--after", type=click.IntRange(min=0), default=0, help="Only entries with seq > N.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new entries until the run ends.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@app_option(required=False)
@db_option
@click.pass_context
def events(
    ctx: click.Context, run_id: str, after: int, follow: bool, as_json: bool, app_spec: str | None,
    db: str | None,
) -> None:
    """Print a run's history: every journal entry and lifecycle event."""
    console = _stdout()
    with open_session(_db(ctx, db), app_spec, read_only=True) as session:
        app, codec = session.app, session.codec
        last = after
        try:
            while True:
                # Read the status before the entries: the entry that ends a run
                # is written with its status, so after seeing a terminal status
                # one more read has every entry there will ever be.
                record = app.get_run(run_id)
                batch = app.history(run_id, last)
                # a model call is stored as what its run had not journaled yet:
                # rebuilt from the entries it names as needed
                models = views.model_calls_of(app, codec, run_id, batch)
                for event in batch:
                    if as_json:
                        echo_json(views.event_json(codec, event, models))
                    else:
                        console.print(render.event_line(codec, event, models), soft_wrap=True)
                    last = event.seq
                sys.stdout.flush()
                if not follow or record.status.terminal:
                    return
                time.sleep(0.2)
        except KeyboardInterrupt:
            ctx.exit(130)


