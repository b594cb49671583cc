"""The ``cairn`` command: run workers, start runs, inspect and operate on them.

Every command takes ``--db URL`` (also accepted before the command name).
Errors a user can cause print one line, ``error: ...``, and exit 2 for usage
mistakes or 1 for everything else; a traceback always means a bug in Cairn.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click
import msgspec
from rich.console import Console

from cairn.api.app import App
from cairn.codec import values
from cairn.engine.executor import Outcome
from cairn.errors import CairnError, InvalidRunState, PayloadError, RunNotFound, UnknownWorkflow
from cairn.store.records import Claim, EventType, RunStatus

from . import render
from .loading import loaded_app, open_session

log = logging.getLogger("cairn.worker")
F = TypeVar("F", bound=Callable[..., Any])

DB_HELP = "Database URL (sqlite:///path.db, sqlite:////abs/path.db or a file path). Default: $CAIRN_DB, " \
          "then ./.cairn/cairn.db."


#: click >= 8.2 raises this for a bare ``cairn``; older versions print the help themselves.
_NO_ARGS_IS_HELP: Any = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _fail(message: str, code: int) -> int:
    click.echo(f"error: {message}", err=True)
    return code


def _usage_line(exc: click.UsageError) -> str:
    message = exc.format_message().rstrip(".")
    if exc.ctx is not None:
        message += f" (see '{exc.ctx.command_path} --help')"
    return message


class CairnGroup(click.Group):
    """A click group whose errors are one line on stderr, never a traceback
    or click's multi-line usage block: the CLI is also used from scripts,
    where one line per failure is what ends up in a log."""

    def main(  # type: ignore[override]
        self,
        args: list[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            code = rv if isinstance(rv, int) else 0
        except _NO_ARGS_IS_HELP as exc:  # bare `cairn`: the help, as click does
            click.echo(exc.format_message(), err=True)
            code = 2
        except click.UsageError as exc:
            code = _fail(_usage_line(exc), 2)
        except click.ClickException as exc:
            code = _fail(exc.format_message(), exc.exit_code)
        except click.Abort:  # Ctrl-C while click itself was prompting or parsing
            code = 130
        except CairnError as exc:
            code = _fail(str(exc), 1)
        except sqlite3.Error as exc:  # a database that opened but is damaged further in
            code = _fail(f"database error: {exc}", 1)
        if not standalone_mode:
            return code
        sys.exit(code)


def _db(ctx: click.Context, db: str | None) -> str | None:
    """``--db`` given on the command, else on the group, else ``None`` (env/default)."""
    if db is not None:
        return db
    root: str | None = ctx.find_root().params.get("db")
    return root


db_option = click.option("--db", metavar="URL", default=None, help=DB_HELP)


def app_option(required: bool) -> Callable[[F], F]:
    extra = "" if required else " Optional: only to take the database from the app."
    return click.option("--app", "app_spec", metavar="MODULE:APP", required=required,
                        help=f"Import path of your cairn.App, e.g. myproject.agents:app.{extra}")


def _stdout() -> Console:
    return Console(highlight=False)


def _stderr() -> Console:
    return Console(stderr=True, highlight=False)


@click.group(cls=CairnGroup, context_settings={"help_option_names": ["-h", "--help"]})
@db_option
@click.version_option(package_name="cairn", prog_name="cairn")
def main(db: str | None) -> None:
    """Cairn: a durable runtime for long-running AI agents."""


# -- demo --------------------------------------------------------------------------------------


@main.command()
@db_option
@click.option("--steps", type=click.IntRange(10, 20), default=20, show_default=True,
              help="Step budget of the demo agent (it reads (STEPS - 8) / 2 files).")
@click.pass_context
def demo(ctx: click.Context, db: str | None, steps: int) -> None:
    """Kill a worker in the middle of an agent run and watch another finish it.

    Starts the offline demo agent, SIGKILLs its worker after about 40% of the
    steps, starts a second worker, and checks from an effects log that no
    finished step ran twice.
    """
    from .demo import run_demo  # keeps `cairn --help` fast

    ctx.exit(run_demo(_db(ctx, db), steps, Console(highlight=False, soft_wrap=True)))


# -- worker ------------------------------------------------------------------------------------


def _log_outcome(claim: Claim, outcome: Outcome) -> None:
    run = f"run {claim.run.run_id} ({claim.run.workflow})"
    if outcome.status == "completed":
        log.info("%s completed", run)
    elif outcome.status == "suspended" and outcome.waiting_on:
        log.info("%s suspended until child %s ends", run, outcome.waiting_on)
    elif outcome.status == "suspended":
        log.info("%s suspended until %s", run, render.fmt_time(outcome.wake_at))
    elif outcome.status == "released":
        log.info("%s released for another worker", run)
    else:  # failed, lost, abandoned
        log.warning("%s %s: %s", run, outcome.status, outcome.error)


@main.command()
@app_option(required=True)
@click.option("--concurrency", type=click.IntRange(min=1), default=4, show_default=True,
              help="Runs executed at once (threads).")
@click.option("--worker-id", default=None, help="Stable id; default host-pid-random.")
@click.option("--lease", type=click.FloatRange(min=0.1), default=None,
              help="Lease length in seconds; a killed worker's runs are taken over after it. "
                   "Default: the app's (30).")
@click.option("--poll", type=click.FloatRange(min=0.001), default=0.1, show_default=True,
              help="Seconds between claims when idle.")
@click.option("--queue", "queues", multiple=True, metavar="Q", help="Serve only these queues (repeatable).")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              default="INFO", show_default=True)
@db_option
@click.pass_context
def worker(
    ctx: click.Context, app_spec: str, concurrency: int, worker_id: str | None, lease: float | None,
    poll: float, queues: tuple[str, ...], log_level: str, db: str | None,
) -> None:
    """Execute runs of the app's workflows until SIGTERM or Ctrl-C.

    On the signal the worker drains: it stops claiming, lets running steps
    finish and be recorded, and hands the runs back so another worker
    continues at once. A second signal exits immediately.
    """
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with loaded_app(app_spec, _db(ctx, db)) as app:
        if lease is not None:
            app.lease_seconds = lease  # read by app.worker() below; see the App's constructor
        w = app.worker(concurrency=concurrency, worker_id=worker_id, poll_interval=poll,
                       queues=queues or None)
        w.on_outcome = _log_outcome
        served = ", ".join(sorted(w.workflows)) or "(none: the app registers no workflows)"
        click.echo(f"cairn worker {w.worker_id}: workflows {served}; queues "
                   f"{', '.join(queues) if queues else 'all'}; concurrency {concurrency}; "
                   f"lease {app.lease_seconds:g}s; poll {poll:g}s", err=False)
        sys.stdout.flush()
        w.run(install_signals=True)
        log.info("worker %s stopped after claiming %d run(s)", w.worker_id, w.claimed)


# -- start -------------------------------------------------------------------------------------


def _parse_input(text: str | None) -> Any:
    if text is None:
        return {}
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint="'--input'") from None


def _wait(app: App, run_id: str, timeout: float | None) -> Any:
    handle = app.handle(run_id)
    with _stderr().status(f"waiting for run {run_id}…"):
        try:
            return handle.result(timeout=timeout)
        except TimeoutError:
            status = handle.status()
            hint = " (is a worker running? start one with 'cairn worker --app ...')" \
                if status is RunStatus.PENDING else ""
            raise click.ClickException(f"run {run_id!r} is still {status.value} after {timeout:g}s{hint}") \
                from None


@main.command()
@click.argument("workflow")
@app_option(required=True)
@click.option("--input", "input_json", metavar="JSON",
              help="Inputs as JSON: an object names parameters, an array lists them, any other value is "
                   "the only argument. Default: no arguments.")
@click.option("--run-id", default=None, help="Run id; starting an existing id returns that run unchanged.")
@click.option("--thread-id", default=None, help="Conversation/thread the run belongs to.")
@click.option("--tenant", default="default", show_default=True)
@click.option("--wait", is_flag=True, help="Wait for the run to end and print its result as JSON.")
@click.option("--timeout", type=click.FloatRange(min=0), default=None,
              help="With --wait: give up after S seconds.")
@db_option
@click.pass_context
def start(
    ctx: click.Context, workflow: str, app_spec: str, input_json: str | None, run_id: str | None,
    thread_id: str | None, tenant: str, wait: bool, timeout: float | None, db: str | None,
) -> None:
    """Start a run of WORKFLOW for a worker to execute; print its id.

    With --wait the id goes to stderr and stdout gets only the result, so the
    output can be piped to a JSON tool.
    """
    if timeout is not None and not wait:
        raise click.UsageError("--timeout only applies with --wait")
    data = _parse_input(input_json)
    with loaded_app(app_spec, _db(ctx, db)) as app:
        try:
            handle = app.start_json(workflow, data, run_id=run_id, thread_id=thread_id, tenant=tenant)
        except UnknownWorkflow as exc:
            raise click.BadParameter(str(exc), param_hint="'WORKFLOW'") from None
        except PayloadError as exc:
            raise click.BadParameter(str(exc), param_hint="'--input'") from None
        if not wait:
            click.echo(handle.run_id)
            return
        click.echo(f"started run {handle.run_id}", err=True)
        result = _wait(app, handle.run_id, timeout)
        click.echo(msgspec.json.format(values.encode(result), indent=2).decode())


# -- inspection --------------------------------------------------------------------------------


@main.command()
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
    from cairn.store.records import RunFilter

    statuses = (RunStatus(status),) if status else None
    with open_session(_db(ctx, db), app_spec) as session:
        records = session.store.list_runs(RunFilter(statuses, tenant, workflow, None, None, limit))
        if as_json:
            for record in records:
                click.echo(json.dumps(render.run_json(record)))
        elif records:
            _stdout().print(render.runs_table(records))
        else:
            click.echo("no runs", err=True)


@main.command()
@click.argument("run_id", metavar="RUN")
@click.option("--json", "as_json", is_flag=True)
@app_option(required=False)
@db_option
@click.pass_context
def show(ctx: click.Context, run_id: str, as_json: bool, app_spec: str | None, db: str | None) -> None:
    """Show a run: its state, its journal step by step, and its result or error."""
    with open_session(_db(ctx, db), app_spec) as session:
        record = session.store.get_run(run_id)
        if record is None:
            raise RunNotFound(run_id)
        history = session.store.history(run_id)
        if as_json:
            click.echo(json.dumps(render.show_json(session.store, record, history), indent=2))
        else:
            render.print_run(_stdout(), session.store, record, history)


@main.command()
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
    with open_session(_db(ctx, db), app_spec) as session:
        store = session.store
        last = after
        try:
            while True:
                # Read the status before the entries: the entry that ends a run
                # is written with its status, so after seeing a terminal status
                # one more read has every entry there will ever be.
                record = store.get_run(run_id)
                if record is None:
                    raise RunNotFound(run_id)
                for event in store.history(run_id, last):
                    if as_json:
                        click.echo(json.dumps(render.event_json(store, event)))
                    else:
                        console.print(render.event_line(store, event), soft_wrap=True)
                    last = event.seq
                sys.stdout.flush()
                if not follow or record.status.terminal:
                    return
                time.sleep(0.2)
        except KeyboardInterrupt:
            ctx.exit(130)


# -- operations --------------------------------------------------------------------------------


@main.command()
@click.argument("run_id", metavar="RUN")
@click.option("--reason", default="cancelled by operator", show_default=True)
@app_option(required=False)
@db_option
@click.pass_context
def cancel(ctx: click.Context, run_id: str, reason: str, app_spec: str | None, db: str | None) -> None:
    """Cancel a run and its unfinished children. A worker executing it stops at
    its next step boundary; the step in progress is not interrupted."""
    with open_session(_db(ctx, db), app_spec) as session:
        before = session.store.get_run(run_id)
        if before is None:
            raise RunNotFound(run_id)
        if before.status is RunStatus.CANCELLED:
            click.echo(f"run {run_id} was already cancelled")
            return
        if before.status.terminal:
            raise InvalidRunState(f"run {run_id!r} is {before.status.value}; only unfinished runs can be "
                                  "cancelled")
        session.store.cancel_run(run_id, reason)
        click.echo(f"cancelled run {run_id} (was {before.status.value})")


@main.command()
@click.argument("run_id", metavar="RUN")
@app_option(required=False)
@db_option
@click.pass_context
def retry(ctx: click.Context, run_id: str, app_spec: str | None, db: str | None) -> None:
    """Resume a failed or quarantined run from its last good step."""
    with open_session(_db(ctx, db), app_spec) as session:
        record = session.store.retry_run(run_id)
        retried = [e for e in session.store.history(run_id) if e.event is EventType.RUN_RETRIED]
        detail = (retried[-1].detail or {}) if retried else {}
        position = detail.get("from_position")
        where = f"from position {position}" if position is not None else "from the top of its journal"
        click.echo(f"retrying run {run_id} {where} (was {detail.get('previous_status', '?')}); "
                   f"it is {record.status.value} until a worker picks it up")
