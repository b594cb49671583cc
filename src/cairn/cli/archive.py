"""``cairn archive``: move closed runs out of the hot tables into archive
objects, and back (issue 26 item 5; ``Operator.archive``, ``store.archivesql``).

An archived run still shows, exports, verifies and forks as before: the
store reads its history from the archive. Nothing may change it until it is
restored.
"""

from __future__ import annotations

from typing import Any

import click

from cairn.store.records import ArchiveRecord

from .database import parse_duration
from .loading import open_session
from .options import app_option, db_from_context, db_option
from .terminal import echo, echo_json


@click.group()
@db_option
def archive(db: str | None) -> None:
    """Archived runs: closed runs moved out of the hot tables.

    \b
    cairn archive run --older-than 30d [--tenant T] [--limit N] [--dry-run] [--json]
    cairn archive restore RUN [--json]
    cairn archive show RUN [--json]

    A closed run older than the cutoff moves, rows and all (history,
    signals, approvals, run memory), into one zstd-compressed object in the
    artifact store, sealed to its tenant and run when encryption is on; the
    run row stays. show, history, export, audit verify and fork read it from
    there; nothing may change it until `cairn archive restore` puts the very
    rows back.
    """


def _as_dict(record: ArchiveRecord) -> dict[str, Any]:
    return {"run_id": record.run_id, "tenant": record.tenant, "ref": record.ref, "entries": record.entries,
            "last_seq": record.last_seq, "rows_bytes": record.hot_bytes, "stored_bytes": record.stored_bytes,
            "archived_at": record.archived_at, "actor": record.actor,
            **({"restored_by": record.restored_by, "restored_at": record.restored_at}
               if record.restored_by is not None else {})}


def _line(verb: str, record: ArchiveRecord) -> str:
    return (f"{verb} {record.run_id} (tenant {record.tenant}): {record.entries} entries, "
            f"{record.hot_bytes} bytes of rows stored in {record.stored_bytes}, object {record.ref[:16]}...")


@archive.command("run")
@click.option("--older-than", "older_than", required=True, metavar="DURATION",
              help="Archive closed runs last changed longer ago than this: 30d, 12h, 1w...")
@click.option("--tenant", default=None, help="Only this tenant's runs.")
@click.option("--limit", default=1000, show_default=True, type=click.IntRange(min=1),
              help="At most this many runs (oldest first).")
@click.option("--dry-run", is_flag=True, help="Only list the runs that would be archived.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per run.")
@app_option(required=False)
@db_option
@click.pass_context
def archive_run(ctx: click.Context, older_than: str, tenant: str | None, limit: int, dry_run: bool,
                as_json: bool, app_spec: str | None, db: str | None) -> None:
    """Archive closed runs older than the cutoff, each in its own fenced move."""
    seconds = parse_duration(older_than)
    with open_session(db_from_context(ctx, db), app_spec) as session:
        if dry_run:
            chosen = session.operator.archivable(seconds, tenant=tenant, limit=limit)
            for run_id in chosen:
                echo_json({"run_id": run_id, "would_archive": True}) if as_json else echo(
                    f"would archive {run_id}")
            if not as_json:
                echo(f"would archive {len(chosen)} run{'s' if len(chosen) != 1 else ''}")
            return
        done = session.operator.archive(seconds, tenant=tenant, limit=limit)
    for record in done.archived:
        echo_json(_as_dict(record)) if as_json else echo(_line("archived", record))
    for run_id, why in done.skipped:
        echo_json({"run_id": run_id, "skipped": why}) if as_json else echo(f"left hot {run_id}: {why}")
    if not as_json:
        echo(f"archived {len(done.archived)} run{'s' if len(done.archived) != 1 else ''}"
             + (f", {len(done.skipped)} left hot" if done.skipped else ""))


@archive.command("restore")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="The archive record as one JSON object.")
@db_option
@click.pass_context
def archive_restore(ctx: click.Context, run_id: str, as_json: bool, db: str | None) -> None:
    """Put archived run RUN back in the hot tables, bit for bit."""
    with open_session(db_from_context(ctx, db), None) as session:
        record = session.operator.restore(run_id)
    echo_json(_as_dict(record)) if as_json else echo(_line("restored", record) + f" by {record.restored_by}")


@archive.command("show")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="The archive record as one JSON object.")
@db_option
@click.pass_context
def archive_show(ctx: click.Context, run_id: str, as_json: bool, db: str | None) -> None:
    """Where RUN is archived (exit 1 if it is hot)."""
    with open_session(db_from_context(ctx, db), None, read_only=True) as session:
        session.operator.get_run(run_id)  # RunNotFound: "no run ..."
        record = session.operator.run_archive(run_id)
    if record is None:
        raise click.ClickException(f"run {run_id} is not archived (it is in the hot tables)")
    echo_json(_as_dict(record)) if as_json else echo(_line("archived", record) + f" by {record.actor}")
