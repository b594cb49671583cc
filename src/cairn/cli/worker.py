"""``cairn worker``: execute runs until SIGTERM or Ctrl-C, with one log line
per claim that ends (``_outcome_logger``)."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable

import click

from cairn.api.app import App
from cairn.engine.executor import Outcome
from cairn.errors import CairnError
from cairn.store.records import Claim, EventType, RunStatus

from . import render
from .loading import loaded_app
from .options import app_option, db_option, served_database
from .options import db_from_context as _db
from .queues import describe_limits
from .schedules import describe_schedules
from .terminal import CleanFormatter, echo

log = logging.getLogger("cairn.worker")


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


@click.command()
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
@click.option("--no-retention", "no_retention", is_flag=True,
              help="Run no retention controller (other workers do; see 'cairn retention').")
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
    otel: bool = False, no_retention: bool = False,
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
                       schedules=not no_schedules, retention=not no_retention)
        served = ", ".join(sorted(w.workflows)) or "(none: the app registers no workflows)"
        echo(f"cairn worker {w.worker_id}: workflows {served}; queues "
             f"{', '.join(queues) if queues else 'all'}; concurrency {concurrency}; "
             f"lease {w.settings.lease_seconds:g}s; poll {poll:g}s")
        echo(f"  database: {served_database(app.db_url)}")
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
