"""``cairn tokens``: mint, list and revoke the bearer tokens of ``cairn serve``.

A token is bound to one tenant and one role (viewer, operator, admin,
installation); its secret is printed once, at minting, and only its SHA-256
is stored. The installation role is minted here only: over HTTP no token
mints a role above its own.
"""

from __future__ import annotations

import click

from cairn.api.tokens import Role, Tokens

from . import render
from .loading import open_session
from .options import DefaultCommandGroup, db_from_context, db_option, stdout_console
from .terminal import echo, echo_json


@click.group(cls=DefaultCommandGroup, default="list")
@db_option
def tokens(db: str | None) -> None:
    """Bearer tokens of the HTTP API (cairn serve).

    \b
    cairn tokens mint NAME --tenant T --role viewer|operator|admin|installation
    cairn tokens                        list them ('list' is the default)
    cairn tokens revoke TOKEN_ID

    viewer: read runs, streams and the tenant's queues; operator: also
    cancel, kill, resume, retry, budgets, operations, signals and approvals;
    admin: also the tenant's tokens; installation: also the queue limits
    every tenant shares, and every queue's load.
    The token's identity is recorded in the history of every action it takes.
    """


@tokens.command("mint")
@click.argument("name")
@click.option("--tenant", required=True, help="The only tenant the token acts for.")
@click.option("--role", type=click.Choice([r.value for r in Role]), default=Role.VIEWER.value,
              show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object, the secret included.")
@db_option
@click.pass_context
def tokens_mint(ctx: click.Context, name: str, tenant: str, role: str, as_json: bool, db: str | None) -> None:
    """Mint a token; its secret is printed once and never stored."""
    with open_session(db_from_context(ctx, db), None) as session:
        minted = session.app.tokens
        minted.actor = session.operator.actor
        made = minted.mint(tenant, role, name)
    record = made.record
    if as_json:
        echo_json({"token_id": record.token_id, "tenant": record.tenant, "role": record.role,
                   "name": record.name, "token": made.secret})
        return
    echo(f"token {record.token_id} ({record.name}): tenant {record.tenant}, role {record.role}")
    echo("the secret below is shown once; store it now:")
    click.echo(made.secret)


@tokens.command("list")
@click.option("--tenant", default=None, help="Only this tenant's tokens.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@db_option
@click.pass_context
def tokens_list(ctx: click.Context, tenant: str | None, as_json: bool, db: str | None) -> None:
    """Every token (revoked ones included), without secrets."""
    with open_session(db_from_context(ctx, db), None) as session:
        found = session.app.tokens.list(tenant)
    if as_json:
        for t in found:
            echo_json({"token_id": t.token_id, "tenant": t.tenant, "role": t.role, "name": t.name,
                       "created_at": t.created_at, "created_by": t.created_by, "revoked_at": t.revoked_at})
        return
    if not found:
        echo("no tokens")
        return
    console = stdout_console()
    for t in found:
        state = f"revoked {render.fmt_time(t.revoked_at)}" if t.revoked_at is not None else "live"
        console.print(f"{t.token_id}  {t.tenant}  {t.role:<8}  {t.name}  "
                      f"(created {render.fmt_time(t.created_at)} by {t.created_by or '?'}; {state})",
                      soft_wrap=True)


@tokens.command("revoke")
@click.argument("token_id")
@db_option
@click.pass_context
def tokens_revoke(ctx: click.Context, token_id: str, db: str | None) -> None:
    """Refuse a token from now on."""
    with open_session(db_from_context(ctx, db), None) as session:
        revoked = Tokens(session.app.store, session.operator.actor).revoke(token_id)  # the log's actor
        known = any(t.token_id == token_id for t in session.app.tokens.list())
    if revoked:
        echo(f"revoked token {token_id}")
    elif known:
        echo(f"token {token_id} was revoked already")
    else:
        raise click.ClickException(f"no token with id {token_id!r}")
