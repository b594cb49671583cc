"""``cairn audit``: verify the tamper-evident audit chain, checkpoint it to an
anchor, and show who did what (issue 26; ``cairn.api.audit``).

``verify`` exits 0 for VERIFIED, 4 for TAMPERED and 3 for UNANCHORED (2 is
a usage mistake and 1 an error, as everywhere): a script that checks the
exit status never takes a chain without an anchor for a pass.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from cairn.api.audit import Verdict
from cairn.api.auditanchor import generate_key

from .database import parse_duration
from .loading import open_session
from .options import db_from_context, db_option
from .terminal import echo, echo_json

#: ``cairn audit verify``'s exit status per verdict
EXIT = {Verdict.VERIFIED: 0, Verdict.TAMPERED: 4, Verdict.UNANCHORED: 3}

_KEY_HELP = "Ed25519 key file (cairn audit keygen; also $CAIRN_AUDIT_KEY)."
_ANCHOR_HELP = "The anchor file: checkpoints, one JSON line each (also $CAIRN_AUDIT_ANCHOR)."


@click.group()
@db_option
def audit(db: str | None) -> None:
    """The tamper-evident audit log.

    \b
    cairn audit keygen KEYFILE             a signing key (KEYFILE, KEYFILE.pub)
    cairn audit checkpoint --key K --anchor FILE [--tenant T]
    cairn audit verify --anchor FILE [--key K.pub] [--tenant T] [--run R]
    cairn audit log [--tenant T] [--run R] [--actor A] [--event E] [--kind K] [--action A] [--since 1d]
                    [--json]

    Every history entry is chained to the one before it (SHA-256 over its
    metadata, its actor included, and the digest of its plaintext) by the
    store, in the entry's own write. A checkpoint signs each tenant's run heads and appends them
    to an anchor file kept outside the database. verify says VERIFIED (exit
    0), TAMPERED (4: the first bad entry and what is wrong) or UNANCHORED
    (3: entries newer than the last anchored checkpoint, or no anchor).
    """


@audit.command("keygen")
@click.argument("keyfile", type=click.Path(dir_okay=False, path_type=Path))
def audit_keygen(keyfile: Path) -> None:
    """Write a new Ed25519 signing key to KEYFILE (0600) and its public key to KEYFILE.pub."""
    public = generate_key(keyfile)
    echo(f"key written to {keyfile} (keep it secret), public key {public} in {keyfile}.pub")


@audit.command("checkpoint")
@click.option("--key", "key", envvar="CAIRN_AUDIT_KEY", required=True,
              type=click.Path(dir_okay=False, path_type=Path), help=_KEY_HELP)
@click.option("--anchor", envvar="CAIRN_AUDIT_ANCHOR", default=None,
              type=click.Path(dir_okay=False, path_type=Path), help=_ANCHOR_HELP)
@click.option("--tenant", default=None, help="Only this tenant (default: every tenant).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per checkpoint.")
@db_option
@click.pass_context
def audit_checkpoint(ctx: click.Context, key: Path, anchor: Path | None, tenant: str | None, as_json: bool,
                     db: str | None) -> None:
    """Verify, then sign each tenant's run heads and append them to the anchor."""
    with open_session(db_from_context(ctx, db), None) as session:
        records = session.app.audit.checkpoint(key, tenant=tenant, anchor=anchor)
    for record in records:
        if as_json:
            echo_json({k: v for k, v in record.items() if k != "heads"})
            continue
        echo(f"checkpoint {record['id']} of tenant {record['tenant']}: {record['runs']} runs, "
             f"{record['entries']} entries, root {record['root'][:16]}..."
             + (f", appended to {anchor}" if anchor is not None else " (no anchor: not exported)"))


@audit.command("verify")
@click.option("--anchor", envvar="CAIRN_AUDIT_ANCHOR", default=None,
              type=click.Path(dir_okay=False, path_type=Path), help=_ANCHOR_HELP)
@click.option("--key", "key", envvar="CAIRN_AUDIT_KEY", default=None,
              type=click.Path(dir_okay=False, path_type=Path),
              help="The key every checkpoint must be signed with (the key file or its .pub).")
@click.option("--tenant", default=None, help="Only this tenant's runs.")
@click.option("--run", "run_id", default=None, help="Only this run.")
@click.option("--json", "as_json", is_flag=True, help="The report as one JSON object.")
@db_option
@click.pass_context
def audit_verify(ctx: click.Context, anchor: Path | None, key: Path | None, tenant: str | None,
                 run_id: str | None, as_json: bool, db: str | None) -> None:
    """Verify the chains: VERIFIED, TAMPERED or UNANCHORED."""
    with open_session(db_from_context(ctx, db), None, read_only=True) as session:
        report = session.app.audit.verify(tenant=tenant, run_id=run_id, anchor=anchor, key=key)
    if as_json:
        echo_json(report.as_dict())
    else:
        echo(report.summary())
        for problem in report.problems[1:10]:
            echo(f"  also: {problem}")
    ctx.exit(EXIT[report.verdict])


@audit.command("log")
@click.option("--tenant", default=None, help="Only this tenant.")
@click.option("--run", "run_id", default=None, help="Only this run.")
@click.option("--actor", default=None, help="Only actors containing this text (e.g. cli:, http:, worker:).")
@click.option("--event", default=None, help="Only entries whose type starts so (e.g. run.cancelled, run.).")
@click.option("--kind", default=None,
              help="Only this kind of object: run, or an operator log's (token, queue, queue_share, "
                   "schedule, key, bundle...).")
@click.option("--action", default=None, help="Only operator actions starting so (e.g. token., queue.set).")
@click.option("--since", default=None, help="Only the last duration (e.g. 1d, 12h).")
@click.option("--limit", type=click.IntRange(min=1), default=200, show_default=True, help="The last N.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@db_option
@click.pass_context
def audit_log(ctx: click.Context, tenant: str | None, run_id: str | None, actor: str | None,
              event: str | None, kind: str | None, action: str | None, since: str | None, limit: int,
              as_json: bool, db: str | None) -> None:
    """Who did what: every history entry and operator action with its actor and how it was authenticated."""
    after = time.time() - parse_duration(since) if since is not None else None
    if event is not None and action is not None:
        raise click.UsageError("give --event or --action, not both (both filter the same field)")
    with open_session(db_from_context(ctx, db), None, read_only=True) as session:
        found = session.app.audit.log(tenant=tenant, run_id=run_id, actor=actor, event=event or action,
                                      since=after, limit=limit, kind=kind)
    if as_json:
        for item in found:
            echo_json(item.as_dict())
        return
    if not found:
        echo("no entries")
        return
    for item in found:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(item.at))
        where = f"{item.run_id}#{item.seq}" if item.kind == "run" else f"{item.kind} {item.object_id} " \
            f"({item.run_id}#{item.seq})"
        echo(f"{stamp}  {item.tenant or '(installation)'}  {where}  {item.event}  {item.actor} ({item.auth})")
