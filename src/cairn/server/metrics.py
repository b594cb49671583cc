"""``GET /metrics``: the Prometheus text format (``cairn serve --metrics``).

Built on OpenTelemetry's Prometheus exporter (``opentelemetry-exporter-
prometheus``, over ``prometheus-client``) rather than ``prometheus-client``
alone: Cairn records every metric once, through the OpenTelemetry API, and
the same instruments go out over OTLP or to this endpoint, whichever reader
the process has. The server has a meter provider of its own with one
Prometheus reader on a registry of its own (not the process-global one, so
two servers in one process, or an application's own metrics, never collide)
and the store's gauges (``cairn.api.store_metrics``); with ``instrument``
on the same provider its process's executions would appear too.

Authorization: a **viewer** token, like every other read, and the answer
holds only the token's tenant: a series labelled with another tenant is
left out, and so is queue depth (a queue's load is every tenant's runs in
it, and its name may be another tenant's). An ``installation`` token gets
every series. Prometheus sends the token
with ``authorization: {credentials_file: ...}`` in its scrape config.
Off unless ``create_app(metrics=True)`` (``cairn serve --metrics``): a
server that was not asked for metrics answers 404 and does no work.
"""

from __future__ import annotations

import os
from typing import Any

from starlette.responses import Response

from cairn.api.app import App
from cairn.api.tokens import Role
from cairn.errors import MissingExtra
from cairn.server.errors import ApiError
from cairn.server.routing import Call, Endpoint

#: the Prometheus label of a series' tenant
TENANT_LABEL = "cairn_tenant"
#: the label of a queue's series (every tenant's load: the installation's to see)
QUEUE_LABEL = "cairn_queue"


class Metrics:
    """What ``/metrics`` renders: a meter provider with a Prometheus reader
    and the store's gauges."""

    def __init__(self, app: App) -> None:
        try:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.resources import Resource
            from prometheus_client import CollectorRegistry
        except ImportError:
            raise MissingExtra("GET /metrics", "otel-export") from None
        from cairn.api.store_metrics import StoreMetrics

        self.registry = CollectorRegistry(auto_describe=False)
        self.reader = PrometheusMetricReader(registry=self.registry)
        named = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "cairn-serve"}
        self.provider = MeterProvider(resource=Resource.create(named), metric_readers=[self.reader])
        self.store = StoreMetrics(app, self.provider)

    def render(self, tenant: str | None) -> bytes:
        """The exposition of every series of ``tenant`` and of no tenant but
        a queue's (``None``: every series)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry if tenant is None else _OfTenant(self.registry, tenant))

    def close(self) -> None:
        self.provider.shutdown()


class _OfTenant:
    """A registry's families without the samples of other tenants."""

    def __init__(self, registry: Any, tenant: str) -> None:
        self.registry = registry
        self.tenant = tenant

    def collect(self) -> Any:
        for family in self.registry.collect():
            tenant = self.tenant
            family.samples = [s for s in family.samples if s.labels.get(TENANT_LABEL, tenant) == tenant
                              and QUEUE_LABEL not in s.labels]
            yield family


def get_metrics(call: Call[Any]) -> Any:
    exporter: Metrics | None = call.request.app.state.cairn.extra.get("metrics")
    if exporter is None:
        raise ApiError(404, "not_found", "metrics are off: start the server with cairn serve --metrics")
    from prometheus_client import CONTENT_TYPE_LATEST

    everything = call.principal.role.allows(Role.INSTALLATION)
    return Response(exporter.render(None if everything else call.principal.tenant),
                    media_type=CONTENT_TYPE_LATEST)


ROUTES = [
    Endpoint("GET", "/metrics", Role.VIEWER, "The metrics in the Prometheus text format (the token's tenant)",
             get_metrics, tag="metrics", returns="Prometheus text exposition", media="text/plain"),
]
