"""Runs and history entries as JSON: one shape for ``cairn ... --json`` and
for the HTTP API, so a script that reads one can read the other.

Payloads are read through the payload codec (so encryption at rest applies)
and decoded as plain JSON, never into user types (``engine.ledger.decode``):
neither the CLI nor the server needs workflow code to show a run, and stored
bytes are trusted with nothing but a JSON parser. A value that cannot be
decoded is shown as its error, so one damaged entry hides nothing else.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Protocol

import msgspec

from cairn.codec.payloads import PayloadCodec
from cairn.engine import modelcalls
from cairn.engine.ledger import Decoded, decode
from cairn.errors import CairnError
from cairn.models.base import ModelRecord
from cairn.store.records import EventType, HistoryEvent, RunRecord

#: Model calls of a history rebuilt as sent and received, by ``seq``: each
#: entry stores only the messages its run had not journaled yet, so it is
#: shown through ``modelcalls.records``, never as the compact entry.
ModelCalls = dict[int, Decoded]


def run_json(record: RunRecord) -> dict[str, Any]:
    """A run's fields, without its payloads (times as Unix seconds, like the store)."""
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
        "lease_expires_at": record.lease_expires_at,
        "wake_at": record.wake_at,
        "waiting_on": record.waiting_on,
        "waiting_for": record.waiting_for,
        "error": record.error,
        "budget": record.budget,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
    }


def model_records(codec: PayloadCodec, history: list[HistoryEvent]) -> dict[int, ModelRecord] | str:
    """The run's model calls rebuilt, by ``seq``, or why they cannot be (a
    damaged entry must not hide the rest of the run)."""
    if not any(e.step_kind == "model" for e in history):
        return {}
    try:
        return modelcalls.records(history, codec)
    except (CairnError, ValueError) as exc:
        return f"cannot rebuild model calls: {exc}"


def model_calls(codec: PayloadCodec, history: list[HistoryEvent]) -> ModelCalls:
    """``model_records`` as decoded values (the error on each model call's entry)."""
    records = model_records(codec, history)
    if isinstance(records, str):
        return {e.seq: Decoded(error=records) for e in history
                if e.step_kind == "model" and e.event is EventType.STEP_COMPLETED}
    return {seq: Decoded(msgspec.to_builtins(record)) for seq, record in records.items()}


class Reads(Protocol):
    """The reads of one run's journal a page of model calls needs (``App``)."""

    def history(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[HistoryEvent]: ...

    def history_at(self, run_id: str, seqs: Collection[int]) -> list[HistoryEvent]: ...


def model_records_of(reads: Reads, codec: PayloadCodec, run_id: str,
                     entries: Sequence[HistoryEvent]) -> dict[int, ModelRecord] | str:
    """The model calls among ``entries`` (a page of ``run_id``'s history),
    rebuilt from the entries they name as needed, read by seq: a page deep
    in a long run reads about as much as it shows, not the journal before
    it. Entries written before they named their needs are rebuilt from the
    journal's start, as before. An error names why they cannot be."""
    calls = [e for e in entries if modelcalls.is_model_call(e)]
    if not calls:
        return {}
    try:
        needed = modelcalls.needs(calls, codec)
        if needed is None:
            found = modelcalls.records(reads.history(run_id, 0, max(e.seq for e in calls)), codec)
        else:
            have = {e.seq for e in calls}
            found = modelcalls.rebuild_some(calls, reads.history_at(run_id, needed - have), codec)
    except (CairnError, ValueError) as exc:
        return f"cannot rebuild model calls: {exc}"
    return {e.seq: found[e.seq] for e in calls if e.seq in found}


def model_calls_of(reads: Reads, codec: PayloadCodec, run_id: str,
                   entries: Sequence[HistoryEvent]) -> ModelCalls:
    """``model_records_of`` as decoded values (the error on each model call's entry)."""
    records = model_records_of(reads, codec, run_id, entries)
    if isinstance(records, str):
        return {e.seq: Decoded(error=records) for e in entries if modelcalls.is_model_call(e)}
    return {seq: Decoded(msgspec.to_builtins(record)) for seq, record in records.items()}


def result_of(codec: PayloadCodec, event: HistoryEvent, models: ModelCalls) -> Decoded:
    """What a journal entry recorded: a model call rebuilt, anything else decoded."""
    found = models.get(event.seq)
    return found if found is not None else decode(codec, event.payload)


def put_decoded(decoded: Decoded, out: dict[str, Any], key: str) -> None:
    """``out[key]`` is the value, and ``out[key + "_error"]`` why it is missing."""
    out[key] = decoded.value
    if decoded.error is not None:
        out[f"{key}_error"] = decoded.error


def event_json(codec: PayloadCodec, event: HistoryEvent, models: ModelCalls | None = None) -> dict[str, Any]:
    """One history entry (``cairn history --json``, the API's journal pages and event streams)."""
    out: dict[str, Any] = {"seq": event.seq, "event": event.event.value, "at": event.at, "epoch": event.epoch,
                           "worker": event.worker}
    if event.position is not None:
        out.update(position=event.position, kind=event.step_kind, name=event.name, attempt=event.attempt,
                   started_at=event.started_at)
    if event.payload is not None:
        key = "arguments" if event.event is EventType.OP_INTENT else "result"
        put_decoded(result_of(codec, event, models or {}), out, key)
    if event.detail is not None:
        out["detail"] = event.detail
    return out


__all__ = ["ModelCalls", "Reads", "event_json", "model_calls", "model_calls_of", "model_records",
           "model_records_of", "put_decoded", "result_of", "run_json"]
