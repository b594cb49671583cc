"""Turning runs and history entries into tables, lines and JSON.

Payloads are decoded as plain JSON (``cairn.codec.values.decode`` with no
target type), never into user types: the inspection commands must work
without the workflow code and must not trust stored bytes with anything but
a JSON parser.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from cairn.codec import values
from cairn.errors import PayloadError
from cairn.store.contract import Store
from cairn.store.records import JOURNAL_EVENTS, EventType, HistoryEvent, Payload, RunRecord, RunStatus

STATUS_STYLE = {
    RunStatus.PENDING: "yellow",
    RunStatus.RUNNING: "cyan",
    RunStatus.SUSPENDED: "blue",
    RunStatus.COMPLETED: "green",
    RunStatus.FAILED: "red",
    RunStatus.CANCELLED: "magenta",
    RunStatus.QUARANTINED: "bold red",
}

_JOURNAL_STATUS = {
    EventType.STEP_COMPLETED: "completed",
    EventType.STEP_FAILED: "failed",
    EventType.STEP_RETRIED: "retried",
}


def fmt_time(ts: float | None) -> str:
    """Local wall-clock time with milliseconds; ``-`` when unset."""
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) + f".{int(ts % 1 * 1000):03d}"


def fmt_seconds(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True, default=str)


def preview(value: Any, width: int = 60) -> str:
    """One short line standing for a value, cut with an ellipsis."""
    text = value if isinstance(value, str) else compact(value)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


@dataclass(frozen=True, slots=True)
class Decoded:
    """A payload decoded as plain JSON, or why it could not be."""

    value: Any = None
    error: str | None = None


def decode(store: Store, payload: Payload | None) -> Decoded:
    """Decode a stored payload (inline or artifact) without failing the command:
    one unreadable value should not hide the rest of a run."""
    if payload is None:
        return Decoded(None)
    try:
        data = payload.data if payload.data is not None else store.get_artifact(payload.ref or "")
        return Decoded(values.decode(data))
    except PayloadError as exc:
        return Decoded(error=str(exc))


def show_decoded(decoded: Decoded, width: int = 60) -> str:
    return f"<{decoded.error}>" if decoded.error is not None else preview(decoded.value, width)


# -- runs --------------------------------------------------------------------------------------


def run_json(record: RunRecord) -> dict[str, Any]:
    """A run's fields for ``--json`` output (times as Unix seconds, like the store)."""
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
        "error": record.error,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
    }


def status_text(status: RunStatus) -> Text:
    return Text(status.value, style=STATUS_STYLE[status])


def runs_table(records: list[RunRecord]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("run id", no_wrap=True, style="bold")
    table.add_column("workflow")
    table.add_column("status", no_wrap=True)
    table.add_column("tenant")
    table.add_column("created", no_wrap=True)
    table.add_column("updated", no_wrap=True)
    table.add_column("owner")
    for r in records:
        table.add_row(
            r.run_id, f"{r.workflow} v{r.workflow_version}", status_text(r.status), r.tenant,
            fmt_time(r.created_at), fmt_time(r.updated_at), r.owner or "-",
        )
    return table


# -- history ---------------------------------------------------------------------------------


def event_json(store: Store, event: HistoryEvent) -> dict[str, Any]:
    out: dict[str, Any] = {
        "seq": event.seq,
        "event": event.event.value,
        "at": event.at,
        "epoch": event.epoch,
        "worker": event.worker,
    }
    if event.position is not None:
        out.update(position=event.position, kind=event.step_kind, name=event.name, attempt=event.attempt,
                   started_at=event.started_at)
    if event.payload is not None:
        decoded = decode(store, event.payload)
        out["result"] = decoded.value
        if decoded.error is not None:
            out["result_error"] = decoded.error
    if event.detail is not None:
        out["detail"] = event.detail
    return out


def event_detail(store: Store, event: HistoryEvent, width: int = 70) -> str:
    """The human part of an event line: what happened, briefly."""
    parts: list[str] = []
    if event.position is not None:
        if event.attempt and event.attempt > 1:
            parts.append(f"attempt {event.attempt}")
        if event.started_at is not None:
            parts.append(fmt_seconds(max(0.0, event.at - event.started_at)))
    if event.worker:
        parts.append(event.worker)
    text = ", ".join(parts)
    if event.event is EventType.STEP_COMPLETED and event.payload is not None:
        text += f" → {show_decoded(decode(store, event.payload), width)}"
    elif event.detail:
        error = event.detail.get("error")
        summary = (f"{error.get('type', 'Error')}: {error.get('message', '')}"
                   if isinstance(error, dict) else compact(event.detail))
        text += f" {preview(summary, width)}" if text else preview(summary, width)
    return text


def event_line(store: Store, event: HistoryEvent) -> Text:
    where = f"#{event.position} {event.name}" if event.position is not None else ""
    style = "red" if event.event in (EventType.STEP_FAILED, EventType.RUN_FAILED, EventType.LEASE_LOST,
                                     EventType.RUN_QUARANTINED) else None
    line = Text()
    line.append(f"{event.seq:>5}  ", style="dim")
    line.append(f"{fmt_time(event.at)}  ")
    line.append(f"{event.event.value:<17}", style=style or "bold")
    line.append(f" {where:<24}" if where else f" {'':<24}")
    line.append(f" {event_detail(store, event)}")
    return line


@dataclass(frozen=True, slots=True)
class JournalRow:
    position: int
    kind: str
    name: str
    attempt: int
    duration: float | None
    status: str
    worker: str | None
    outcome: str


def journal_rows(store: Store, history: list[HistoryEvent]) -> list[JournalRow]:
    """Each attempt recorded in the journal, in history order."""
    rows = []
    for event in history:
        if event.event not in JOURNAL_EVENTS or event.position is None:
            continue
        duration = event.at - event.started_at if event.started_at is not None else None
        if event.event is EventType.STEP_COMPLETED:
            outcome = show_decoded(decode(store, event.payload), 48)
        else:
            error = (event.detail or {}).get("error", {})
            outcome = preview(f"{error.get('type', 'Error')}: {error.get('message', '')}", 48)
        rows.append(JournalRow(event.position, event.step_kind or "?", event.name or "?",
                               event.attempt or 1, duration, _JOURNAL_STATUS[event.event], event.worker,
                               outcome))
    return rows


def journal_table(rows: list[JournalRow]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for name, justify in (("pos", "right"), ("kind", "left"), ("name", "left"), ("try", "right"),
                          ("duration", "right"), ("status", "left"), ("worker", "left"),
                          ("result", "left")):
        table.add_column(name, justify=justify, no_wrap=name != "result")  # type: ignore[arg-type]
    styles = {"completed": "green", "failed": "red", "retried": "yellow"}
    for row in rows:
        table.add_row(
            str(row.position), row.kind, row.name, str(row.attempt),
            fmt_seconds(row.duration) if row.duration is not None else "-",
            Text(row.status, style=styles[row.status]), row.worker or "-", row.outcome,
        )
    return table


def first_at(history: list[HistoryEvent], *kinds: EventType) -> float | None:
    return next((e.at for e in history if e.event in kinds), None)


def print_run(console: Console, store: Store, record: RunRecord, history: list[HistoryEvent]) -> None:
    """``cairn show``: the run's record, its journal and how it ended."""
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("run", Text(record.run_id, style="bold"))
    head.add_row("status", status_text(record.status))
    head.add_row("workflow", f"{record.workflow} (version {record.workflow_version})")
    head.add_row("tenant", record.tenant)
    head.add_row("thread", record.thread_id or "-")
    if record.parent_run_id:
        head.add_row("parent", record.parent_run_id)
    head.add_row("queue", f"{record.queue} (priority {record.priority})")
    started = first_at(history, EventType.RUN_STARTED)
    ended = first_at(history, EventType.RUN_COMPLETED, EventType.RUN_FAILED, EventType.RUN_CANCELLED,
                     EventType.RUN_QUARANTINED) if record.status.terminal else None
    head.add_row("created", fmt_time(record.created_at))
    head.add_row("started", fmt_time(started))
    if ended is not None:
        head.add_row("ended", f"{fmt_time(ended)}  ({fmt_seconds(ended - record.created_at)} after creation)")
    head.add_row("updated", fmt_time(record.updated_at))
    lease = f", lease until {fmt_time(record.lease_expires_at)}" if record.status is RunStatus.RUNNING else ""
    head.add_row("owner", f"{record.owner or '-'}{lease}")
    head.add_row("epoch", f"{record.epoch}   recoveries {record.recoveries}")
    if record.status is RunStatus.SUSPENDED:
        waiting = f"child {record.waiting_on}" if record.waiting_on else f"timer due {fmt_time(record.wake_at)}"
        head.add_row("waiting", waiting)
    head.add_row("input", show_decoded(decode(store, record.input), 100))
    console.print(head)
    rows = journal_rows(store, history)
    console.print()
    console.print(Text(f"journal ({len(rows)} entries)", style="bold"))
    if rows:
        console.print(journal_table(rows))
    console.print()
    if record.status is RunStatus.COMPLETED:
        result = decode(store, record.result)
        body = f"<{result.error}>" if result.error else json.dumps(result.value, indent=2, ensure_ascii=False)
        console.print(Text("result", style="bold green"))
        console.print(body, markup=False, highlight=False)
    elif record.error is not None:
        console.print(Text(f"{record.status.value}: ", style="bold red") +
                      Text(f"{record.error.get('type', 'Error')}: {record.error.get('message', '')}"))


def show_json(store: Store, record: RunRecord, history: list[HistoryEvent]) -> dict[str, Any]:
    """``cairn show --json``: everything ``print_run`` shows, machine-readable."""
    out = run_json(record)
    out["input"] = decode(store, record.input).value
    result = decode(store, record.result) if record.status is RunStatus.COMPLETED else Decoded()
    out["result"] = result.value
    out["journal"] = [
        {"position": r.position, "kind": r.kind, "name": r.name, "attempt": r.attempt,
         "duration_ms": round(r.duration * 1000, 3) if r.duration is not None else None,
         "status": r.status, "worker": r.worker}
        for r in journal_rows(store, history)
    ]
    return out
