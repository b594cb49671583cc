"""``cairn keys``: the encryption keys of a database (status, rotate, reencrypt, verify).

The keyring comes from ``--keyring`` or ``$CAIRN_KEYRING`` (``file:/path``
or ``env:VARIABLE``); see README "Encryption at rest".
"""

from __future__ import annotations

import os
import sys

import click

from cairn.api.keys import Keys
from cairn.security.keyring import KEYRING_ENV, keyring_from_spec, new_kek_line
from cairn.store.sealed import SealedStore

from .loading import open_session
from .options import DefaultCommandGroup, db_from_context, db_option
from .terminal import echo, echo_json


def _use_keyring(ctx: click.Context, param: click.Parameter, spec: str | None) -> None:
    if spec is not None:
        os.environ[KEYRING_ENV] = spec  # this process's store opens with it


#: ``--keyring SPEC`` on every subcommand (a group option would be taken for the default command's)
keyring_option = click.option(
    "--keyring", metavar="SPEC", default=None, expose_value=False, callback=_use_keyring, is_eager=True,
    help="file:/path, env:VARIABLE, vault:KEY or aws-kms:KEY (default: $CAIRN_KEYRING).")


@click.group(cls=DefaultCommandGroup, default="status")
@db_option
def keys(db: str | None) -> None:
    """Encryption at rest: data keys, rotation, re-encryption.

    \b
    cairn keys                       status: key versions and what each seals
    cairn keys rotate [--tenant T]   a new data key for new writes, at once
    cairn keys rotate --kek          rewrap every data key with the current KEK
    cairn keys reencrypt [--pause S] move old values to the newest key
    cairn keys verify                open every sealed value; exit 1 if any fails
    cairn keys new-kek ID            print a KEK line for a key file
    """


@keys.command("status")
@click.option("--tenant", default=None)
@click.option("--json", "as_json", is_flag=True)
@db_option
@keyring_option
@click.pass_context
def keys_status(ctx: click.Context, tenant: str | None, as_json: bool, db: str | None) -> None:
    """Each tenant's key versions and how many values each seals."""
    with open_session(db_from_context(ctx, db), None) as session:
        found = Keys(session.app.store).status(tenant)
    for t in found:
        if as_json:
            echo_json(t.as_dict())
            continue
        newest = max((v.version for v in t.versions), default=0)
        counts = ", ".join(f"v{k}: {n}" for k, n in t.values.items()) or "none"
        artifacts = ", ".join(f"v{k}: {n}" if k else f"plaintext: {n}" for k, n in t.artifacts.items())
        echo(f"{t.tenant}: newest v{newest} ({len(t.versions)} versions), values {counts}; "
             f"{t.old} on older keys; artifacts {artifacts or 'none'}; {t.old_artifacts} on older keys")


@keys.command("rotate")
@click.option("--tenant", default=None, help="Only this tenant (default: every tenant with keys).")
@click.option("--kek", "kek", is_flag=True, help="Rewrap the data keys with the keyring's current KEK.")
@db_option
@keyring_option
@click.pass_context
def keys_rotate(ctx: click.Context, tenant: str | None, kek: bool, db: str | None) -> None:
    """A new data key version (sealing new writes at once), or a KEK rewrap."""
    with open_session(db_from_context(ctx, db), None) as session:
        admin = Keys(session.app.store, session.operator.actor)
        if kek:
            echo(f"rewrapped {admin.rewrap()} data keys with the current KEK")
            return
        for name, version in admin.rotate(tenant):
            echo(f"{name}: data key v{version} seals new writes; "
                 "'cairn keys reencrypt' moves the old values to it")


@keys.command("reencrypt")
@click.option("--tenant", default=None)
@click.option("--pause", type=float, default=0.0, show_default=True, help="Seconds to rest after each page.")
@click.option("--page", type=click.IntRange(1, 10_000), default=200, show_default=True, help="Rows per page.")
@db_option
@keyring_option
@click.pass_context
def keys_reencrypt(ctx: click.Context, tenant: str | None, pause: float, page: int, db: str | None) -> None:
    """Move values sealed under older keys to each tenant's newest (resumable)."""
    with open_session(db_from_context(ctx, db), None) as session:
        for p in Keys(session.app.store, session.operator.actor).reencrypt(tenant, pause=pause, page=page):
            echo(f"{p.tenant}: moved {p.moved} rows to v{p.newest} ({p.artifacts_moved} of them artifacts); "
                 f"{p.raced} changed meanwhile (the next pass takes them)")


@keys.command("adopt")
@click.option("--pause", type=float, default=0.0, show_default=True, help="Seconds to rest after each page.")
@db_option
@keyring_option
@click.pass_context
def keys_adopt(ctx: click.Context, pause: float, db: str | None) -> None:
    """Turn encryption on for a database written without it: seal what it holds (resumable)."""
    spec = os.environ.pop(KEYRING_ENV, None)  # opened plain: a keyring refuses a plaintext database
    if not spec:
        raise click.UsageError("give the keyring to seal with: --keyring or $CAIRN_KEYRING")
    try:
        with open_session(db_from_context(ctx, db), None) as session:
            sealed = SealedStore(session.app.store, keyring_from_spec(spec))
            done = Keys(sealed, session.operator.actor).adopt(pause=pause)
    finally:
        os.environ[KEYRING_ENV] = spec
    echo(f"sealed {sum(p.moved for p in done)} rows of {len(done)} tenants; plaintext is refused from now on")


@keys.command("verify")
@click.option("--tenant", default=None)
@db_option
@keyring_option
@click.pass_context
def keys_verify(ctx: click.Context, tenant: str | None, db: str | None) -> None:
    """Open every sealed value of every run; list what does not open."""
    failed = False
    with open_session(db_from_context(ctx, db), None) as session:
        for report in Keys(session.app.store).verify(tenant):
            echo(f"{report.tenant}: {report.runs} runs, {report.artifacts} artifacts, "
                 f"{len(report.failures)} failures")
            for failure in report.failures:
                echo(f"  {failure}")
            failed = failed or bool(report.failures)
    if failed:
        sys.exit(1)


@keys.command("new-kek")
@click.argument("kek_id")
def keys_new_kek(kek_id: str) -> None:
    """Print '<KEK_ID> <32 random bytes, base64>': append it to the key file (the last line is current)."""
    click.echo(new_kek_line(kek_id))
