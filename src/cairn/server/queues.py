"""``/api/queues``: queue limits and load (read by viewers, set by the installation).

Queues are shared by every tenant (limits apply queue-wide and per
tenant), so setting one is the installation's action (an ``installation``
token, never a tenant admin: one tenant's ``{"rate": "1/d"}`` on
``default`` starved every other). A tenant's token sees the queues that
have limits (the installation's names) and those its own runs are in,
with its own runs' load; another tenant's queue names and load stay
hidden. An installation token sees what ``cairn queues`` shows.

A tenant's admin sets its own tenant's *share* of a queue
(``/api/queues/{name}/share``): a cap on how many of its own runs of the
queue run at once and on how fast they are claimed (a rate of its own), on
top of the installation's limits, so it can only hold that tenant back (a
rate above the installation's per-tenant rate is refused, saying so). The
tenant is always the token's: a body naming another is refused (no such
field), and no path or query names one."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from cairn.api.tokens import Role
from cairn.errors import InvalidArgument
from cairn.server.routing import Call, Endpoint
from cairn.store.admission import QueueLimits, QueueShare, QueueStats, Rate

#: ``$`` alone would admit a final LF (Python matches it before a trailing newline)
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$(?!\n)")]
Count = Annotated[int, msgspec.Meta(ge=1, le=1_000_000_000)]
_UNIT = r"(?:ms|s|sec|second|m|min|minute|h|hour|d|day)"
_AMOUNT = r"(?:0*[1-9][0-9]{0,8}(?:\.[0-9]{0,6})?|0*\.[0-9]{0,5}[1-9])"
#: what ``Rate.parse`` reads, as a pattern the document publishes (a client sees the rule up front)
RATE = rf"^\s*0*[1-9][0-9]{{0,8}}\s*/\s*(?:{_AMOUNT}\s*{_UNIT}?|{_UNIT})\s*$"
RateText = Annotated[str, msgspec.Meta(min_length=1, max_length=100, pattern=RATE)]


class QueueBody(msgspec.Struct, forbid_unknown_fields=True):
    """A queue's limits, replacing any it had (none given: unlimited). Rates
    read like ``100/min`` or ``5/30s``."""

    concurrency: Count | None = None
    tenant_concurrency: Count | None = None
    rate: RateText | None = None
    tenant_rate: RateText | None = None


def _rate(rate: Rate | None) -> dict[str, Any] | None:
    return None if rate is None else {"limit": rate.limit, "period": rate.period, "burst": rate.capacity}


def queue_json(stats: QueueStats) -> dict[str, Any]:
    limits = stats.limits
    return {"queue": limits.name, "running": stats.running, "runnable": stats.runnable,
            "concurrency": limits.concurrency, "tenant_concurrency": limits.tenant_concurrency,
            "rate": _rate(limits.rate), "tenant_rate": _rate(limits.tenant_rate)}


def _tenant_of(call: Call[Any]) -> str | None:
    """Whose load the caller sees: an installation token every tenant's,
    any other token its own tenant's only (another tenant's queue names
    and load are that tenant's business)."""
    return None if call.principal.role.allows(Role.INSTALLATION) else call.principal.tenant


def list_queues(call: Call[Any]) -> Any:
    return {"queues": [queue_json(q) for q in call.operator.queues(_tenant_of(call))]}


class ShareBody(msgspec.Struct, forbid_unknown_fields=True):
    """The caller's tenant's own share of a queue, replacing any it had:
    at most ``concurrency`` of its runs of the queue running at once, and
    at most ``rate`` claims of them (``10/min``: a token bucket, bursts of
    up to 10). ``null`` or left out: no cap of that kind of its own (both:
    no share, the queue's limits alone apply)."""

    concurrency: Count | None = None
    rate: RateText | None = None


def _queue_name(call: Call[Any]) -> str:
    name: str = call.path["name"]
    try:
        msgspec.convert(name, Name)
    except msgspec.ValidationError:
        raise InvalidArgument("a queue name is 1 to 200 characters without control characters") from None
    return name


def share_json(share: QueueShare) -> dict[str, Any]:
    return {"queue": share.queue, "tenant": share.tenant, "concurrency": share.concurrency,
            "rate": _rate(share.rate)}


def get_share(call: Call[Any]) -> Any:
    name, tenant = _queue_name(call), call.principal.tenant
    found = [s for s in call.operator.queue_shares(tenant) if s.queue == name]
    return share_json(found[0] if found else QueueShare(name, tenant))


def set_share(call: Call[Any]) -> Any:
    body: ShareBody = call.body
    share = QueueShare(_queue_name(call), call.principal.tenant, body.concurrency,
                       Rate.parse(body.rate) if body.rate is not None else None)
    call.operator.set_queue_share(share)
    return share_json(share)


def set_queue(call: Call[Any]) -> Any:
    body: QueueBody = call.body
    name = _queue_name(call)
    limits = QueueLimits(name, body.concurrency, body.tenant_concurrency,
                         Rate.parse(body.rate) if body.rate is not None else None,
                         Rate.parse(body.tenant_rate) if body.tenant_rate is not None else None)
    call.operator.set_queue(limits)
    found = next((q for q in call.operator.queues(_tenant_of(call)) if q.limits.name == name),
                 QueueStats(limits, 0, 0))
    return queue_json(found)


ROUTES = [
    Endpoint("GET", "/api/queues", Role.VIEWER,
             "The queues with limits or with the tenant's live runs, with the tenant's load (an "
             "installation token: every queue, every tenant's load)", list_queues, tag="queues"),
    Endpoint("PUT", "/api/queues/{name}", Role.INSTALLATION,
             "Replace a queue's limits, shared by every tenant (an installation token only)",
             set_queue, body=QueueBody, tag="queues"),
    Endpoint("GET", "/api/queues/{name}/share", Role.VIEWER,
             "The token's tenant's own share of a queue (concurrency, rate null: none)", get_share,
             tag="queues"),
    Endpoint("PUT", "/api/queues/{name}/share", Role.ADMIN,
             "Replace the token's tenant's own share of a queue: caps on its own running runs and on "
             "its claims' rate there, on top of the queue's limits (it can only hold the tenant back; "
             "a rate above the installation's per-tenant rate is refused)",
             set_share, body=ShareBody, tag="queues"),
]
