"""``cairn graph history|state|diff|diverge|fork|replay``: time travel over
a graph run's checkpoints (docs/design.md, "Time travel").

The readers need no workflow code (states are read as plain JSON from the
checkpoint format); ``fork`` and ``replay`` start a new run of the graph,
so they take ``--app`` (the module that registers it). The JSON shapes are
``cairn.api.views``', shared with the HTTP API. Bad input (a run or step
that does not exist, a run that is not a graph's, an update that does not
fit the state) is one line and exit status 2.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from cairn.api import actors, views
from cairn.api.operator import cli_actor
from cairn.errors import InvalidArgument, PayloadError, RunNotFound, UnknownWorkflow
from cairn.graph.diff import Change
from cairn.store.records import STARTED_ROLES

from . import render
from .loading import Session, open_session
from .options import app_option, db_from_context, db_option
from .terminal import echo, echo_json

_STEP = click.IntRange(min=0)

#: the new run of a replay or fork acts with the role it is given here, as ``cairn start --role``;
#: never with its origin's
_ROLE = click.option("--role", type=click.Choice(STARTED_ROLES), default=None,
                     help="The token role the new run is started with (as cairn start --role), whatever "
                          "RUN was started with. Default: none (tools restricted by role refuse it).")


class BadInput(click.ClickException):
    """Bad input to a ``cairn graph`` command: one line, exit status 2."""

    exit_code = 2


@contextmanager
def _session(ctx: click.Context, db: str | None, app_spec: str | None, *,
             read_only: bool) -> Iterator[Session]:
    """The session, with input errors leaving as ``BadInput`` (exit 2)."""
    try:
        with open_session(db_from_context(ctx, db), app_spec, read_only=read_only) as session:
            yield session
    except (RunNotFound, InvalidArgument, UnknownWorkflow, PayloadError) as exc:
        raise BadInput(str(exc)) from None


@click.group("graph")
def graph() -> None:
    """Time travel over graph runs: history, states, diffs, replay and fork."""


@graph.command("history")
@click.argument("run_id", metavar="RUN")
@click.option("--before", type=_STEP, default=None, help="Only super-steps below N (the next page).")
@click.option("--limit", type=click.IntRange(min=1, max=1000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object: the page.")
@app_option(required=False)
@db_option
@click.pass_context
def history(ctx: click.Context, run_id: str, before: int | None, limit: int, as_json: bool,
            app_spec: str | None, db: str | None) -> None:
    """The run's checkpoints, newest first: each super-step, the nodes that
    ran in it and the ones the next runs."""
    with _session(ctx, db, app_spec, read_only=True) as session:
        found = session.app.checkpoints(run_id, before=before, limit=limit + 1)
        lineage = session.app.lineage(run_id)
    page = views.checkpoint_page(run_id, found, limit)
    if as_json:
        echo_json(page, indent=2)
        return
    if lineage is not None:
        echo(f"run {run_id}: {lineage.describe()}")
    for checkpoint in page["checkpoints"]:
        ran = ", ".join(checkpoint["nodes"]) or "-"
        following = ", ".join(checkpoint["next"]) or "END"
        when = render.fmt_time(checkpoint["at"])
        if checkpoint["error"] is not None:
            echo(f"step {checkpoint['step']:>5}  {when}  unreadable: {checkpoint['error']}")
            continue
        echo(f"step {checkpoint['step']:>5}  {when}  ran {ran}  next {following}")
    if page["next_before"] is not None:
        echo(f"(more: --before {page['next_before']})")


@graph.command("state")
@click.argument("run_id", metavar="RUN")
@click.option("--step", type=_STEP, default=None, help="The super-step (default: the latest).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: run, step and state.")
@app_option(required=False)
@db_option
@click.pass_context
def state(ctx: click.Context, run_id: str, step: int | None, as_json: bool, app_spec: str | None,
          db: str | None) -> None:
    """The state after a super-step, as JSON."""
    with _session(ctx, db, app_spec, read_only=True) as session:
        at, found = session.app.graph_state_json(run_id, step)
    if as_json:
        echo_json(views.state_json(run_id, at, found), indent=2)
    else:
        echo(f"run {run_id}, step {at}:")
        echo_json(found, indent=2)


def _change_line(change: Change) -> str:
    path = "/".join(str(p) for p in change.path) or "(root)"
    if change.kind in ("added", "appended", "inserted"):
        return f"{path}  {change.kind}  {_short(change.new)}"
    if change.kind in ("removed", "deleted"):
        return f"{path}  {change.kind}  {_short(change.old)}"
    return f"{path}  replaced  {_short(change.old)} -> {_short(change.new)}"


def _short(value: Any) -> str:
    return render.preview(value, 80)


@graph.command("diff")
@click.argument("run_id", metavar="RUN")
@click.argument("step_a", metavar="A", type=_STEP)
@click.argument("step_b", metavar="B", type=_STEP)
@click.option("--other", "other", metavar="RUN2", default=None, help="Step B of this run (default: RUN).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object with the changes.")
@app_option(required=False)
@db_option
@click.pass_context
def diff(ctx: click.Context, run_id: str, step_a: int, step_b: int, other: str | None, as_json: bool,
         app_spec: str | None, db: str | None) -> None:
    """What changed from step A of RUN to step B (of RUN2 with --other),
    field by field: appends as appends, dict changes by key path."""
    with _session(ctx, db, app_spec, read_only=True) as session:
        changes = session.app.graph_diff(run_id, step_a, step_b, other_run=other)
    if as_json:
        echo_json(views.diff_json(run_id, step_a, other or run_id, step_b, changes), indent=2)
    elif not changes:
        echo("no change")
    else:
        for change in changes:
            echo(_change_line(change))


@graph.command("diverge")
@click.argument("run_a", metavar="RUN1")
@click.argument("run_b", metavar="RUN2")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@app_option(required=False)
@db_option
@click.pass_context
def diverge(ctx: click.Context, run_a: str, run_b: str, as_json: bool, app_spec: str | None,
            db: str | None) -> None:
    """The first super-step where the two runs' states differ."""
    with _session(ctx, db, app_spec, read_only=True) as session:
        step = session.app.graph_divergence(run_a, run_b)
    if as_json:
        echo_json(views.divergence_json(run_a, run_b, step))
    elif step is None:
        echo(f"{run_a} and {run_b} never diverge")
    else:
        echo(f"{run_a} and {run_b} diverge at step {step}")


def _by_cli(session: Session, origin: str, role: str | None) -> dict[str, Any]:
    """Who starts a replay or fork from the command line: the CLI's actor,
    with ``--role`` if given (``cairn start``'s rule)."""
    tenant = session.app.get_run(origin).tenant
    return {"started_role": role, "started_by": actors.context(cli_actor(), tenant)}


def _started(session: Session, run_id: str, created: bool, as_json: bool) -> None:
    record = session.app.get_run(run_id)
    lineage = session.app.lineage(run_id)
    if as_json:
        echo_json({"created": created, "run": views.run_json(record)})
        return
    said = lineage.describe() if lineage is not None else ""
    echo(f"{'started' if created else 'exists:'} run {run_id} ({said}); a worker executes it")


@graph.command("replay")
@click.argument("run_id", metavar="RUN")
@click.option("--step", type=_STEP, required=True, help="The checkpoint to replay from.")
@click.option("--run-id", "new_id", metavar="ID", default=None, help="The new run's id (idempotent).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: created and the run.")
@_ROLE
@app_option(required=True)
@db_option
@click.pass_context
def replay(ctx: click.Context, run_id: str, step: int, new_id: str | None, as_json: bool, role: str | None,
           app_spec: str, db: str | None) -> None:
    """Start a new run that goes on from the state after --step and runs
    every super-step after it again (nothing of RUN after it is reused)."""
    with _session(ctx, db, app_spec, read_only=False) as session:
        handle = session.app.graph_replay(run_id, step, run_id=new_id, **_by_cli(session, run_id, role))
        _started(session, handle.run_id, bool(handle.created), as_json)


@graph.command("fork")
@click.argument("run_id", metavar="RUN")
@click.option("--step", type=_STEP, required=True, help="The checkpoint to fork at.")
@click.option("--update", "update", metavar="JSON", required=True,
              help="A JSON object of the fields to set (each replaced, validated as its type).")
@click.option("--run-id", "new_id", metavar="ID", default=None, help="The new run's id (idempotent).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: created and the run.")
@_ROLE
@app_option(required=True)
@db_option
@click.pass_context
def fork(ctx: click.Context, run_id: str, step: int, update: str, new_id: str | None, as_json: bool,
         role: str | None, app_spec: str, db: str | None) -> None:
    """Start a new run from the state after --step with --update's fields set."""
    try:
        fields = json.loads(update)
    except ValueError as exc:
        raise BadInput(f"--update is not JSON: {exc}") from None
    if not isinstance(fields, dict):
        raise BadInput(f"--update must be a JSON object of fields, not {type(fields).__name__}")
    with _session(ctx, db, app_spec, read_only=False) as session:
        handle = session.app.graph_fork(run_id, step, update=fields, run_id=new_id,
                                        **_by_cli(session, run_id, role))
        _started(session, handle.run_id, bool(handle.created), as_json)
