"""A run's details, its model calls and its operations as JSON for the API
(a run's summary and its history entries are ``cairn.api.views``, shared with
the CLI's ``--json``).

Payloads are decoded as plain JSON through the codec (``api.ledger.decode``),
never into user types: the server needs no workflow code to show a run, and
stored bytes are trusted with nothing but a JSON parser. A value that cannot
be decoded is shown as its error, so one damaged entry hides nothing else.
"""

from __future__ import annotations

from typing import Any

import msgspec

from cairn.api.ledger import Decoded, OperationView, decode
from cairn.api.views import put_decoded, run_json
from cairn.codec.payloads import PayloadCodec
from cairn.models.base import ModelRecord
from cairn.store.records import HistoryEvent, RunRecord, RunStatus, UsageTotals


def run_detail(codec: PayloadCodec, record: RunRecord, usage: UsageTotals) -> dict[str, Any]:
    """A run with its input, result, budget and usage (``GET /api/runs/{id}``);
    ``usage`` is summed by the store, so the run's history is not read."""
    out = run_json(record)
    put_decoded(decode(codec, record.input, "the input"), out, "input")
    result = decode(codec, record.result, "the result") if record.status is RunStatus.COMPLETED else Decoded()
    put_decoded(result, out, "result")
    out["usage"] = {"tokens": usage.tokens, "cost": usage.cost, "tool_calls": usage.tool_calls}
    out["history_length"] = usage.last_seq
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
        put_decoded(op.arguments, out, "arguments")
    else:
        out["arguments"] = None
    return out
