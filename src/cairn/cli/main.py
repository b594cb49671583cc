"""The ``cairn`` command: run workers, start runs, inspect and operate on them.

Every command takes ``--db URL`` (also accepted before the command name).
Errors a user can cause print one line, ``error: ...``, and exit 2 for usage
mistakes or 1 for everything else; a traceback always means a bug in Cairn.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
import shlex
import sys
import time
from collections.abc import Callable
from typing import Any

import click
import msgspec
from rich.console import Console
from rich.text import Text

from cairn.api import views
from cairn.api.app import App
from cairn.api.operator import Schema, open_schema
from cairn.codec import values
from cairn.engine.budget import Budget
from cairn.engine.executor import Outcome
from cairn.engine.ledger import OperationView
from cairn.errors import (
    CairnError,
    InvalidRunState,
    PayloadError,
    UnknownWorkflow,
)
from cairn.store import DEFAULT_DB, resolve_url, sqlite_path
from cairn.store.records import Claim, EventType, RunStatus

from . import render
from .approvals import approvals, approve, pending_of, print_pending, reject
from .bundles import COMMANDS as BUNDLE_COMMANDS
from .loading import loaded_app, open_session
from .memory import memory
from .options import CairnGroup, DefaultCommandGroup, app_option, database_label, db_option
from .options import db_from_context as _db
from .options import stderr_console as _stderr
from .options import stdout_console as _stdout
from .queues import describe_limits, queues
from .schedules import describe_schedules, schedules
from .signals import parse_json_option
from .signals import signal as signal_command
from .signals import wait as wait_command
from .terminal import CleanFormatter, echo, echo_json, json_text

log = logging.getLogger("cairn.worker")

@click.group(cls=CairnGroup, context_settings={"help_option_names": ["-h", "--help"]})
@db_option
@click.version_option(package_name="cairn", prog_name="cairn")
def main(db: str | None) -> None:
    """Cairn: a durable runtime for long-running AI agents."""


# -- demo --------------------------------------------------------------------------------------


@main.group(invoke_without_command=True)
@db_option
@click.option("--steps", type=click.IntRange(10, 20), default=None,
              help="Step budget of the demo agent (it reads (STEPS - 8) / 2 files). Default: 20.")
@click.pass_context
def demo(ctx: click.Context, db: str | None, steps: int | None) -> None:
    """Kill a worker in the middle of an agent run and watch another finish it.

    Starts the offline demo agent, SIGKILLs its worker after about 40% of the
    steps, starts a second worker, and checks from an effects log that no
    finished step ran twice. 'cairn demo payments' runs the exactly-once
    payments demo instead; 'cairn demo approval' the approval demo.
    """
    if ctx.invoked_subcommand is not None:
        if steps is not None:
            raise click.UsageError(f"--steps only applies to the research-agent demo ('cairn demo'), not "
                                   f"'cairn demo {ctx.invoked_subcommand}'")
        return
    from .demo import run_demo  # keeps `cairn --help` fast

    ctx.exit(run_demo(_db(ctx, db), 20 if steps is None else steps, Console(highlight=False, soft_wrap=True)))


@demo.command("payments")
@db_option
@click.pass_context
def demo_payments(ctx: click.Context, db: str | None) -> None:
    """Kill a worker between the bank moving money and Cairn recording it;
    check that the bank holds exactly one transfer per refund."""
    db = _db(ctx, db)
    if db is not None and sqlite_path(db) is None:
        raise click.UsageError(f"the payments demo needs a SQLite database file that its worker processes "
                               f"can share, not {db!r}")
    run_payments_demo = _payments_demo()
    ctx.exit(run_payments_demo(db, Console(highlight=False, soft_wrap=True)))


@demo.command("approval")
@db_option
@click.pass_context
def demo_approval(ctx: click.Context, db: str | None) -> None:
    """A refund that waits for a person: the waiting run holds no worker, a
    worker killed during the wait loses nothing, and the edited amount is
    paid exactly once."""
    db = _db(ctx, db)
    if db is not None and sqlite_path(db) is None:
        raise click.UsageError(f"the approval demo needs a SQLite database file that its worker processes "
                               f"can share, not {db!r}")
    previous = os.environ.get("CAIRN_DB")
    if "cairn.demo.approval" not in sys.modules:
        os.environ["CAIRN_DB"] = "memory://"  # its module-level App must not create a database here
    try:
        from cairn.demo.approval import run_approval_demo
    finally:
        if previous is None:
            os.environ.pop("CAIRN_DB", None)
        else:
            os.environ["CAIRN_DB"] = previous
    ctx.exit(run_approval_demo(db, Console(highlight=False, soft_wrap=True)))


def _payments_demo() -> Callable[[str | None, Console], int]:
    """``cairn.demo.payments.run_payments_demo``, imported without side effects.

    The module builds a ``cairn.App()`` at import time (for its workers, which
    get ``--db``); here that App is never used, so it is pointed at a
    throwaway in-memory store instead of creating ``$CAIRN_DB`` or the default
    database file as a side effect of importing.
    """
    previous = os.environ.get("CAIRN_DB")
    if "cairn.demo.payments" not in sys.modules:
        os.environ["CAIRN_DB"] = "memory://"
    try:
        payments = importlib.import_module("cairn.demo.payments")
    except ImportError as exc:
        raise click.ClickException(f"the payments demo is not installed ({exc})") from None
    finally:
        if previous is None:
            os.environ.pop("CAIRN_DB", None)
        else:
            os.environ["CAIRN_DB"] = previous
    run: Callable[[str | None, Console], int] | None = getattr(payments, "run_payments_demo", None)
    if run is None:
        raise click.ClickException("the payments demo is not installed")
    return run


# -- worker ------------------------------------------------------------------------------------


def _outcome_logger(app: App) -> Callable[[Claim, Outcome], None]:
    """The worker's ``on_outcome``: one log line per claim that ends."""

    def log_outcome(claim: Claim, outcome: Outcome) -> None:
        run_id = claim.run.run_id
        run = f"run {run_id} ({claim.run.workflow})"
        if outcome.status == "completed":
            log.info("%s completed", run)
        elif outcome.status == "suspended" and outcome.waiting_for:
            log.info("%s suspended, %s", run, render.waiting_for_text(outcome.waiting_for, outcome.wake_at))
        elif outcome.status == "suspended" and outcome.waiting_on:
            log.info("%s suspended until child %s ends", run, outcome.waiting_on)
        elif outcome.status == "suspended" and outcome.wake_at is not None:
            log.info("%s suspended until %s", run, render.fmt_time(outcome.wake_at))
        elif outcome.status == "suspended":  # no timer: an operator is needed
            log.warning("%s %s", run, _parked(app, run_id))
        elif outcome.status == "released" and outcome.error:
            log.info("%s rewound: %s", run, outcome.error)
        elif outcome.status == "released":
            log.info("%s released for another worker", run)
        else:  # failed, halted, lost, abandoned
            log.warning("%s %s: %s", run, outcome.status, outcome.error)

    return log_outcome


def _parked(app: App, run_id: str) -> str:
    """Why a run was suspended without a timer, said for the worker's log."""
    try:
        record = app.get_run(run_id)
        history = app.history(run_id)
    except Exception:  # logging must never take the worker down
        return "suspended"
    if record.status is RunStatus.NEEDS_ATTENTION:
        return f"needs attention: an operation's outcome is uncertain (see 'cairn ops {run_id}')"
    last = next((e for e in reversed(history) if e.event is EventType.RUN_SUSPENDED), None)
    reason = render.lifecycle_detail(last) if last is not None else ""
    return f"suspended: {reason}" if reason else "suspended"


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
@click.option("--no-schedules", "no_schedules", is_flag=True,
              help="Fire none of the app's schedules (other workers do).")
@click.option("--otel", is_flag=True,
              help="Export live spans and metrics over OTLP/HTTP (OTEL_EXPORTER_OTLP_* variables; "
                   "needs the otel-export extra).")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              default="INFO", show_default=True)
@db_option
@click.pass_context
def worker(
    ctx: click.Context, app_spec: str, concurrency: int, worker_id: str | None, lease: float | None,
    poll: float, queues: tuple[str, ...], log_level: str, db: str | None, no_schedules: bool = False,
    otel: bool = False,
) -> None:
    """Execute runs of the app's workflows until SIGTERM or Ctrl-C.

    On the signal the worker drains: it stops claiming, lets running steps
    finish and be recorded, and hands the runs back so another worker
    continues at once. A second signal exits immediately.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(CleanFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=log_level.upper(), handlers=[handler])
    with loaded_app(app_spec, _db(ctx, db)) as app:
        w = app.worker(concurrency=concurrency, worker_id=worker_id, poll_interval=poll,
                       queues=queues or None, lease_seconds=lease, on_outcome=_outcome_logger(app),
                       schedules=not no_schedules)
        served = ", ".join(sorted(w.workflows)) or "(none: the app registers no workflows)"
        echo(f"cairn worker {w.worker_id}: workflows {served}; queues "
             f"{', '.join(queues) if queues else 'all'}; concurrency {concurrency}; "
             f"lease {w.settings.lease_seconds:g}s; poll {poll:g}s")
        echo(f"  database: {_served_database(app)}")
        for stats in app.queues():
            if not stats.limits.unlimited and (not queues or stats.limits.name in queues):
                echo(f"  queue {stats.limits.name}: {describe_limits(stats.limits)}")
        for line in describe_schedules(app, fired=not no_schedules):
            echo(line)
        for bundle in sorted(app.runtime.registry.local().values(), key=lambda b: (b.workflow, b.version)):
            echo(f"  bundle {bundle.bundle_id}: {bundle.workflow} version {bundle.version}")
        stop_export = _export_otlp(app) if otel else None
        sys.stdout.flush()
        try:
            w.run(install_signals=True)
        finally:
            if stop_export is not None:
                stop_export()  # flushes the spans and metrics still buffered
        log.info("worker %s stopped after claiming %d run(s)", w.worker_id, w.claimed)


def _export_otlp(app: App) -> Callable[[], None]:
    try:
        from cairn.api.instrumentation import export_otlp

        stop = export_otlp(app, service_name="cairn-worker")
    except (ImportError, CairnError) as exc:
        raise click.ClickException(str(exc).splitlines()[0]) from None
    echo(f"  telemetry: spans and metrics over OTLP/HTTP to "
         f"{os.environ.get('OTEL_EXPORTER_OTLP_ENDPOINT', 'http://localhost:4318')}")
    return stop


def _served_database(app: App) -> str:
    """Which database ``app`` works on, for the worker's banner and ``start``."""
    if app.db_url is None:
        return "the store the app was built with"
    return database_label(app.db_url)


# -- start -------------------------------------------------------------------------------------


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


@main.command()
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
@db_option
@click.pass_context
def start(
    ctx: click.Context, workflow: str, app_spec: str, input_json: str | None, run_id: str | None,
    thread_id: str | None, tenant: str, queue: str, priority: int, wait: bool, timeout: float | None,
    version: str | None, db: str | None,
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
            handle = app.start_json(workflow, data, run_id=run_id, thread_id=thread_id, tenant=tenant,
                                    queue=queue, priority=priority, version=version)
        except UnknownWorkflow as exc:
            raise click.BadParameter(str(exc), param_hint="'WORKFLOW'") from None
        except PayloadError as exc:
            raise click.BadParameter(str(exc), param_hint="'--input'") from None
        where = _served_database(app)
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
    with open_session(_db(ctx, db), app_spec, read_only=True) as session:
        records = session.app.list_runs(status=status, tenant=tenant, workflow=workflow, limit=limit)
        if as_json:
            for record in records:
                echo_json(views.run_json(record))
        elif records:
            render.print_runs(_stdout(), records)
        else:
            echo("no runs", err=True)


@main.command()
@click.argument("run_id", metavar="RUN")
@click.option("--json", "as_json", is_flag=True)
@app_option(required=False)
@db_option
@click.pass_context
def show(ctx: click.Context, run_id: str, as_json: bool, app_spec: str | None, db: str | None) -> None:
    """Show a run: its state, its journal step by step, and its result or error."""
    with open_session(_db(ctx, db), app_spec, read_only=True) as session:
        record = session.app.get_run(run_id)
        history = session.app.history(run_id)
        pending = pending_of(session, run_id)
        waiting = session.operator.waiting_for_worker(record)  # no live worker serves its bundle
        if as_json:
            shown = render.show_json(session.codec, record, history)
            shown["approvals"] = [view.as_dict() for view in pending]
            shown["bundle"], shown["waiting"] = record.bundle, waiting
            echo_json(shown, indent=2)
        else:
            console = _stdout()
            render.print_run(console, session.codec, record, history)
            print_pending(console, pending)
            if waiting is not None:
                echo(waiting)


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
        change = session.operator.cancel(run_id, reason)
    before = change.before.status
    if before is RunStatus.CANCELLED:
        echo(f"run {run_id} was already cancelled")
    elif before.terminal:
        raise InvalidRunState(f"run {run_id!r} is {before.value}; only unfinished runs can be cancelled")
    else:
        echo(f"cancelled run {run_id} (was {before.value})")


@main.command()
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


@main.command()
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


@main.command()
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


@main.command()
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


# -- side-effecting operations -----------------------------------------------------------------


@main.group(cls=DefaultCommandGroup, default="list")
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
    if as_json:
        operations = []
        waiting = {op.position for op in uncertain}
        for op in report.operations:
            entry = op.as_dict()
            if op.position in waiting:
                entry["arguments"] = op.arguments.value if op.arguments is not None else None
                entry["why"] = op.why
                entry["resolve"] = _resolve_commands(run_id, op.position, session.db_url)
            operations.append(entry)
        out = {"run_id": run_id, "status": record.status.value, "operations": operations}
        echo_json(out, indent=2, ensure_ascii=False, default=str)
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


# -- database maintenance ----------------------------------------------------------------------


def _open_unmigrated(db: str | None, *, create: bool) -> Schema:
    """The schema of the database named by ``db``, opened without applying
    migrations. ``create=False`` refuses a SQLite file that does not exist."""
    try:
        return open_schema(db, create=create)
    except ValueError as exc:  # a memory:// store
        raise click.UsageError(str(exc)) from None


@main.group("db")
@db_option
def db_group(db: str | None) -> None:
    """The database's schema: show its version, apply migrations.

    \b
    cairn db status     schema version and pending migrations (changes nothing)
    cairn db migrate    apply the pending migrations
    """


@db_group.command("status")
@db_option
@click.pass_context
def db_status(ctx: click.Context, db: str | None) -> None:
    """Show the schema version and the migrations not applied yet, without
    applying them."""
    from cairn.store.sqlfiles import load_migrations

    schema = _open_unmigrated(_db(ctx, db), create=False)
    dialect = schema.dialect
    try:
        version = schema.version()
    finally:
        schema.close()
    known = load_migrations(dialect)
    latest = known[-1].version if known else 0
    pending = [m for m in known if m.version > version]
    echo(f"database: {resolve_url(_db(ctx, db))} ({dialect})")
    echo(f"schema version: {version} (this Cairn's latest: {latest})")
    if version > latest:
        echo("a newer Cairn migrated this database: upgrade Cairn before using it")
    elif pending:
        listed = ", ".join(f"{m.version} {m.name}" for m in pending)
        echo(f"pending migrations ({len(pending)}): {listed}")
        echo("apply them with 'cairn db migrate'")
    else:
        echo("up to date")


@db_group.command("migrate")
@db_option
@click.pass_context
def db_migrate(ctx: click.Context, db: str | None) -> None:
    """Apply the migrations the database lacks (creating a SQLite file that
    does not exist yet). Safe to run while workers are running, and from
    several machines at once on PostgreSQL."""
    from cairn.store.sqlfiles import load_migrations

    schema = _open_unmigrated(_db(ctx, db), create=True)
    dialect = schema.dialect
    try:
        applied = schema.migrate()
        version = schema.version()
    finally:
        schema.close()
    if not applied:
        echo(f"up to date (schema version {version})")
        return
    names = {m.version: m.name for m in load_migrations(dialect)}
    for number in applied:
        echo(f"applied migration {number} {names.get(number, '')}".rstrip())
    echo(f"schema version {version}")


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(?:\d+(?:\.\d+)?[smhdw])+")


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``7d``, ``12h``, ``30m``, ``90s``, ``2w``
    or ``1d12h``."""
    cleaned = text.strip().lower()
    if not _DURATION.fullmatch(cleaned):
        raise click.BadParameter(f"{text!r} is not a duration: use a number and a unit, e.g. 7d, 12h, 30m "
                                 "or 1d12h (units s, m, h, d, w)", param_hint="'--older-than'")
    return sum(float(number) * _DURATION_UNITS[unit]
               for number, unit in re.findall(r"(\d+(?:\.\d+)?)([smhdw])", cleaned))


@main.command()
@click.option("--older-than", "older_than", required=True, metavar="DURATION",
              help="Prune runs that ended (and last changed) longer ago than this: 7d, 12h, 30m, 1d12h...")
@click.option("--status", "statuses", multiple=True, metavar="STATUS",
              type=click.Choice([s.value for s in RunStatus if s.terminal]),
              help="Prune runs that ended with this status (repeatable). Default: completed, failed and "
                   "cancelled; quarantined, killed and halted runs wait for an operator, so only by name.")
@click.option("--dry-run", is_flag=True, help="Only count the runs that would be pruned.")
@app_option(required=False)
@db_option
@click.pass_context
def prune(
    ctx: click.Context, older_than: str, statuses: tuple[str, ...], dry_run: bool, app_spec: str | None,
    db: str | None,
) -> None:
    """Delete finished runs, with their histories and the artifacts only they
    used, to keep the database from growing forever.

    A run goes only together with its whole tree of parent and child runs,
    and only when every run of the tree has ended with one of the statuses
    and last changed before the cutoff: a live run, or a child of one, is
    never touched. Works in batches, one transaction each.
    """
    seconds = parse_duration(older_than)
    chosen = [RunStatus(s) for s in statuses] if statuses else None
    described = ", ".join(statuses) if statuses else "completed, failed or cancelled"
    with open_session(_db(ctx, db), app_spec) as session:
        count = session.operator.prune(seconds, statuses=chosen, dry_run=dry_run)
    runs = f"{count} run{'s' if count != 1 else ''}"
    what = f"{described}, last changed more than {older_than.strip()} ago"
    echo(f"would prune {runs} ({what})" if dry_run else f"pruned {runs} ({what})")


main.add_command(queues)
main.add_command(memory)
main.add_command(signal_command)
main.add_command(wait_command)


# -- approvals (cli/approvals.py) -------------------------------------------------------------
main.add_command(approvals)
main.add_command(approve)
main.add_command(reject)



# -- the HTTP API (cairn.server): serve, tokens, watch ------------------------------------------

from .serve import serve  # noqa: E402
from .tokens import tokens  # noqa: E402
from .watch import watch  # noqa: E402

main.add_command(serve)
main.add_command(tokens)
main.add_command(watch)


# -- schedules (cli/schedules.py) ------------------------------------------------------------
main.add_command(schedules)

# -- bundles: versions side by side, replay checks, migration, export (cli/bundles.py)
for _command in BUNDLE_COMMANDS:
    main.add_command(_command)
