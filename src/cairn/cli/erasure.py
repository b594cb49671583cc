"""``cairn erase``: erasure by subject, thread or tenant (``cairn.api.erasure``)."""

from __future__ import annotations

import click

from cairn.errors import InvalidArgument

from .keys import keyring_option
from .loading import open_session
from .options import db_from_context, db_option
from .terminal import echo, echo_json


@click.command()
@click.option("--subject", default=None, metavar="S", help="Erase this subject's runs and memory.")
@click.option("--thread", default=None, metavar="T", help="Erase this thread's runs and messages.")
@click.option("--tenant", default=None, metavar="T",
              help="The tenant (default: 'default'); alone, without --subject or --thread: erase the "
                   "whole tenant.")
@click.option("--dry-run", is_flag=True, help="Only count what would be erased; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the erasure as JSON.")
@db_option
@keyring_option
@click.pass_context
def erase(ctx: click.Context, subject: str | None, thread: str | None, tenant: str | None, dry_run: bool,
          as_json: bool, db: str | None) -> None:
    """Erase a subject, a thread or a tenant for good.

    Its unfinished runs are killed, its subject keys destroyed (nothing it
    stored decrypts again, not even from a backup), its runs and memory
    deleted with their artifacts, and the freed space reclaimed. An erasure
    record is kept: a keyed digest of what was erased, counts, time and who
    did it. Interrupted, the same command completes it.
    """
    if subject is None and thread is None and tenant is None:
        raise click.UsageError("name what to erase: --subject S, --thread T or --tenant T")
    if subject is not None and thread is not None:
        raise click.UsageError("--subject and --thread are exclusive: erase one at a time")
    with open_session(db_from_context(ctx, db), None) as session:
        try:
            done = session.operator.erase(tenant=tenant or "default", subject=subject, thread=thread,
                                          dry_run=dry_run)
        except InvalidArgument as exc:
            raise click.UsageError(str(exc)) from None
    if as_json:
        echo_json(done.as_dict())
        return
    counts = done.counts
    what = (f"subject of tenant {done.target.tenant!r}" if subject is not None else
            f"thread of tenant {done.target.tenant!r}" if thread is not None else
            f"tenant {done.target.tenant!r}")
    parts = [f"{counts.get('runs', 0)} run(s)", f"{counts.get('killed', 0)} killed first",
             *([f"{counts['memory']} memory row(s)"] if "memory" in counts else []),
             f"{counts.get('keys', 0)} subject key(s) destroyed"]
    if dry_run:
        echo(f"would erase the {what}: " + ", ".join(parts))
    else:
        record = done.record
        resumed = " (an interrupted erasure, completed)" if done.resumed else ""
        echo(f"erased the {what}{resumed}: " + ", ".join(parts) +
             (f"; record {record.id}" if record is not None else ""))
