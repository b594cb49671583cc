"""Runs, history entries, model calls and operations as JSON for the API.

Payloads are decoded as plain JSON through the codec (``engine.ledger.decode``),
never into user types: the server needs no workflow code to show a run, and
stored bytes are trusted with nothing but a JSON parser. A value that cannot
be decoded is shown as its error, so one damaged entry hides nothing else.
"""

from __future__ import annotations

from typing import Any

import msgspec

from cairn.codec.payloads import PayloadCodec
from cairn.engine import modelcalls
from cairn.engine.journal import Journal
from cairn.engine.ledger import Decoded, OperationView, decode
from cairn.errors import CairnError
from cairn.models.base import ModelRecord
from cairn.store.records import EventType, HistoryEvent, RunRecord, RunStatus


def run_summary(record: RunRecord) -> dict[str, Any]:
    """A run's fields, without its payloads (lists and streams)."""
    return {
        "run_id": record.run_id,
        "workflow": record.workflow,
        "version": record.workflow_version,
        "status": record.status.value,
        "tenant": record.tenant,
        "thread_id": record.thread_id,
        "queue": record.queue,
        "priority": record.priority,
        "parent_run_id": record.parent_run_id,
        "owner": record.owner,
        "epoch": record.epoch,
        "recoveries": record.recoveries,
        "wake_at": record.wake_at,
        "waiting_on": record.waiting_on,
        "waiting_for": record.waiting_for,
        "error": record.error,
        "budget": record.budget,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
    }


def _value(decoded: Decoded, out: dict[str, Any], key: str) -> None:
    out[key] = decoded.value
    if decoded.error is not None:
        out[f"{key}_error"] = decoded.error


def run_detail(codec: PayloadCodec, record: RunRecord, history: list[HistoryEvent]) -> dict[str, Any]:
    """A run with its input, result, budget and usage (``GET /api/runs/{id}``)."""
    out = run_summary(record)
    _value(decode(codec, record.input, "the input"), out, "input")
    result = decode(codec, record.result, "the result") if record.status is RunStatus.COMPLETED else Decoded()
    _value(result, out, "result")
    usage = Journal(history).usage
    out["usage"] = {"tokens": usage.tokens, "cost": usage.cost, "tool_calls": usage.tool_calls}
    out["history_length"] = history[-1].seq if history else 0
    return out


def model_records(codec: PayloadCodec, history: list[HistoryEvent]) -> dict[int, ModelRecord] | str:
    """Model calls rebuilt as sent and received, by ``seq`` (or why they cannot be)."""
    if not any(e.step_kind == "model" for e in history):
        return {}
    try:
        return modelcalls.records(history, codec)
    except (CairnError, ValueError) as exc:
        return f"cannot rebuild model calls: {exc}"


def event_json(codec: PayloadCodec, event: HistoryEvent,
               models: dict[int, ModelRecord] | str | None = None) -> dict[str, Any]:
    """One history entry (the journal pages and the event streams)."""
    out: dict[str, Any] = {"seq": event.seq, "event": event.event.value, "at": event.at, "epoch": event.epoch,
                           "worker": event.worker}
    if event.position is not None:
        out.update(position=event.position, kind=event.step_kind, name=event.name, attempt=event.attempt,
                   started_at=event.started_at)
    if event.payload is not None:
        key = "arguments" if event.event is EventType.OP_INTENT else "result"
        if event.step_kind == "model" and isinstance(models, dict) and event.seq in models:
            out[key] = msgspec.to_builtins(models[event.seq])
        elif event.step_kind == "model" and isinstance(models, str):
            out[key], out[f"{key}_error"] = None, models
        else:
            _value(decode(codec, event.payload), out, key)
    if event.detail is not None:
        out["detail"] = event.detail
    return out


def model_call_json(event: HistoryEvent, record: ModelRecord) -> dict[str, Any]:
    response = record.response
    return {
        "seq": event.seq, "position": event.position, "name": event.name, "at": event.at,
        "model": response.model, "latency_ms": record.latency_ms,
        "usage": msgspec.to_builtins(response.usage), "cost": response.cost,
        "finish_reason": response.finish_reason,
        "request": msgspec.to_builtins(record.request), "response": msgspec.to_builtins(response.message),
    }


def operation_json(op: OperationView) -> dict[str, Any]:
    out: dict[str, Any] = {
        "position": op.position, "tool": op.tool, "effect": op.effect, "status": op.status.value,
        "operation_id": op.operation_id, "attempts": op.attempts, "last_event": op.last_event.value,
        "why": op.why, "uncertain": op.uncertain,
        "resolution": None if op.resolution is None else {
            "how": op.resolution.how.value, "actor": op.resolution.actor, "at": op.resolution.at},
    }
    if op.arguments is not None:
        _value(op.arguments, out, "arguments")
    else:
        out["arguments"] = None
    return out
