"""``cairn retention``: retention policies per data class, the dry run, and
the controller on demand (issue 26 part 3; ``cairn.api.retention``)."""

from __future__ import annotations

import time

import click

from cairn.store.retention import DataClass, format_keep

from .loading import open_session
from .options import db_from_context, db_option
from .terminal import echo, echo_json

_CLASSES = ", ".join(c.value for c in DataClass)
_TENANT = "The tenant the policy is for (default: every tenant without a policy of its own, '*')."
_WORKFLOW = "The workflow the policy is for (default: every workflow, '*'); not for memory classes."


@click.group()
@db_option
def retention(db: str | None) -> None:
    """Retention policies per data class, enforced by the workers.

    \b
    cairn retention set CLASS PERIOD [--tenant T] [--workflow W]
    cairn retention ls [--tenant T] [--json]
    cairn retention rm CLASS [--tenant T] [--workflow W]
    cairn retention plan [--json]      what a controller pass now would delete
    cairn retention run [--json]       one controller pass now

    Classes: history, model-bodies, artifacts, thread-memory, kv-memory,
    semantic-memory, audit, archives. PERIOD: 30d, 12h, 1y, 3600 (seconds)
    or forever. The most specific policy decides (tenant and workflow, then
    tenant, then workflow, then every one); no policy keeps everything.
    Audit records must be kept at least as long as the history they cover.
    """


@retention.command("set")
@click.argument("data_class", metavar="CLASS")
@click.argument("keep", metavar="PERIOD")
@click.option("--tenant", default=None, help=_TENANT)
@click.option("--workflow", default=None, help=_WORKFLOW)
@db_option
@click.pass_context
def retention_set(ctx: click.Context, data_class: str, keep: str, tenant: str | None, workflow: str | None,
                  db: str | None) -> None:
    """Keep CLASS for PERIOD (classes: history, model-bodies, artifacts,
    thread-memory, kv-memory, semantic-memory, audit, archives)."""
    with open_session(db_from_context(ctx, db), None) as session:
        stored = session.operator.retention.set(data_class, keep, tenant=tenant, workflow=workflow)
    echo(f"set: {stored.describe()} (by {stored.updated_by})")


@retention.command("ls")
@click.option("--tenant", default=None, help="Only this tenant's policies and the defaults ('*').")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per policy.")
@db_option
@click.pass_context
def retention_ls(ctx: click.Context, tenant: str | None, as_json: bool, db: str | None) -> None:
    """List the retention policies."""
    with open_session(db_from_context(ctx, db), None, read_only=True) as session:
        found = session.operator.retention.policies(tenant)
    if not as_json and not found:
        echo("no retention policies: everything is kept")
    for p in found:
        if as_json:
            echo_json({"tenant": p.tenant, "workflow": p.workflow, "class": p.data_class.value,
                       "keep": format_keep(p.keep), "keep_seconds": p.keep, "updated_at": p.updated_at,
                       "updated_by": p.updated_by})
            continue
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(p.updated_at))
        echo(f"{p.data_class.value:<16} tenant {p.tenant:<12} workflow {p.workflow:<16} keep "
             f"{format_keep(p.keep):<8} set {when} UTC by {p.updated_by}")


@retention.command("rm")
@click.argument("data_class", metavar="CLASS")
@click.option("--tenant", default=None, help=_TENANT)
@click.option("--workflow", default=None, help=_WORKFLOW)
@db_option
@click.pass_context
def retention_rm(ctx: click.Context, data_class: str, tenant: str | None, workflow: str | None,
                 db: str | None) -> None:
    """Remove a retention policy (its class is then kept as the next
    matching policy says, or forever)."""
    with open_session(db_from_context(ctx, db), None) as session:
        gone = session.operator.retention.remove(data_class, tenant=tenant, workflow=workflow)
    where = f"tenant {tenant or '*'} workflow {workflow or '*'}"
    if not gone:
        raise click.ClickException(f"no {data_class} policy for {where}")
    echo(f"removed: the {data_class} policy of {where}")


@retention.command("plan")
@click.option("--json", "as_json", is_flag=True, help="The whole plan as one JSON object (every unit).")
@db_option
@click.pass_context
def retention_plan(ctx: click.Context, as_json: bool, db: str | None) -> None:
    """What a controller pass now would delete (changes nothing)."""
    with open_session(db_from_context(ctx, db), None, read_only=True) as session:
        plan = session.operator.retention.plan()
    if as_json:
        echo_json(plan.as_dict())
        return
    _summary(plan.units, "would go" if plan.policies else "no retention policies: nothing would go")


@retention.command("run")
@click.option("--batch", default=500, show_default=True, type=click.IntRange(1, 100_000),
              help="Units deleted per transaction.")
@click.option("--json", "as_json", is_flag=True, help="What went, as one JSON object.")
@db_option
@click.pass_context
def retention_run(ctx: click.Context, batch: int, as_json: bool, db: str | None) -> None:
    """One controller pass now (holding the controller's lease)."""
    with open_session(db_from_context(ctx, db), None) as session:
        done = session.operator.retention.run(batch=batch)
    if as_json:
        echo_json(done.as_dict())
        return
    _summary(done.units, "went" if done.policies else "no retention policies: nothing went")
    if done.fenced:
        raise click.ClickException(f"the pass stopped: {done.fenced}")


def _summary(units: dict[DataClass, list[tuple[object, ...]]], verb: str) -> None:
    if not units:
        echo(verb)
        return
    for cls, keys in units.items():
        sample = ", ".join(":".join(str(part) for part in key[:3]) for key in keys[:3])
        more = f" (e.g. {sample}{', ...' if len(keys) > 3 else ''})" if keys else ""
        echo(f"{cls.value:<16} {len(keys)} {verb}{more}")
