"""``cairn ops`` and ``cairn ops resolve``: a run's side-effecting tool calls,
and an operator's settlement of one whose outcome is uncertain."""

from __future__ import annotations

import json
import shlex
from typing import Any

import click
import msgspec
from rich.console import Console
from rich.text import Text

from cairn.api import views
from cairn.api.ledger import OperationView
from cairn.api.views import ResolveCommandsOut
from cairn.store import DEFAULT_DB

from . import render
from .loading import open_session
from .options import DefaultCommandGroup, app_option, db_option
from .options import db_from_context as _db
from .options import stdout_console as _stdout
from .terminal import echo, echo_json


@click.group(cls=DefaultCommandGroup, default="list")
@db_option
def ops(db: str | None) -> None:
    """A run's tool calls; resolve an uncertain side effect.

    \b
    cairn ops RUN                               list them ('list' is the default)
    cairn ops resolve RUN POS --done JSON       it happened: record JSON as its result
    cairn ops resolve RUN POS --not-done        it did not: execute it again

    A write tool without a reconcile function whose outcome is uncertain (a
    crash, or an error that does not prove it absent) puts its run in
    needs_attention until an operator checks the outside world and resolves it.
    Executed again or not, the call keeps its operation id.
    """


def _resolve_commands(run_id: str, position: int, db_url: str) -> dict[str, str]:
    db = ["--db", db_url] if db_url != DEFAULT_DB else []
    base = ["cairn", "ops", "resolve", run_id, str(position)]
    return {"done": shlex.join([*base, "--done", "RESULT_JSON", *db]),
            "not_done": shlex.join([*base, "--not-done", *db])}


@ops.command("list")
@click.argument("run_id", metavar="RUN")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: the run and its operations.")
@app_option(required=False)
@db_option
@click.pass_context
def ops_list(ctx: click.Context, run_id: str, as_json: bool, app_spec: str | None, db: str | None) -> None:
    """(default) List a run's tool calls: position, tool, status (done,
    failed, uncertain, pending), operation id and attempt; for an uncertain
    one, its arguments and the commands that resolve it."""
    with open_session(_db(ctx, db), app_spec, read_only=True) as session:
        report = session.operator.operations(run_id)  # RunNotFound for an unknown id
    record, uncertain = report.run, report.uncertain()
    if as_json:  # the shape of GET /api/runs/{id}/operations, and the commands that resolve
        resolve = [ResolveCommandsOut(position=op.position, **_resolve_commands(run_id, op.position,
                                                                                 session.db_url))
                   for op in uncertain]
        out = msgspec.structs.replace(views.operations_of(report), resolve=resolve)
        echo_json(views.plain(out), indent=2, ensure_ascii=False, default=str)
        return
    if not report.operations:
        echo(f"run {run_id} ({record.status.value}) has made no tool calls", err=True)
        return
    console = _stdout()
    console.print(Text(f"run {run_id} ({record.workflow}): ") + render.status_text(record.status))
    console.print(render.ops_table(report.operations))
    for op in uncertain:
        _print_uncertain(console, run_id, op, session.db_url)


def _print_uncertain(console: Console, run_id: str, op: OperationView, db_url: str) -> None:
    why = op.why or "its outcome is not recorded"
    commands = _resolve_commands(run_id, op.position, db_url)
    console.print()
    console.print(Text(f"needs attention: #{op.position} {op.tool} (operation {op.operation_id}) "
                       f"may or may not have happened: {why}", style="bold yellow"), soft_wrap=True)
    console.print(f"  arguments: {render.arguments_text(op)}", markup=False, soft_wrap=True)
    console.print(f"  check the outside world for operation id {op.operation_id}, then:", markup=False,
                  soft_wrap=True)
    console.print(f"  if it happened:       {commands['done']}", markup=False, soft_wrap=True)
    console.print("                        (RESULT_JSON: the tool's result as JSON; it is recorded, not "
                  "executed again)", markup=False, soft_wrap=True)
    console.print(f"  if it did not happen: {commands['not_done']}", markup=False, soft_wrap=True)
    console.print("                        (executes it again with the same operation id)", markup=False,
                  soft_wrap=True)


def _parse_result(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint="'--done'") from None


@ops.command("resolve")
@click.argument("run_id", metavar="RUN")
@click.argument("position", type=click.IntRange(min=0))
@click.option("--done", "done_json", metavar="JSON", default=None,
              help="It happened: record JSON as the tool's result (the tool is not executed again).")
@click.option("--not-done", is_flag=True,
              help="It did not happen: execute the tool again, with the same operation id.")
@app_option(required=False)
@db_option
@click.pass_context
def ops_resolve(
    ctx: click.Context, run_id: str, position: int, done_json: str | None, not_done: bool,
    app_spec: str | None, db: str | None,
) -> None:
    """Settle the uncertain operation at POSITION of a run that needs attention."""
    if (done_json is None) == (not not_done):
        raise click.UsageError("give exactly one of --done JSON and --not-done")
    result = _parse_result(done_json) if done_json is not None else None
    done = done_json is not None
    with open_session(_db(ctx, db), app_spec) as session:
        resolved = session.operator.resolve(run_id, position, done=done, result=result)
    tool = resolved.operation.tool if resolved.operation is not None else "?"
    what = ("done: its result is recorded and it will not be executed again" if done
            else "not done: it will be executed again with the same operation id")
    echo(f"resolved #{position} {tool} of run {run_id} as {what}; the run is "
               f"{resolved.run.status.value} until a worker picks it up")


