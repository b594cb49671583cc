"""``cairn export RUN``: a run's journal as one JSON document, and reading it back.

The format (``"format": "cairn.run/1"``) is documented in the README
("Versions and bundles") and versioned: a reader refuses a format it does
not know rather than guess. One object with

* ``run``: the run's identity and state (``run_id``, ``workflow``,
  ``version``, ``bundle``, ``tenant``, ``thread_id``, ``queue``, ``priority``,
  ``parent_run_id``, ``status``, ``created_at``, ``updated_at``, ``error``,
  ``budget``), its ``input`` and ``result`` as JSON values;
* ``bundle``: the bundle the run executes on, ``{"id", "content"}`` (the
  content is the stored canonical JSON, as an object), or ``null``;
* ``history``: every entry in order (``seq``, ``event``, ``at``, ``epoch``,
  ``worker``, ``position``, ``step_kind``, ``name``, ``input_hash``,
  ``attempt``, ``started_at``, ``detail``) and, where the entry has one, its
  ``payload`` as a JSON value (offloaded payloads are read in: the file
  stands alone).

``cairn.testing.replay(app, "run.json")`` replays such a file against an
app's code (``engine.replaycheck``), with no database involved.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from cairn.codec.payloads import PayloadCodec
from cairn.engine.bundles import Bundle, BundleDamaged
from cairn.errors import InvalidArgument
from cairn.store.records import (
    BundleRecord,
    EventType,
    HistoryEvent,
    Payload,
    RunRecord,
    RunStatus,
)

FORMAT = "cairn.run/1"

_ENCODE = msgspec.json.Encoder(order="sorted")
_ENTRY_FIELDS = ("seq", "event", "at", "epoch", "worker", "position", "step_kind", "name", "input_hash",
                 "attempt", "started_at", "detail")


def _value(codec: PayloadCodec, payload: Payload | None, what: str) -> Any:
    if payload is None:
        return None
    return msgspec.json.decode(codec.raw(payload, what=what))


def export_run(codec: PayloadCodec, run: RunRecord, history: list[HistoryEvent],
               bundle: Bundle | None) -> dict[str, Any]:
    """The export document of ``run`` (see the module doc)."""
    entries = []
    for event in history:
        entry: dict[str, Any] = {name: getattr(event, name) for name in _ENTRY_FIELDS}
        entry["event"] = event.event.value
        if event.payload is not None:
            entry["payload"] = _value(codec, event.payload, f"entry {event.seq} of run {run.run_id!r}")
        entries.append(entry)
    return {
        "format": FORMAT,
        "run": {
            "run_id": run.run_id, "workflow": run.workflow, "version": run.workflow_version,
            "bundle": run.bundle, "tenant": run.tenant, "thread_id": run.thread_id, "queue": run.queue,
            "priority": run.priority, "parent_run_id": run.parent_run_id, "status": run.status.value,
            "created_at": run.created_at, "updated_at": run.updated_at, "error": run.error,
            "budget": run.budget,
            "input": _value(codec, run.input, f"input of run {run.run_id!r}"),
            "result": _value(codec, run.result, f"result of run {run.run_id!r}"),
        },
        "bundle": None if bundle is None else {"id": bundle.bundle_id,
                                               "content": msgspec.json.decode(bundle.content)},
        "history": entries,
    }


def _inline(value: Any) -> Payload:
    return Payload(data=_ENCODE.encode(value))


def read_export(path: str | Path) -> tuple[RunRecord, list[HistoryEvent], Bundle | None]:
    """The run, history and bundle of an export file; ``InvalidArgument``
    (one line) for a file that is not one."""
    where = str(path)
    try:
        doc = msgspec.json.decode(Path(path).read_bytes())
    except OSError as exc:
        raise InvalidArgument(f"cannot read {where!r}: {exc.strerror or exc}") from None
    except msgspec.DecodeError as exc:
        raise InvalidArgument(f"{where!r} is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else None
        raise InvalidArgument(f"{where!r} is not a run export of format {FORMAT!r} (format: {found!r})")
    try:
        r = doc["run"]
        run = RunRecord(
            run_id=str(r["run_id"]), workflow=str(r["workflow"]), workflow_version=str(r["version"]),
            tenant=str(r["tenant"]), thread_id=r.get("thread_id"), status=RunStatus(r["status"]),
            input=_inline(r.get("input")), result=None if r.get("result") is None else _inline(r["result"]),
            error=r.get("error"), epoch=0, owner=None, lease_expires_at=None, wake_at=None, waiting_on=None,
            recoveries=0, queue=str(r.get("queue", "default")), priority=int(r.get("priority", 0)),
            parent_run_id=r.get("parent_run_id"), created_at=float(r["created_at"]),
            updated_at=float(r["updated_at"]), budget=r.get("budget"), bundle=r.get("bundle"),
        )
        history = []
        for e in doc["history"]:
            history.append(HistoryEvent(
                run_id=run.run_id, seq=int(e["seq"]), event=EventType(e["event"]), at=float(e["at"]),
                epoch=int(e["epoch"]), worker=e.get("worker"), position=e.get("position"),
                step_kind=e.get("step_kind"), name=e.get("name"), input_hash=e.get("input_hash"),
                attempt=e.get("attempt"), started_at=e.get("started_at"),
                payload=_inline(e["payload"]) if "payload" in e else None, detail=e.get("detail"),
            ))
        bundle = None
        if doc.get("bundle") is not None:
            content = _ENCODE.encode(doc["bundle"]["content"])
            b = msgspec.json.decode(content)
            bundle = Bundle.from_record(BundleRecord(str(doc["bundle"]["id"]), str(b["workflow"]),
                                                     str(b["version"]), str(b["code"]), content, 0.0))
    except BundleDamaged as exc:
        raise InvalidArgument(f"{where!r}: {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidArgument(f"{where!r} is not a valid run export: {type(exc).__name__}: {exc}") from None
    return run, history, bundle
