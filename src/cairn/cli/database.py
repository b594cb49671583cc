"""``cairn db status``, ``cairn db migrate`` and ``cairn prune``: the
database's schema and its size. (Moving runs between bundles is ``cairn
migrate``, in ``cli/bundles.py``.)"""

from __future__ import annotations

import re

import click

from cairn.api.operator import Schema, open_schema
from cairn.store import resolve_url
from cairn.store.records import RunStatus

from .loading import open_session
from .options import app_option, db_option
from .options import db_from_context as _db
from .terminal import echo


def _open_unmigrated(db: str | None, *, create: bool) -> Schema:
    """The schema of the database named by ``db``, opened without applying
    migrations. ``create=False`` refuses a SQLite file that does not exist."""
    try:
        return open_schema(db, create=create)
    except ValueError as exc:  # a memory:// store
        raise click.UsageError(str(exc)) from None


@click.group("db")
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


def parse_duration(text: str, option: str = "--older-than") -> float:
    """Seconds in a duration such as ``7d``, ``12h``, ``30m``, ``90s``, ``2w``
    or ``1d12h`` (``option``: the option a bad one is reported against)."""
    cleaned = text.strip().lower()
    if not _DURATION.fullmatch(cleaned):
        raise click.BadParameter(f"{text!r} is not a duration: use a number and a unit, e.g. 7d, 12h, 30m "
                                 "or 1d12h (units s, m, h, d, w)", param_hint=f"'{option}'")
    return sum(float(number) * _DURATION_UNITS[unit]
               for number, unit in re.findall(r"(\d+(?:\.\d+)?)([smhdw])", cleaned))


@click.command()
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


