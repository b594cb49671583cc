"""``cairn start`` and the operator's actions on a run: ``cancel``,
``retry``, ``kill``, ``resume``, ``budget``. Every action goes through the
operator façade, which records the acting identity in the run's history."""

from __future__ import annotations

import time
from typing import Any

import click
import msgspec

from cairn.api import actors
from cairn.api.app import App
from cairn.api.operator import cli_actor
from cairn.codec import values
from cairn.engine.budget import Budget
from cairn.errors import InvalidRunState, PayloadError, UnknownWorkflow
from cairn.store.records import RunStatus

from . import render
from .loading import loaded_app, open_session
from .options import app_option, db_option, served_database
from .options import db_from_context as _db
from .options import stderr_console as _stderr
from .signals import parse_json_option
from .terminal import echo, json_text


def _parse_input(text: str | None) -> Any:
    """``--input``: JSON text, ``@PATH`` for a file's contents or ``-`` for
    standard input (inputs too large for a command line). ``NaN`` and
    ``Infinity`` are refused: JSON has no such numbers, and the journal could
    not record them. No ``--input``: no arguments."""
    return {} if text is None else parse_json_option(text, "--input")


def _wait(app: App, run_id: str, timeout: float | None) -> Any:
    """The run's result once it ends. A run that needs an operator is not
    waited for (it would wait forever): that is an error naming what to do."""
    handle = app.handle(run_id)
    deadline = None if timeout is None else time.monotonic() + timeout
    with _stderr().status(f"waiting for run {run_id}…"):
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                return handle.result(timeout=1.0 if left is None else min(1.0, left))
            except TimeoutError:
                status = handle.status()
                if status is RunStatus.NEEDS_ATTENTION:
                    raise click.ClickException(
                        f"run {run_id!r} needs attention: the outcome of a side effect is uncertain "
                        f"(see 'cairn ops {run_id}')") from None
                if left is not None and left <= 1.0:
                    hint = " (is a worker running? start one with 'cairn worker --app ...')" \
                        if status is RunStatus.PENDING else ""
                    raise click.ClickException(
                        f"run {run_id!r} is still {status.value} after {timeout:g}s{hint}") from None


@click.command()
@click.argument("workflow")
@app_option(required=True)
@click.option("--input", "input_json", metavar="JSON",
              help="Inputs as JSON: an object names parameters, an array lists them, any other value is "
                   "the only argument; @PATH reads the JSON from a file, - from standard input. "
                   "Default: no arguments.")
@click.option("--run-id", default=None, help="Run id; starting an existing id returns that run unchanged.")
@click.option("--thread-id", default=None, help="Conversation/thread the run belongs to.")
@click.option("--tenant", default="default", show_default=True)
@click.option("--queue", default="default", show_default=True, help="Queue the run waits in for a worker.")
@click.option("--priority", type=int, default=0, show_default=True,
              help="Higher first among the tenant's runs in the queue.")
@click.option("--wait", is_flag=True, help="Wait for the run to end and print its result as JSON.")
@click.option("--timeout", type=click.FloatRange(min=0), default=None,
              help="With --wait: give up after S seconds.")
@click.option("--version", "version", metavar="V", default=None,
              help="The workflow version to start (default: the newest registered).")
@click.option("--role", type=click.Choice(["viewer", "operator", "admin", "installation"]), default=None,
              help="The token role the run is started with: what tools restricted by role "
                   "(cairn.ToolAccess(role=...)) allow it. Default: none (such tools refuse it).")
@click.option("--workspace-from", metavar="REPO", default=None,
              help="A local git repository whose tree (at --workspace-ref) is the run's starting workspace.")
@click.option("--workspace-ref", metavar="REF", default=None,
              help="With --workspace-from: the commit, branch or tag to import (default: HEAD).")
@click.option("--subject", default=None, metavar="S",
              help="Whose data the run holds (a user or customer id): sealed with that subject's own key, "
                   "inherited by its children and memory writes, erased by 'cairn erase --subject'.")
@db_option
@click.pass_context
def start(
    ctx: click.Context, workflow: str, app_spec: str, input_json: str | None, run_id: str | None,
    thread_id: str | None, tenant: str, queue: str, priority: int, wait: bool, timeout: float | None,
    version: str | None, role: str | None, workspace_from: str | None, workspace_ref: str | None,
    subject: str | None, db: str | None,
) -> None:
    """Start a run of WORKFLOW for a worker to execute; print its id.

    With --wait the id goes to stderr and stdout gets only the result, so the
    output can be piped to a JSON tool.
    """
    if timeout is not None and not wait:
        raise click.UsageError("--timeout only applies with --wait")
    if workspace_ref is not None and workspace_from is None:
        raise click.UsageError("--workspace-ref only applies with --workspace-from")
    data = _parse_input(input_json)
    with loaded_app(app_spec, _db(ctx, db)) as app:
        try:
            handle = app.start_json(workflow, data, run_id=run_id, thread_id=thread_id, tenant=tenant,
                                    queue=queue, priority=priority, version=version, started_role=role,
                                    started_by=actors.context(cli_actor(), tenant),
                                    workspace_from=workspace_from, workspace_ref=workspace_ref or "HEAD",
                                    subject=subject)
        except UnknownWorkflow as exc:
            raise click.BadParameter(str(exc), param_hint="'WORKFLOW'") from None
        except PayloadError as exc:
            raise click.BadParameter(str(exc), param_hint="'--input'") from None
        where = served_database(app.db_url)
        if handle.created is False:
            status = handle.status().value
            echo(f"run {handle.run_id} already existed ({status}); it was not started again and its "
                 f"input is unchanged (database: {where})", err=True)
        else:
            echo(f"started run {handle.run_id} (database: {where})", err=True)
        if not wait:
            echo(handle.run_id)
            return
        result = _wait(app, handle.run_id, timeout)
        click.echo(json_text(msgspec.json.format(values.encode(result), indent=2).decode()))




@click.command()
@click.argument("run_id", metavar="RUN")
@click.option("--reason", default="cancelled by operator", show_default=True)
@app_option(required=False)
@db_option
@click.pass_context
def cancel(ctx: click.Context, run_id: str, reason: str, app_spec: str | None, db: str | None) -> None:
    """Cancel a run and its unfinished children. A worker executing it stops at
    its next step boundary; the step in progress is not interrupted."""
    with open_session(_db(ctx, db), app_spec) as session:
        change = session.operator.cancel(run_id, reason)
    before = change.before.status
    if before is RunStatus.CANCELLED:
        echo(f"run {run_id} was already cancelled")
    elif before.terminal:
        raise InvalidRunState(f"run {run_id!r} is {before.value}; only unfinished runs can be cancelled")
    else:
        echo(f"cancelled run {run_id} (was {before.value})")


@click.command()
@click.argument("run_id", metavar="RUN")
@app_option(required=False)
@db_option
@click.pass_context
def retry(ctx: click.Context, run_id: str, app_spec: str | None, db: str | None) -> None:
    """Resume a failed or quarantined run from its last good step."""
    with open_session(_db(ctx, db), app_spec) as session:
        retried = session.operator.retry(run_id)
    position = retried.from_position
    where = f"from position {position}" if position is not None else "from the top of its journal"
    echo(f"retrying run {run_id} {where} (was {retried.before.status.value}); "
               f"it is {retried.run.status.value} until a worker picks it up")


@click.command()
@click.argument("run_id", metavar="RUN", required=False)
@click.option("--tenant", default=None, help="Kill every unfinished run of this tenant instead of one run.")
@click.option("--reason", default="killed by operator", show_default=True)
@app_option(required=False)
@db_option
@click.pass_context
def kill(
    ctx: click.Context, run_id: str | None, tenant: str | None, reason: str, app_spec: str | None,
    db: str | None,
) -> None:
    """The kill switch: stop a run and its unfinished children (or every
    unfinished run of a tenant) at the next step boundary. Their leases are
    revoked, so no further step result or side-effect intent of theirs is
    accepted. 'cairn resume RUN --force' brings a killed run back."""
    if (run_id is None) == (tenant is None):
        raise click.UsageError("give exactly one of RUN and --tenant")
    with open_session(_db(ctx, db), app_spec) as session:
        killed = session.operator.kill(run_id, tenant=tenant, reason=reason)
        if killed:
            echo(f"killed {len(killed)} run{'s' if len(killed) != 1 else ''}:")
            for record in killed:
                echo(f"  {record.run_id}  ({record.workflow}, tenant {record.tenant})")
            return
        if tenant is not None:
            echo(f"killed 0 runs: tenant {tenant!r} has no unfinished runs")
            return
        assert run_id is not None
        found = session.operator.get_run(run_id)
        if found.status is RunStatus.KILLED:
            echo(f"run {run_id} was already killed")
            return
        raise InvalidRunState(f"run {run_id!r} is {found.status.value}; only unfinished runs can be killed")


@click.command()
@click.argument("run_id", metavar="RUN")
@click.option("--force", is_flag=True, help="Required: a killed or halted run was stopped on purpose.")
@app_option(required=False)
@db_option
@click.pass_context
def resume(ctx: click.Context, run_id: str, force: bool, app_spec: str | None, db: str | None) -> None:
    """Bring a killed or halted run back where it stopped (needs --force)."""
    if not force:
        raise click.UsageError(f"killed and halted runs were stopped on purpose and only resume when forced: "
                               f"'cairn resume {run_id} --force'")
    with open_session(_db(ctx, db), app_spec) as session:
        revived = session.operator.revive(run_id)
    echo(f"resumed run {run_id} (was {revived.before.status.value}); it is {revived.run.status.value} "
               "until a worker picks it up")


@click.command()
@click.argument("run_id", metavar="RUN")
@click.option("--tokens", type=click.IntRange(min=0), default=None, help="Model tokens, in total.")
@click.option("--cost", type=click.FloatRange(min=0), default=None, help="Model cost, in total.")
@click.option("--tool-calls", type=click.IntRange(min=0), default=None, help="Tool calls, in total.")
@click.option("--wall-seconds", type=click.FloatRange(min=0), default=None,
              help="Seconds since the run was created.")
@app_option(required=False)
@db_option
@click.pass_context
def budget(
    ctx: click.Context, run_id: str, tokens: int | None, cost: float | None, tool_calls: int | None,
    wall_seconds: float | None, app_spec: str | None, db: str | None,
) -> None:
    """Set limits of a run's budget; a run suspended over its budget continues.

    The limits given replace those limits; the others stay as they were.
    A running run is refused: change it once it is suspended.
    """
    if tokens is None and cost is None and tool_calls is None and wall_seconds is None:
        raise click.UsageError("give at least one limit: --tokens, --cost, --tool-calls or --wall-seconds")
    with open_session(_db(ctx, db), app_spec) as session:
        change = session.operator.set_budget(run_id, Budget(tokens, cost, tool_calls, wall_seconds),
                                             keep_others=True)
    echo(f"budget of run {run_id}: {render.fmt_budget(change.run.budget)} "
               f"(was {render.fmt_budget(change.before.budget)}); the run is {change.run.status.value}")


