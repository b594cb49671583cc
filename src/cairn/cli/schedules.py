"""``cairn schedules``: every schedule, its last tick and its next one.

Schedules are declared in code and registered in the database by the
workers that fire them, so the listing needs no application code; with
``--app`` it also shows the app's declarations no worker has registered yet.
Times are shown in the schedule's own time zone and in UTC.
"""

from __future__ import annotations

import click

from cairn.api.app import App
from cairn.api.schedules import ScheduleView
from cairn.engine.schedules import tick_text

from .loading import open_session
from .options import app_option, db_from_context, db_option
from .terminal import echo, echo_json


def _when(view: ScheduleView, at: float | None) -> str:
    """``2026-12-01 09:25:00 CET = 08:25:00Z`` (local, then UTC); ``-`` for none."""
    if at is None:
        return "-"
    utc = tick_text(at).replace("T", " ")
    local = view.local(at)
    if local is None or view.timezone == "UTC":
        return utc
    local_text = f"{local:%Y-%m-%d %H:%M:%S %Z}"
    return f"{local_text} = {utc[11:] if local_text[:10] == utc[:10] else utc}"


def _lines(view: ScheduleView) -> list[str]:
    """One schedule as a short block: its definition, then its last and next tick."""
    head = f"{view.tenant}/{view.name}: workflow {view.workflow}, cron {view.cron!r} in {view.timezone}, " \
           f"missed={view.missed}"
    if view.role is not None:
        head += f", runs started as {view.role}"
    if view.declared is False:
        head += " (registered, not declared by this app)"
    if not view.registered:
        last = "  last tick  - (no worker has registered it yet)"
    else:
        last = f"  last tick  {_when(view, view.last_tick)}"
        if view.last_run_id is not None:
            last += f"  run {view.last_run_id}"
        last += f"  ({view.fired} run{'s' if view.fired != 1 else ''} in all)"
    return [head, last, f"  next tick  {_when(view, view.next_tick)}"]


def describe_schedules(app: App, *, fired: bool) -> list[str]:
    """The worker banner's lines about the app's schedules."""
    declared = sorted(app.runtime.schedules.values(), key=lambda s: s.key)
    if not declared:
        return []
    if not fired:
        return [f"  schedules: {len(declared)} declared, none fired by this worker (--no-schedules)"]
    return [f"  schedule {s.tenant}/{s.name}: {s.workflow.name}, cron {s.timetable.cron!r} in "
            f"{s.timetable.timezone}, missed={s.missed}"
            + (f", runs started as {s.started_role}" if s.started_role is not None else "") for s in declared]


def _behind(view: ScheduleView) -> str | None:
    if view.due_since is None:
        return None
    return (f"schedule {view.name!r} of tenant {view.tenant!r}: ticks due since "
            f"{tick_text(view.due_since)} have not fired (is a worker running the app?)")


@click.command("schedules")
@click.option("--json", "as_json", is_flag=True, help="One JSON array, one object per schedule.")
@click.option("--tenant", default=None, help="Only this tenant's schedules.")
@app_option(required=False)
@db_option
@click.pass_context
def schedules(ctx: click.Context, as_json: bool, tenant: str | None, app_spec: str | None,
              db: str | None) -> None:
    """Every schedule: cron, time zone, missed-tick policy, last tick fired
    (and how many runs it started), next tick, in the schedule's time zone
    and in UTC. With --app, the app's declarations too."""
    with open_session(db_from_context(ctx, db), app_spec, read_only=True) as session:
        views = session.app.schedules(declared=app_spec is not None)
    if tenant is not None:
        views = [view for view in views if view.tenant == tenant]
    if as_json:
        echo_json([view.as_dict() for view in views], indent=2)
    elif not views:
        echo("no schedule is registered" + (" for tenant " + tenant if tenant is not None else "")
             + ("" if app_spec else " (declarations in code show with --app, or once a worker runs them)"),
             err=True)
    else:
        for view in views:
            for line in _lines(view):
                echo(line)
        for line in filter(None, map(_behind, views)):
            echo(line, err=True)
