"""Row mapping and statement parameters, once for both SQL dialects: every
statement lists a run's columns as ``RUN_COLUMNS`` and an entry's as
``EVENT_COLUMNS``, so one function maps each back to a record.

JSON columns (``detail``, ``error``, ``budget``) are text written by msgspec:
several times faster than ``json``, and values read back exactly as written.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any, TypeVar

import msgspec

from cairn.errors import StoreError
from cairn.security.envelope import compress
from cairn.store.admission import Bucket, QueueLimits, QueueShare, Rate
from cairn.store.lifecycle import RunUpdate, check_finish_status
from cairn.store.records import (
    Approval,
    ApprovalRequest,
    ApprovalStatus,
    BundleRecord,
    Delivery,
    EventType,
    HistoryEvent,
    NewRun,
    Payload,
    RunRecord,
    RunStatus,
)
from cairn.store.retention import EXPIRED_TAG

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
        bundle=run.bundle,
    )


#: The columns of a run row, in the order every statement that reads runs
#: lists them and ``run_from_row`` maps them (``RETURNING`` included).
RUN_COLUMNS = (
    "run_id", "workflow", "workflow_version", "tenant", "thread_id", "status", "input", "input_ref",
    "result", "result_ref", "error", "epoch", "owner", "lease_expires_at", "wake_at", "waiting_on",
    "waiting_for", "recoveries", "queue", "priority", "parent_run_id", "created_at", "updated_at", "budget",
    "bundle",
)

#: The columns of a history entry as statements read and write them, in
#: ``HistoryEvent`` field order (the tenant is never among them: every
#: statement reads it from the run row).
EVENT_COLUMNS = (
    "run_id", "seq", "event", "at", "epoch", "worker", "position", "step_kind", "name", "input_hash",
    "attempt", "started_at", "payload", "payload_ref", "detail",
)


class DamagedRow(StoreError):
    """A stored row holds a value no record can be made of (an unknown
    status or entry type, JSON that does not parse): the row was edited or
    damaged outside Cairn. Paths that act on a run read its rows strictly
    and quarantine the run; inspection reads them leniently (``lenient``)."""


_E = TypeVar("_E", RunStatus, EventType, ApprovalStatus)


def unknown_member(kind: type[_E], raw: Any) -> _E:
    """A stand-in member of ``kind`` for a stored value this version does not
    know, shown as ``?<value>`` so a reader sees both the raw value and that
    it is not a real one. It is none of the real members: every rule that
    tests a status or an entry type (``is RunStatus.X``) treats it as what
    it is, something else."""
    member = str.__new__(kind, f"?{raw}")
    member._name_ = "UNKNOWN"
    member._value_ = f"?{raw}"
    return member


def _member(kind: type[_E], raw: Any, lenient: bool) -> _E:
    try:
        return kind(raw)
    except ValueError:
        if lenient:
            return unknown_member(kind, raw)
        raise DamagedRow(f"unknown {kind.__name__} {raw!r}") from None


def _json(text: Any, column: str, lenient: bool) -> Any:
    if text is None:
        return None
    try:
        return _DECODE_JSON.decode(text)
    except (msgspec.DecodeError, TypeError) as exc:
        if lenient:
            return {"damaged": str(text)[:200]}
        raise DamagedRow(f"{column} is not valid JSON ({exc})") from None


def _bytes(value: Any) -> bytes | None:
    """A BLOB/bytea as ``bytes`` (PostgreSQL may read back a ``memoryview``)."""
    return value if value is None or type(value) is bytes else bytes(value)


#: History payloads at least this long are stored zlib-compressed when that
#: saves space. A model call's entry (two 1 KB messages: about 2.4 KB) is
#: larger than a SQLite ``WITHOUT ROWID`` row keeps in its page (about 1 KB
#: on 4 KB pages): stored as it is, each one took an overflow page of its own
#: (80 turns: 2.2x the message bytes on disk); on PostgreSQL a row over
#: 2 KB is moved to TOAST in 2 KB chunks. A plain step's small result stays
#: below the limit and costs one length check.
COMPRESS_AT = 512
#: The first bytes of a stored payload that is not the payload itself: JSON
#: never starts with a NUL byte, so only a payload that does (written through
#: the store API, not the codec) is escaped, and no value is ambiguous.
_PACKED = 0
_RAW_TAG = b"\x00\x00"
_ZLIB_TAG = b"\x00\x01"
#: A SQLite row whose payload lives in ``history_payloads`` (the digits of
#: its id follow); the store's queries put the payload in its place, so a
#: reader that meets the tag met a dangling link.
LINK_TAG = b"\x00\x02"


#: The first byte of a sealed value (``cairn.security.envelope.MAGIC``; JSON
#: never starts with it): its ciphertext is not worth a compression attempt.
ENVELOPE = 0xCE


def pack_payload(data: bytes | None) -> bytes | None:
    """A history payload as stored: compressed if large and compressible,
    escaped if it starts with a NUL byte, else unchanged (see ``COMPRESS_AT``)."""
    if data is None:
        return None
    if len(data) >= COMPRESS_AT and data[0] != ENVELOPE:  # an envelope's ciphertext does not compress
        packed = compress(data)
        if len(packed) + len(_ZLIB_TAG) < len(data):
            return _ZLIB_TAG + packed
    if data[:1] == b"\x00":
        return _RAW_TAG + data
    return data


def unpack_payload(stored: Any, what: str = "a history payload", lenient: bool = True) -> bytes | None:
    """The payload ``pack_payload`` stored. A damaged one is a ``DamagedRow``
    unless ``lenient``: then its stored bytes, which decode as no value."""
    data = _bytes(stored)
    if not data or data[0] != _PACKED:
        return data
    tag = data[:2]
    if tag == _RAW_TAG:
        return data[2:]
    if tag == _ZLIB_TAG:
        try:
            return zlib.decompress(data[2:])
        except zlib.error as exc:
            problem = f"{what} does not decompress: {exc}"
    elif tag == EXPIRED_TAG:
        return data  # retention removed the body: the codec says so to whoever reads it (store.retention)
    elif tag == LINK_TAG:
        problem = f"{what} links to a missing stored payload {data[2:].decode(errors='replace')}"
    else:
        problem = f"{what} starts with an unknown tag {tag.hex()}"
    if lenient:
        return data
    raise DamagedRow(problem)


def run_from_row(row: Sequence[Any], *, lenient: bool = True) -> RunRecord:
    """A ``RunRecord`` from a row of ``RUN_COLUMNS``. A damaged value
    (``DamagedRow`` when not ``lenient``) reads as a stand-in: an unknown
    status as ``unknown_member``, unparsable JSON as ``{"damaged": text}``."""
    return RunRecord(
        run_id=row[0],
        workflow=row[1],
        workflow_version=row[2],
        tenant=row[3],
        thread_id=row[4],
        status=_member(RunStatus, row[5], lenient),
        input=Payload(_bytes(row[6]), row[7]),
        result=Payload(_bytes(row[8]), row[9]) if (row[8] is not None or row[9] is not None) else None,
        error=_json(row[10], "error", lenient),
        epoch=row[11],
        owner=row[12],
        lease_expires_at=row[13],
        wake_at=row[14],
        waiting_on=row[15],
        waiting_for=row[16],
        recoveries=row[17],
        queue=row[18],
        priority=row[19],
        parent_run_id=row[20],
        created_at=row[21],
        updated_at=row[22],
        budget=_json(row[23], "budget", lenient),
        bundle=row[24],
    )


def bundle_from_row(row: Sequence[Any]) -> BundleRecord:
    """A ``BundleRecord`` from a ``select_bundles`` row (its content is
    checked against its id by the reader: ``cairn.engine.bundles``)."""
    raw = row[4]
    # a row edited outside Cairn may hold text (or anything): bytes of it, which the check refuses
    content = raw.encode() if isinstance(raw, str) else _bytes(raw) if isinstance(raw, bytes | memoryview) \
        else str(raw).encode()
    return BundleRecord(bundle_id=str(row[0]), workflow=str(row[1]), version=str(row[2]), code=str(row[3]),
                        content=content or b"", created_at=row[5], served_at=row[6])


#: The columns of a mailbox row, in ``Delivery`` field order.
MESSAGE_COLUMNS = (
    "run_id", "seq", "key", "payload", "payload_ref", "sender", "dedupe", "sent_at", "taken_at",
    "taken_position",
)


def delivery_from_row(row: Sequence[Any]) -> Delivery:
    """A ``Delivery`` from a row of ``MESSAGE_COLUMNS``."""
    payload = Payload(_bytes(row[3]), row[4]) if (row[3] is not None or row[4] is not None) else None
    return Delivery(run_id=row[0], seq=row[1], key=row[2], payload=payload, sender=row[5], dedupe=row[6],
                    sent_at=row[7], taken_at=row[8], taken_position=row[9])


def message_params(run_id: str, key: str, payload: Payload | None, sender: str | None, dedupe: str | None,
                   now: float) -> dict[str, Any]:
    """Parameters of ``insert_message``, the same in both dialects."""
    return {"run_id": run_id, "key": key, "payload": payload.data if payload else None,
            "payload_ref": payload.ref if payload else None, "sender": sender, "dedupe": dedupe, "now": now}


def event_from_row(row: Sequence[Any], *, lenient: bool = True) -> HistoryEvent:
    """A ``HistoryEvent`` from a row of ``EVENT_COLUMNS``; damaged values as
    in ``run_from_row``. Replay must never read a stand-in: a claim reads
    histories with ``lenient=False`` (see ``claim_history``)."""
    payload = (Payload(unpack_payload(row[12], f"the payload of history entry {row[1]}", lenient), row[13])
               if (row[12] is not None or row[13] is not None) else None)
    return HistoryEvent(
        run_id=row[0],
        seq=row[1],
        event=_member(EventType, row[2], lenient),
        at=row[3],
        epoch=row[4],
        worker=row[5],
        position=row[6],
        step_kind=row[7],
        name=row[8],
        input_hash=row[9],
        attempt=row[10],
        started_at=row[11],
        payload=payload,
        detail=_json(row[14], f"the detail of history entry {row[1]}", lenient),
    )


def claim_history(rows: Sequence[Sequence[Any]]) -> tuple[list[HistoryEvent], int, str | None]:
    """A claimed run's history from its rows (``EVENT_COLUMNS``, by ``seq``),
    read strictly: ``(history, last seq, None)``, or ``([], last seq,
    what is damaged)`` when a row cannot be read, so the claim quarantines
    that run instead of failing for every run (``lifecycle.claim``)."""
    try:
        history = [event_from_row(row, lenient=False) for row in rows]
    except (DamagedRow, TypeError, ValueError) as exc:
        return [], int(rows[-1][1]), str(exc)
    return history, history[-1].seq if history else 0, None


def claimed_run(row: Sequence[Any]) -> RunRecord | str:
    """A claimed run's record read strictly from its row, or what is damaged
    in it (the claim then quarantines it: ``lifecycle.quarantine_damaged``)."""
    try:
        return run_from_row(row, lenient=False)
    except (DamagedRow, TypeError, ValueError) as exc:
        return str(exc)


def claim_status(raw: Any) -> RunStatus:
    """A candidate's stored status; an unknown one as ``unknown_member`` (the claim quarantines it)."""
    return _member(RunStatus, raw, True)


def event_values(event: HistoryEvent) -> tuple[Any, ...]:
    """The values of ``event`` in ``EVENT_COLUMNS`` order (once per step:
    kept to one tuple display, no per-field calls; ``_value_`` is the enum
    member's value without the ``value`` property's Python-level call)."""
    payload = event.payload
    data = None if payload is None else payload.data  # stored as pack_payload stores it (its cheap case here)
    detail = event.detail
    return (
        event.run_id, event.seq, event.event._value_, event.at, event.epoch, event.worker, event.position,
        event.step_kind, event.name, event.input_hash, event.attempt, event.started_at,
        data if data is None or (len(data) < COMPRESS_AT and (not data or data[0])) else pack_payload(data),
        None if payload is None else payload.ref,
        None if detail is None else _ENCODE_JSON.encode(detail).decode(),
    )


def run_params(
    run: NewRun,
    now: float,
    *,
    status: RunStatus,
    runnable_at: float | None,
    epoch: int = 0,
    owner: str | None = None,
    lease_until: float | None = None,
) -> dict[str, Any]:
    """Statement parameters of ``insert_run`` / ``create_run`` for ``run``."""
    return {
        "run_id": run.run_id,
        "tenant": run.tenant,
        "workflow": run.workflow,
        "workflow_version": run.workflow_version,
        "thread_id": run.thread_id,
        "queue": run.queue,
        "priority": run.priority,
        "parent_run_id": run.parent_run_id,
        "status": status.value,
        "input": run.input.data,
        "input_ref": run.input.ref,
        "epoch": epoch,
        "owner": owner,
        "lease_expires_at": lease_until,
        "runnable_at": runnable_at,
        "budget": dumps(run.budget) if run.budget is not None else None,
        "bundle": run.bundle,
        "started_role": run.started_role,
        "started_token": run.started_token,
        "subject": run.subject,
        "now": now,
    }


def update_params(update: RunUpdate) -> dict[str, Any]:
    """Statement parameters of the run update ``update.statement``."""
    return {
        "run_id": update.run_id,
        "now": update.at,
        "error": dumps(update.error) if update.error is not None else None,
        "budget": dumps(update.budget) if update.budget is not None else None,
        "recoveries": update.recoveries,
        "fence": update.fence,
        "bundle": update.bundle,
        "version": update.version,
    }


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


def share_params(share: QueueShare, now: float) -> dict[str, Any]:
    """Statement parameters of ``upsert_share`` / ``delete_share``."""
    rate = share.rate
    return {"queue": share.queue, "tenant": share.tenant, "concurrency": share.concurrency,
            "rate_limit": rate.limit if rate else None, "rate_period": rate.period if rate else None,
            "rate_burst": rate.burst if rate else None, "now": now}


def share_from_row(row: Sequence[Any]) -> QueueShare:
    """``QueueShare`` from ``queue, tenant, concurrency, rate_limit,
    rate_period, rate_burst``."""
    limit, period, burst = row[3:6]
    rate = Rate(int(limit), float(period), burst) if limit is not None and period is not None else None
    return QueueShare(row[0], row[1], row[2], rate)


def share_bucket_from_row(tokens: float | None, refilled_at: float | None) -> Bucket | None:
    """A share's stored bucket (``None``: full, never spent)."""
    return None if tokens is None or refilled_at is None else Bucket(float(tokens), float(refilled_at))


def finish_params(
    run_id: str, epoch: int, now: float, status: RunStatus, result: Payload | None,
    error: dict[str, Any] | None,
) -> dict[str, Any]:
    """Statement parameters of ``finish_run``, which ends a run only as
    ``completed`` or ``failed`` (``ValueError`` otherwise)."""
    check_finish_status(status)
    return {
        "run_id": run_id,
        "epoch": epoch,
        "now": now,
        "status": status.value,
        "result": result.data if result else None,
        "result_ref": result.ref if result else None,
        "error": dumps(error) if error is not None else None,
    }


# -- approvals ---------------------------------------------------------------------------------


def approval_params(
    run_id: str, event: HistoryEvent, request: ApprovalRequest, now: float
) -> dict[str, Any]:
    """Parameters of ``insert_approval``, the same in both dialects."""
    return {
        "run_id": run_id, "request_id": request.request_id, "position": event.position,
        "request_seq": event.seq, "action": request.action, "type_name": request.type_name,
        "schema": None if request.schema is None else dumps(request.schema),
        "approvers": None if request.approvers is None else dumps(list(request.approvers)),
        "now": now, "expires_at": request.expires_at,
    }


def approval_from_row(row: Sequence[Any]) -> Approval:
    """An ``Approval`` from a row of ``select_approvals``. A damaged JSON
    column reads as a stand-in (``{"damaged": text}``), which matches no
    approver and admits no edit."""
    approvers = _json(row[8], "approvers", True)
    schema = _json(row[7], "schema", True)
    request = (Payload(unpack_payload(row[16]), row[17])
               if (row[16] is not None or row[17] is not None) else None)
    decision = Payload(_bytes(row[18]), row[19]) if (row[18] is not None or row[19] is not None) else None
    status = _member(ApprovalStatus, row[11], True)  # an unknown status is not pending: it takes no decision
    run_status = _member(RunStatus, row[20], True)
    return Approval(
        run_id=row[0], request_id=row[1], tenant=row[2], position=row[3], request_seq=row[4], action=row[5],
        type_name=row[6], schema=schema if isinstance(schema, dict) else None,
        approvers=tuple(str(a) for a in approvers) if isinstance(approvers, list) else (
            None if approvers is None else ("?damaged",)),
        requested_at=row[9], expires_at=row[10], status=status, decided_by=row[12], decided_at=row[13],
        comment=row[14], decision_seq=row[15], request=request, decision=decision, run_status=run_status,
    )
