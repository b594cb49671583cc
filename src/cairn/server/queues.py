"""``/api/queues``: queue limits and load (read by viewers, set by admins).

Queues are shared by every tenant (limits apply queue-wide and per
tenant), so setting one is an admin's action; what a tenant sees of a
queue is what ``cairn queues`` shows any tenant's role: its limits and how
many runs it has running and runnable."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from cairn.api.tokens import Role
from cairn.errors import InvalidArgument
from cairn.server.routing import Call, Endpoint
from cairn.store.admission import QueueLimits, QueueStats, Rate

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")]
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


def list_queues(call: Call[Any]) -> Any:
    return {"queues": [queue_json(q) for q in call.operator.queues()]}


def set_queue(call: Call[Any]) -> Any:
    body: QueueBody = call.body
    name = call.path["name"]
    try:
        msgspec.convert(name, Name)
    except msgspec.ValidationError:
        raise InvalidArgument("a queue name is 1 to 200 characters without control characters") from None
    limits = QueueLimits(name, body.concurrency, body.tenant_concurrency,
                         Rate.parse(body.rate) if body.rate is not None else None,
                         Rate.parse(body.tenant_rate) if body.tenant_rate is not None else None)
    call.operator.set_queue(limits)
    found = next((q for q in call.operator.queues() if q.limits.name == name), QueueStats(limits, 0, 0))
    return queue_json(found)


ROUTES = [
    Endpoint("GET", "/api/queues", Role.VIEWER, "Every queue with limits or live runs, with its load",
             list_queues, tag="queues"),
    Endpoint("PUT", "/api/queues/{name}", Role.ADMIN, "Replace a queue's limits (for every tenant)",
             set_queue, body=QueueBody, tag="queues"),
]
