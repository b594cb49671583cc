"""Every endpoint of the API, gathered from the resource modules (a
resource adds its module's ``ROUTES`` here): what the ASGI app serves and
the OpenAPI document describes, one list for both."""

from __future__ import annotations

from cairn.server import (
    approvals,
    archives,
    checkpoints,
    erasures,
    events,
    governance,
    queues,
    runs,
    schedules,
    signals,
    tokens,
    workspaces,
)
from cairn.server import metrics as prometheus
from cairn.server.routing import Endpoint

ROUTES: list[Endpoint] = [*runs.ROUTES, *events.ROUTES, *queues.ROUTES, *tokens.ROUTES]
ROUTES += [*signals.ROUTES, *approvals.ROUTES, *schedules.ROUTES, *prometheus.ROUTES]
ROUTES += checkpoints.ROUTES
ROUTES += workspaces.ROUTES
ROUTES += erasures.ROUTES
ROUTES += archives.ROUTES
ROUTES += governance.ROUTES
