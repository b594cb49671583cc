"""``cairn queues``: see each queue's limits and load, and change the limits.

Limits live in the database, so one command changes them for every worker on
every machine from their next claim on (see ``cairn.store.admission``).
"""

from __future__ import annotations

import click
from rich.table import Table

from cairn.errors import InvalidArgument
from cairn.store.admission import QueueLimits, QueueShare, QueueStats, Rate

from .loading import open_session
from .options import DefaultCommandGroup, app_option, db_from_context, db_option, stdout_console
from .terminal import echo, echo_json


class Count(click.ParamType[int]):
    """A whole number of at least 1, in ASCII digits: ``int()`` alone reads
    other scripts' digits too (``"\u0663"`` is 3), which a limit typed by
    mistake should not silently become."""

    name = "integer"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if not (text.isascii() and text.isdigit() and int(text) >= 1):
            self.fail(f"{value!r} is not a whole number of at least 1", param, ctx)
        return int(text)


COUNT = Count()


def describe_limits(limits: QueueLimits) -> str:
    """``concurrency 10, per tenant 2, rate 100/60s, per tenant 10/1s`` (or ``unlimited``)."""
    parts = []
    if limits.concurrency is not None:
        parts.append(f"concurrency {limits.concurrency}")
    if limits.tenant_concurrency is not None:
        parts.append(f"{limits.tenant_concurrency} per tenant")
    if limits.rate is not None:
        parts.append(f"rate {limits.rate}")
    if limits.tenant_rate is not None:
        parts.append(f"rate {limits.tenant_rate} per tenant")
    return ", ".join(parts) or "unlimited"


def _as_json(stats: QueueStats) -> dict[str, object]:
    def rate(r: Rate | None) -> dict[str, object] | None:
        return None if r is None else {"limit": r.limit, "period": r.period, "burst": r.capacity}

    limits = stats.limits
    return {
        "queue": limits.name, "running": stats.running, "runnable": stats.runnable,
        "concurrency": limits.concurrency, "tenant_concurrency": limits.tenant_concurrency,
        "rate": rate(limits.rate), "tenant_rate": rate(limits.tenant_rate),
    }


def _table(stats: list[QueueStats]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("queue", overflow="fold")
    table.add_column("running", justify="right", no_wrap=True)
    table.add_column("runnable", justify="right", no_wrap=True)
    table.add_column("limits", overflow="fold")
    for s in stats:
        table.add_row(s.limits.name, str(s.running), str(s.runnable), describe_limits(s.limits))
    return table


@click.group(cls=DefaultCommandGroup, default="list")
@db_option
def queues(db: str | None) -> None:
    """Queues: their limits and load; set or clear limits.

    \b
    cairn queues                                  list them ('list' is the default)
    cairn queues set Q --concurrency 10 --rate 100/min --tenant-concurrency 2
    cairn queues clear Q                          remove Q's limits
    cairn queues share Q --tenant T --concurrency 3 --rate 10/min   T's own caps in Q
    cairn queues shares [--tenant T]              list the tenants' own caps

    Tenants share every queue fairly: a claim always takes the next run from
    the tenant with the fewest runs of that queue running.
    """


@queues.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON array, one object per queue.")
@app_option(required=False)
@db_option
@click.pass_context
def queues_list(ctx: click.Context, as_json: bool, app_spec: str | None, db: str | None) -> None:
    """(default) Every queue with limits or live runs: running runs, runs
    that could be claimed now, and the limits."""
    with open_session(db_from_context(ctx, db), app_spec, read_only=True) as session:
        stats = session.operator.queues()
    if as_json:
        echo_json([_as_json(s) for s in stats], indent=2)
    elif not stats:
        echo("no queue has limits or live runs", err=True)
    else:
        stdout_console().print(_table(stats))


def _rate(value: str | None, burst: int | None, option: str, burst_option: str) -> Rate | None:
    if value is None:
        if burst is not None:
            raise click.UsageError(f"{burst_option} needs {option}")
        return None
    try:
        return Rate.parse(value, burst)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=f"'{option}'") from None


@queues.command("set")
@click.argument("name", metavar="QUEUE")
@click.option("--concurrency", type=COUNT, default=None,
              help="At most this many of the queue's runs running at once, all tenants together.")
@click.option("--tenant-concurrency", type=COUNT, default=None,
              help="At most this many running at once per tenant.")
@click.option("--rate", default=None, metavar="N/PERIOD",
              help="At most N claims per PERIOD sustained (token bucket), e.g. 100/min, 10/s, 5/30s.")
@click.option("--burst", type=click.IntRange(min=1), default=None,
              help="Claims allowed at once under --rate (default: N).")
@click.option("--tenant-rate", default=None, metavar="N/PERIOD", help="The same, per tenant.")
@click.option("--tenant-burst", type=click.IntRange(min=1), default=None,
              help="Claims allowed at once under --tenant-rate (default: N).")
@app_option(required=False)
@db_option
@click.pass_context
def queues_set(
    ctx: click.Context, name: str, concurrency: int | None, tenant_concurrency: int | None,
    rate: str | None, burst: int | None, tenant_rate: str | None, tenant_burst: int | None,
    app_spec: str | None, db: str | None,
) -> None:
    """Replace QUEUE's limits with the ones given (a limit not given is
    removed). Every worker applies them from its next claim on."""
    try:
        limits = QueueLimits(name, concurrency, tenant_concurrency, _rate(rate, burst, "--rate", "--burst"),
                             _rate(tenant_rate, tenant_burst, "--tenant-rate", "--tenant-burst"))
    except ValueError as exc:  # an empty name
        raise click.BadParameter(str(exc), param_hint="'QUEUE'") from None
    if limits.unlimited:
        raise click.UsageError(f"give at least one limit (to remove them all: cairn queues clear {name})")
    with open_session(db_from_context(ctx, db), app_spec) as session:
        session.operator.set_queue(limits)
    echo(f"queue {name}: {describe_limits(limits)}")


@queues.command("clear")
@click.argument("name", metavar="QUEUE")
@app_option(required=False)
@db_option
@click.pass_context
def queues_clear(ctx: click.Context, name: str, app_spec: str | None, db: str | None) -> None:
    """Remove QUEUE's limits: it admits every runnable run again."""
    try:
        QueueLimits(name)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'QUEUE'") from None
    with open_session(db_from_context(ctx, db), app_spec) as session:
        session.operator.clear_queue(name)
    echo(f"queue {name}: unlimited")


def describe_share(share: QueueShare) -> str:
    """``at most 3 running, at most 10/min claims`` (or ``no cap of its own``)."""
    parts = []
    if share.concurrency is not None:
        parts.append(f"at most {share.concurrency} running")
    if share.rate is not None:
        parts.append(f"at most {share.rate} claims")
    return ", ".join(parts) or "no cap of its own"


def _share_json(share: QueueShare) -> dict[str, object]:
    rate = share.rate
    return {"queue": share.queue, "tenant": share.tenant, "concurrency": share.concurrency,
            "rate": None if rate is None else {"limit": rate.limit, "period": rate.period,
                                               "burst": rate.capacity}}


@queues.command("share")
@click.argument("name", metavar="QUEUE")
@click.option("--tenant", required=True, help="The tenant whose own share this is.")
@click.option("--concurrency", type=COUNT, default=None,
              help="At most this many of the tenant's runs of QUEUE running at once (not given: no cap of "
                   "its own).")
@click.option("--rate", default=None, metavar="N/PERIOD",
              help="At most N claims of the tenant's runs of QUEUE per PERIOD (token bucket), e.g. 10/min; "
                   "never above QUEUE's --tenant-rate (not given: no rate of its own).")
@click.option("--burst", type=click.IntRange(min=1), default=None,
              help="Claims allowed at once under --rate (default: N).")
@app_option(required=False)
@db_option
@click.pass_context
def queues_share(
    ctx: click.Context, name: str, tenant: str, concurrency: int | None, rate: str | None, burst: int | None,
    app_spec: str | None, db: str | None,
) -> None:
    """Replace TENANT's own share of QUEUE: caps on its own running runs
    and on its claims' rate there, on top of QUEUE's limits (it can only
    hold TENANT back; other tenants are not affected). Neither given:
    remove the share."""
    try:
        share = QueueShare(name, tenant, concurrency, _rate(rate, burst, "--rate", "--burst"))
    except ValueError as exc:  # an empty name or tenant
        raise click.BadParameter(str(exc)) from None
    with open_session(db_from_context(ctx, db), app_spec) as session:
        try:
            session.operator.set_queue_share(share)
        except InvalidArgument as exc:  # a rate above the installation's per-tenant rate
            raise click.BadParameter(str(exc), param_hint="'--rate'") from None
    echo(f"queue {name}, tenant {tenant}: {describe_share(share)}")


@queues.command("shares")
@click.option("--tenant", default=None, help="Only this tenant's shares.")
@click.option("--json", "as_json", is_flag=True, help="One JSON array, one object per share.")
@app_option(required=False)
@db_option
@click.pass_context
def queues_shares(
    ctx: click.Context, tenant: str | None, as_json: bool, app_spec: str | None, db: str | None
) -> None:
    """The tenants' own shares of queues (set with 'cairn queues share')."""
    with open_session(db_from_context(ctx, db), app_spec, read_only=True) as session:
        shares = session.operator.queue_shares(tenant)
    if as_json:
        echo_json([_share_json(s) for s in shares], indent=2)
    elif not shares:
        echo("no tenant has a share of its own", err=True)
    else:
        for s in shares:
            echo(f"queue {s.queue}, tenant {s.tenant}: {describe_share(s)}")
