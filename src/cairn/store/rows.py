"""Row helpers shared by the SQL backends (and the memory backend), so that
every backend writes the same details and builds the same records.

JSON columns (``detail``, ``error``, ``budget``) are text written by msgspec:
several times faster than ``json``, and values read back exactly as written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from cairn.store.admission import QueueLimits, Rate
from cairn.store.records import EventType, HistoryEvent, NewRun, Payload, RunRecord, RunStatus

_ENCODE_JSON = msgspec.json.Encoder()
_DECODE_JSON = msgspec.json.Decoder()


def dumps(value: Any) -> str:
    """JSON text for a column."""
    return _ENCODE_JSON.encode(value).decode()


def loads(text: str | bytes) -> Any:
    return _DECODE_JSON.decode(text)


def new_record(
    run: NewRun,
    now: float,
    status: RunStatus,
    *,
    epoch: int,
    owner: str | None = None,
    lease_until: float | None = None,
) -> RunRecord:
    """The record just inserted for ``run``, without reading it back."""
    return RunRecord(
        run_id=run.run_id, workflow=run.workflow, workflow_version=run.workflow_version, tenant=run.tenant,
        thread_id=run.thread_id, status=status, input=run.input, result=None, error=None, epoch=epoch,
        owner=owner, lease_expires_at=lease_until, wake_at=None, waiting_on=None, recoveries=0,
        queue=run.queue, priority=run.priority, parent_run_id=run.parent_run_id, created_at=now,
        updated_at=now, budget=loads(dumps(run.budget)) if run.budget is not None else None,
    )


def created_detail(run: NewRun) -> dict[str, Any]:
    """The detail of a ``run.created`` entry."""
    detail: dict[str, Any] = {"workflow": run.workflow, "version": run.workflow_version, "tenant": run.tenant}
    if run.parent_run_id:
        detail["parent_run_id"] = run.parent_run_id
    return detail


def lifecycle_event(
    run_id: str,
    seq: int,
    event: EventType,
    at: float,
    epoch: int,
    worker: str | None,
    detail: dict[str, Any] | None,
) -> HistoryEvent:
    """A history entry that is not a journal entry (no position, no payload)."""
    return HistoryEvent(run_id=run_id, seq=seq, event=event, at=at, epoch=epoch, worker=worker, detail=detail)


#: The columns of a ``queues`` row, in the order ``queue_from_row`` reads them.
QUEUE_COLUMNS = (
    "name", "concurrency", "tenant_concurrency", "rate_limit", "rate_period", "rate_burst",
    "tenant_rate_limit", "tenant_rate_period", "tenant_rate_burst",
)


def queue_params(limits: QueueLimits, now: float) -> dict[str, Any]:
    """Statement parameters for a ``queues`` row holding ``limits``."""

    def rate(r: Rate | None) -> tuple[int | None, float | None, int | None]:
        return (r.limit, r.period, r.burst) if r is not None else (None, None, None)

    values = (limits.name, limits.concurrency, limits.tenant_concurrency, *rate(limits.rate),
              *rate(limits.tenant_rate))
    return {**dict(zip(QUEUE_COLUMNS, values, strict=True)), "now": now}


def queue_from_row(row: Sequence[Any]) -> QueueLimits:
    """``QueueLimits`` from a row of ``QUEUE_COLUMNS``."""

    def rate(limit: int | None, period: float | None, burst: int | None) -> Rate | None:
        return Rate(int(limit), float(period), burst) if limit is not None and period is not None else None

    return QueueLimits(row[0], row[1], row[2], rate(*row[3:6]), rate(*row[6:9]))


def finish_params(
    run_id: str, epoch: int, now: float, status: RunStatus, result: Payload | None,
    error: dict[str, Any] | None,
) -> dict[str, Any]:
    """Statement parameters of ``finish_run``, which ends a run only as
    ``completed`` or ``failed`` (``ValueError`` otherwise)."""
    if status not in (RunStatus.COMPLETED, RunStatus.FAILED):
        raise ValueError(f"finish_run takes completed or failed, not {status}")
    return {
        "run_id": run_id,
        "epoch": epoch,
        "now": now,
        "status": status.value,
        "result": result.data if result else None,
        "result_ref": result.ref if result else None,
        "error": dumps(error) if error is not None else None,
    }
