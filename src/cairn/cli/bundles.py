"""``cairn bundles``, ``replay-check``, ``migrate`` and ``export``: versions of
workflows, and moving runs between them only when their journals allow it.

A run executes on the bundle it started with (``cairn.engine.bundles``).
``replay-check`` replays runs' journals against an app's code in a dry run;
``migrate`` moves runs to another bundle only if that check passes, or with
``--force --reason`` (recorded with the actor in the run's history);
``export`` writes a run's journal for ``cairn.testing.replay``.

Bad input (a run or bundle that does not exist, a bundle this code does not
serve, a forced migration without a reason) is one line and exit status 2;
a divergence found is exit status 1.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import click
from rich.table import Table

from cairn.api.operator import BundleView
from cairn.errors import InvalidArgument, InvalidRunState, MigrationRefused, RunNotFound, UnknownWorkflow

from .loading import open_session
from .options import app_option, db_from_context, db_option, stdout_console
from .terminal import echo, echo_json


class BadInput(click.ClickException):
    """A new command's bad input: one line, exit status 2."""

    exit_code = 2


@contextmanager
def _bad_input() -> Iterator[None]:
    """Input errors of these commands leave as ``BadInput`` (exit 2)."""
    try:
        yield
    except (RunNotFound, InvalidArgument, UnknownWorkflow) as exc:
        raise BadInput(str(exc)) from None


def _ago(at: float | None) -> str:
    if at is None:
        return "never"
    seconds = max(0.0, time.time() - at)
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.0f}h ago"


def _runs(view: BundleView) -> str:
    return ", ".join(f"{n} {status}" for status, n in sorted(view.runs.items())) or "none"


def _table(views: list[BundleView]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("bundle", no_wrap=True)
    for column in ("workflow", "version", "served", "runs", "pins"):
        table.add_column(column, overflow="fold")
    for v in views:
        pins = (f"{len(v.prompts)} prompts, {len(v.models)} models, {len(v.tools)} tools"
                if v.bundle_id is not None else "(runs older than bundles)")
        if v.damaged:
            pins = f"DAMAGED: {v.damaged}"
        table.add_row(v.bundle_id or "-", v.workflow, v.version, _ago(v.served_at), _runs(v), pins)
    return table


@click.command("bundles")
@click.option("--json", "as_json", is_flag=True, help="One JSON array, one object per bundle.")
@app_option(required=False)
@db_option
@click.pass_context
def bundles(ctx: click.Context, as_json: bool, app_spec: str | None, db: str | None) -> None:
    """Every bundle: workflow and version, when a worker last served it, its
    runs per status, and the prompts, model settings and tools it pins."""
    with open_session(db_from_context(ctx, db), app_spec, read_only=True) as session:
        views = session.operator.bundles()
    if as_json:
        echo_json([v.as_dict() for v in views], indent=2)
    elif not views:
        echo("no bundles")
    else:
        stdout_console().print(_table(views), soft_wrap=True)


@click.command("replay-check")
@click.argument("run_ids", metavar="RUN...", nargs=-1, required=True)
@app_option(required=True)
@click.option("--bundle", metavar="B", default=None,
              help="Check against this bundle (default: the newest version of each run's workflow).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per run.")
@db_option
@click.pass_context
def replay_check(ctx: click.Context, run_ids: tuple[str, ...], app_spec: str, bundle: str | None,
                 as_json: bool, db: str | None) -> None:
    """Replay runs' journals against the app's code in a dry run (nothing is
    written, executed or asked of a model) and report the first divergence
    of each, or 'compatible'. Exit status 1 if any run diverges."""
    diverged = False
    with _bad_input(), open_session(db_from_context(ctx, db), app_spec) as session:
        for run_id in run_ids:
            report = session.app.replay_check(run_id, bundle=bundle)
            diverged = diverged or not report.compatible
            if as_json:
                echo_json(report.as_dict())
            else:
                echo(report.describe())
    if diverged:
        ctx.exit(1)


@click.command("migrate")
@click.argument("run_ids", metavar="RUN...", nargs=-1, required=True)
@click.option("--to", "to", metavar="BUNDLE", required=True, help="The bundle to move the runs to.")
@app_option(required=True)
@click.option("--force", is_flag=True, help="Move runs whose replay check fails (needs --reason).")
@click.option("--reason", metavar="TEXT", default=None, help="Why a forced move is needed (e.g. a CVE).")
@db_option
@click.pass_context
def migrate(ctx: click.Context, run_ids: tuple[str, ...], to: str, app_spec: str, force: bool,
            reason: str | None, db: str | None) -> None:
    """Move runs to bundle BUNDLE, each only if its journal replays on that
    bundle's code (replay-check); --force --reason moves it anyway. The
    journal stays; the run's history records the move, the actor and the
    reason. Exit status 1 if any run was not moved."""
    if force and not (reason or "").strip():
        raise BadInput("--force needs --reason (why the check is overridden, e.g. 'CVE-2026-1234')")
    if reason is not None and not force:
        raise BadInput("--reason is for --force (a migration that passes its check needs none)")
    refused = False
    with _bad_input(), open_session(db_from_context(ctx, db), app_spec) as session:
        for run_id in run_ids:
            try:
                report, run = session.app.migrate(run_id, to, force=force, reason=reason,
                                                  operator=session.operator)
            except (MigrationRefused, InvalidRunState) as exc:
                refused = True
                echo(f"run {run_id}: {exc}", err=True)
                continue
            how = "forced" if force and not report.compatible else "checked"
            echo(f"run {run_id}: migrated to bundle {run.bundle} (version {run.workflow_version}; {how}: "
                 f"{report.describe()})")
    if refused:
        ctx.exit(1)


@click.command("export")
@click.argument("run_id", metavar="RUN")
@app_option(required=False)
@db_option
@click.pass_context
def export(ctx: click.Context, run_id: str, app_spec: str | None, db: str | None) -> None:
    """Write a run's journal as JSON (format cairn.run/1, see the README) to
    stdout, for cairn.testing.replay(app, "run.json") in a test suite."""
    with _bad_input(), open_session(db_from_context(ctx, db), app_spec, read_only=True) as session:
        document = session.app.export_run(run_id)
    echo_json(document, indent=2)


COMMANDS = (bundles, replay_check, migrate, export)
