"""Metrics read from the store at collection time (``otel`` extra): runs by
tenant, workflow and status, and each queue's depth.

Why from the store and not counted by workers: how many runs are pending,
suspended or failed is a fact of the database, not of any one process. A
counter kept by workers would be wrong after every restart and would need
every worker's share summed; an observable gauge asks the store when the
metrics are collected (a Prometheus scrape, an OTLP export interval) and is
right whichever process answers. Reads go through the operator façade (one
grouped scan of ``runs``, the ``queue_stats`` the CLI shows), never per step.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from cairn.errors import MissingExtra, StoreError

if TYPE_CHECKING:
    from cairn.api.app import App

try:
    from opentelemetry import metrics
    from opentelemetry.metrics import CallbackOptions, Observation
except ImportError:  # pragma: no cover - the otel extra is not installed
    metrics = None  # type: ignore[assignment]

log = logging.getLogger("cairn.telemetry")


class StoreMetrics:
    """Registers ``cairn.runs`` and ``cairn.queue.depth`` (observable gauges)
    on a meter of ``meter_provider`` (the global one by default)."""

    def __init__(self, app: App, meter_provider: Any = None) -> None:
        if metrics is None:
            raise MissingExtra("OpenTelemetry store metrics", "otel")
        self.app = app
        meter = metrics.get_meter("cairn.store", meter_provider=meter_provider)
        meter.create_observable_gauge("cairn.runs", callbacks=[self.runs], unit="{run}",
                                      description="Runs in the store, by tenant, workflow and status")
        meter.create_observable_gauge("cairn.queue.depth", callbacks=[self.queues], unit="{run}",
                                      description="Runs of each queue that are running, and runnable now")

    def runs(self, options: CallbackOptions) -> Iterable[Observation]:
        try:
            counts = self.app.operator.run_counts()
        except StoreError as exc:  # the scrape goes on without these series
            log.warning("cannot read the runs for the metrics: %s", exc)
            return []
        return [Observation(n, {"cairn.tenant": tenant, "cairn.workflow": workflow, "cairn.status": status})
                for tenant, workflow, status, n in counts]

    def queues(self, options: CallbackOptions) -> Iterable[Observation]:
        try:
            stats = self.app.operator.queues()
        except StoreError as exc:
            log.warning("cannot read the queues for the metrics: %s", exc)
            return []
        found: list[Observation] = []
        for queue in stats:
            name = queue.limits.name
            found.append(Observation(queue.running, {"cairn.queue": name, "cairn.state": "running"}))
            found.append(Observation(queue.runnable, {"cairn.queue": name, "cairn.state": "runnable"}))
        return found
