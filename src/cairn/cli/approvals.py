"""``cairn approvals``, ``cairn approve``, ``cairn reject``: the requests runs
make for people to decide, and the decisions.

Everything goes through the operator façade (``App.operator``), which records
the acting identity (``cli:user@host``) with the decision; the CLI never
touches the store. Details, comments and edits are user text: printed as
text, never markup (``cli/terminal.py``).
"""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cairn.api.approvals import NO_EDIT, ApprovalView
from cairn.api.views import approval_json, pending_approvals
from cairn.errors import InvalidEdit

from . import render
from .loading import Session, open_session
from .options import app_option, db_from_context, db_option, stdout_console
from .signals import parse_json_option
from .terminal import echo, echo_json


def _table(views: list[ApprovalView]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("run", overflow="fold")
    table.add_column("request", overflow="fold")
    table.add_column("action", overflow="fold")
    table.add_column("details", overflow="fold")
    table.add_column("approvers", overflow="fold")
    table.add_column("requested", no_wrap=True)
    table.add_column("expires", no_wrap=True)
    table.add_column("status", no_wrap=True)
    for v in views:
        table.add_row(render.line(v.run_id), render.line(v.request_id), render.line(v.action),
                      render.line(render.preview(v.details, 50)), render.line(_approvers(v)),
                      render.fmt_time(v.requested_at)[:19], render.fmt_time(v.expires_at)[:19],
                      render.line(_status(v)))
    return table


def _approvers(view: ApprovalView) -> str:
    return "anyone" if view.approvers is None else ", ".join(view.approvers)


def _status(view: ApprovalView) -> str:
    if view.decided_by:
        return f"{view.status.value} by {view.decided_by}"
    return view.status.value


def print_pending(console: Console, views: list[ApprovalView]) -> None:
    """The approvals a run waits for, with the commands that decide them (``cairn show``)."""
    for v in views:
        expires = render.fmt_time(v.expires_at) if v.expires_at is not None else "never"
        lines = [
            f"  details:   {render.preview(v.details, 200)}",
            f"  type:      {v.type_name}",
            f"  approvers: {_approvers(v)}; expires {expires}",
            f"  decide:    cairn approve {v.run_id} {v.request_id} [--comment TEXT] [--edit JSON]",
            f"             cairn reject {v.run_id} {v.request_id} [--comment TEXT]",
        ]
        console.print()
        console.print(Text(render.line(f"approval pending: request {v.request_id} ({v.action})"),
                           style="bold yellow"))
        for text in lines:
            console.print(Text(render.line(text)), soft_wrap=True)


def pending_of(session: Session, run_id: str) -> list[ApprovalView]:
    """The pending approvals of one run; none if the database predates them
    (an inspection never migrates: its schema may lack the table)."""
    return pending_approvals(session.operator, run_id, inspecting=True)


@click.command("approvals")
@click.option("--tenant", default=None, help="Only this tenant's requests.")
@click.option("--run", "run_id", metavar="RUN", default=None, help="Only this run's requests.")
@click.option("--all", "everything", is_flag=True, help="Decided, expired and voided requests too.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@app_option(required=False)
@db_option
@click.pass_context
def approvals(
    ctx: click.Context, tenant: str | None, run_id: str | None, everything: bool, as_json: bool,
    app_spec: str | None, db: str | None,
) -> None:
    """List approval requests awaiting a decision, across runs (oldest first)."""
    with open_session(db_from_context(ctx, db), app_spec, read_only=True) as session:
        views = session.operator.approvals(tenant=tenant, run_id=run_id, pending=not everything)
    if as_json:
        for v in views:
            echo_json(approval_json(v), ensure_ascii=False, default=str)
        return
    if not views:
        echo("no approval requests" if everything else "no pending approval requests", err=True)
        return
    console = stdout_console()
    if console.width >= _TABLE_WIDTH:
        console.print(_table(views))
        return
    for v in views:  # narrow terminal: a block per request, ids never cut
        head = Text(render.line(f"{v.request_id}  run {v.run_id}  ")) + Text(render.line(_status(v)),
                                                                              style="bold")
        console.print(head, soft_wrap=True)
        console.print(Text(render.line(f"  {v.action}: {render.preview(v.details, 200)}")), soft_wrap=True)
        expires = render.fmt_time(v.expires_at)[:19] if v.expires_at is not None else "never"
        console.print(Text(render.line(f"  approvers {_approvers(v)}; requested "
                                       f"{render.fmt_time(v.requested_at)[:19]}; expires {expires}")),
                      soft_wrap=True)


#: below this many columns ``cairn approvals`` prints a block per request instead of a table
_TABLE_WIDTH = 150


def _decided(view: ApprovalView) -> None:
    what = {"approved": "approved", "edited": "approved with edits", "rejected": "rejected"}.get(
        view.status.value, view.status.value)
    echo(f"{what} request {view.request_id} ({view.action}) of run {view.run_id} as {view.decided_by}; "
         f"the run continues on any worker")


@click.command("approve")
@click.argument("run_id", metavar="RUN")
@click.argument("request_id", metavar="REQUEST")
@click.option("--comment", default=None, help="Why; recorded with the decision.")
@click.option("--edit", "edit_json", metavar="JSON", default=None,
              help="Approve with this data instead (JSON, @FILE or -): it must fit the request's type.")
@app_option(required=False)
@db_option
@click.pass_context
def approve(
    ctx: click.Context, run_id: str, request_id: str, comment: str | None, edit_json: str | None,
    app_spec: str | None, db: str | None,
) -> None:
    """Approve an approval request, as requested or edited (--edit)."""
    edit = NO_EDIT if edit_json is None else parse_json_option(edit_json, "--edit")
    with open_session(db_from_context(ctx, db), app_spec) as session:
        try:
            view = session.operator.approve(run_id, request_id, comment=comment, edit=edit)
        except InvalidEdit as exc:
            raise click.BadParameter(str(exc), param_hint="'--edit'") from None
    _decided(view)


@click.command("reject")
@click.argument("run_id", metavar="RUN")
@click.argument("request_id", metavar="REQUEST")
@click.option("--comment", default=None, help="Why; recorded with the decision.")
@app_option(required=False)
@db_option
@click.pass_context
def reject(
    ctx: click.Context, run_id: str, request_id: str, comment: str | None, app_spec: str | None,
    db: str | None,
) -> None:
    """Reject an approval request."""
    with open_session(db_from_context(ctx, db), app_spec) as session:
        view = session.operator.reject(run_id, request_id, comment=comment)
    _decided(view)
