"""``/api/schedules``: the tenant's schedules as ``cairn schedules`` shows
them (``App.schedules``: what workers registered, merged with what the
serving app declares), read-only. Pausing is not offered: neither the
Operator nor the store has such a state, and the API adds none of its own."""

from __future__ import annotations

from typing import Any

from cairn.api.tokens import Role
from cairn.server.routing import Call, Endpoint


def list_schedules(call: Call[Any]) -> Any:
    views = call.app.schedules()
    return {"schedules": [v.as_dict() for v in views if v.tenant == call.principal.tenant]}


ROUTES = [
    Endpoint("GET", "/api/schedules", Role.VIEWER, "The tenant's schedules: definition, last and next tick",
             list_schedules, tag="schedules"),
]
