"""Turning runs, history entries and operations into tables, lines and JSON.

Payloads are read through the payload codec (so a codec stage such as
encryption at rest applies here too) and decoded as plain JSON, never into
user types: the inspection commands must work without the workflow code and
must not trust stored bytes with anything but a JSON parser
(``cairn.api.ledger.decode``). Tool calls are shown from the ledger's
typed views; nothing here classifies history itself.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from cairn.api.ledger import Decoded, OperationView, decode
from cairn.api.views import ModelCalls, attention, journal_status, model_calls, result_of
from cairn.codec.payloads import PayloadCodec
from cairn.engine.journal import Journal
from cairn.graph.travel import lineage_of
from cairn.store.lifecycle import wait_label
from cairn.store.records import JOURNAL_EVENTS, EventType, HistoryEvent, RunRecord, RunStatus

from .terminal import clean

STATUS_STYLE = {
    RunStatus.PENDING: "yellow",
    RunStatus.RUNNING: "cyan",
    RunStatus.SUSPENDED: "blue",
    RunStatus.COMPLETED: "green",
    RunStatus.FAILED: "red",
    RunStatus.CANCELLED: "magenta",
    RunStatus.QUARANTINED: "bold red",
    RunStatus.NEEDS_ATTENTION: "bold black on yellow",
    RunStatus.KILLED: "bold magenta",
    RunStatus.HALTED: "bold white on red",
    RunStatus.INCOMPATIBLE: "bold black on yellow",
}

#: History entries shown in red, and those that call for an operator.
_BAD_EVENTS = frozenset({EventType.STEP_FAILED, EventType.RUN_FAILED, EventType.LEASE_LOST,
                         EventType.RUN_QUARANTINED, EventType.RUN_HALTED, EventType.RUN_KILLED})
_ATTENTION_EVENTS = frozenset({EventType.RUN_NEEDS_ATTENTION, EventType.OP_INTENT, EventType.OP_RECONCILED,
                               EventType.OP_RESOLVED})
#: History entries that end a run (for its "ended" time).
_END_EVENTS = (EventType.RUN_COMPLETED, EventType.RUN_FAILED, EventType.RUN_CANCELLED,
               EventType.RUN_QUARANTINED, EventType.RUN_KILLED, EventType.RUN_HALTED)

def line(text: str) -> str:
    """User text for one line: control characters, newlines included, escaped
    (a newline in a tenant name must not forge a row of ``cairn runs``)."""
    return clean(text, newlines=False)


def fmt_time(ts: float | None) -> str:
    """Local wall-clock time with milliseconds; ``-`` when unset."""
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) + f".{int(ts % 1 * 1000):03d}"


def fmt_seconds(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True, default=str)


def fmt_number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


_LIMIT_NAMES = {"tokens": "tokens", "cost": "cost", "tool_calls": "tool calls",
                "wall_seconds": "wall seconds"}


def fmt_budget(budget: dict[str, Any] | None) -> str:
    """``tokens 5000, cost 1.5``; ``unlimited`` for no limits."""
    if not budget:
        return "unlimited"
    keys = [*(k for k in _LIMIT_NAMES if k in budget), *(k for k in budget if k not in _LIMIT_NAMES)]
    return ", ".join(f"{_LIMIT_NAMES.get(k, k)} {fmt_number(budget[k])}" for k in keys
                     if budget[k] is not None)


def preview(value: Any, width: int = 60) -> str:
    """One short line standing for a value, cut with an ellipsis."""
    text = value if isinstance(value, str) else compact(value)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def show_decoded(decoded: Decoded, width: int = 60) -> str:
    return f"<{decoded.error}>" if decoded.error is not None else preview(decoded.value, width)


# -- runs --------------------------------------------------------------------------------------


def status_text(status: RunStatus) -> Text:
    return Text(status.value, style=STATUS_STYLE.get(status, "bold"))


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
            line(r.run_id), line(f"{r.workflow} v{r.workflow_version}"), status_text(r.status),
            line(r.tenant),
            fmt_time(r.created_at), fmt_time(r.updated_at), line(r.owner or "-"),
        )
    return table


def _runs_width(records: list[RunRecord]) -> int:
    """Columns ``runs_table`` needs to show every cell on one line."""
    widest = [max(len(text) for text in column) for column in zip(
        *((line(r.run_id), line(f"{r.workflow} v{r.workflow_version}"), r.status.value, line(r.tenant),
           line(r.owner or "-"))
          for r in records), strict=True)]
    headers = (6, 8, 6, 6, 5)
    return sum(max(w, h) for w, h in zip(widest, headers, strict=True)) + 2 * 23 + 2 * 6


def runs_lines(records: list[RunRecord]) -> list[tuple[Text, Text]]:
    """The runs for a narrow terminal, two lines each: the run id (whole, on
    one line, so it can be copied) and its status; then workflow, tenant,
    times and owner (wrapped if need be). A table would cut or fold the id
    and the status to fit."""
    id_width = max(len(line(r.run_id)) for r in records)
    lines = []
    for r in records:
        first = Text(line(r.run_id).ljust(id_width), style="bold")
        first.append("  ")
        first.append_text(status_text(r.status))
        times = f"created {fmt_time(r.created_at)}, updated {fmt_time(r.updated_at)}"
        owner = r.owner or "-"
        rest = Text(line(f"  {r.workflow} v{r.workflow_version}, tenant {r.tenant}, {times}, owner {owner}"),
                    style="dim")
        lines.append((first, rest))
    return lines


def print_runs(console: Console, records: list[RunRecord]) -> None:
    """``cairn runs``: a table when the terminal is wide enough for every
    cell on one line, else two lines per run (never a cut id or status)."""
    if _runs_width(records) <= console.width:
        console.print(runs_table(records))
        return
    for first, rest in runs_lines(records):
        console.print(first, soft_wrap=True)  # never cut: an id longer than the screen runs on
        console.print(rest)


# -- history ---------------------------------------------------------------------------------


def _clock(ts: Any) -> str:
    return fmt_time(ts)[11:] if isinstance(ts, (int, float)) else "?"


def lifecycle_detail(event: HistoryEvent) -> str:
    """The detail of a non-journal entry, said in words where a shape is known."""
    d = event.detail or {}
    kind = event.event
    if kind is EventType.RUN_CREATED:
        return f"{d.get('workflow')} v{d.get('version')}, tenant {d.get('tenant')}" + (
            f", child of {d['parent_run_id']}" if d.get("parent_run_id") else "") + (
            f", {forked.describe()}" if (forked := lineage_of(event)) is not None else "") + (
            f", started as {d['started_role']}" if d.get("started_role") else "") + (
            f" (token {d['started_token']})" if d.get("started_token") else "")
    if kind is EventType.LEASE_CLAIMED:
        return f"lease until {_clock(d.get('lease_until'))}"
    if kind is EventType.LEASE_TAKEN_OVER:
        return f"from {d.get('from_worker')}, lease until {_clock(d.get('lease_until'))}"
    if kind is EventType.LEASE_LOST:
        return f"{d.get('worker')} at epoch {d.get('epoch')} ({d.get('reason')})"
    if kind is EventType.RUN_SUSPENDED:
        if d.get("waiting_on"):
            return f"waiting on child {d['waiting_on']}"
        if d.get("waiting_for"):
            wake = d.get("wake_at")
            until = float(wake) if isinstance(wake, int | float) else None
            return waiting_for_text(str(d["waiting_for"]), until)
        if d.get("reason") == "budget_exceeded":
            return (f"budget exceeded: {_LIMIT_NAMES.get(str(d.get('limit')), d.get('limit'))} used "
                    f"{fmt_number(d.get('used'))} of {fmt_number(d.get('allowed'))} (raise it: cairn budget)")
        if d.get("wake_at") is None:
            return str(d.get("reason", ""))
        return f"{d.get('reason', 'timer')} until {_clock(d.get('wake_at'))}"
    if kind is EventType.RUN_NEEDS_ATTENTION:
        return (f"#{d.get('position')} {d.get('tool')} op {d.get('operation_id')} is uncertain: "
                f"{d.get('why', '')} (see: cairn ops)")
    if kind in (EventType.RUN_CANCELLED, EventType.RUN_KILLED):
        return str(d.get("reason", ""))
    if kind is EventType.RUN_RETRIED:
        return f"from position {d.get('from_position')} (was {d.get('previous_status')})"
    if kind is EventType.RUN_REVIVED:
        return f"was {d.get('previous_status', '?')}"
    if kind is EventType.RUN_REWOUND:
        return (f"to {d.get('to')!r} at position {d.get('from_position')} (rewind {d.get('rewind', '?')}): "
                f"{d.get('reason', '')}")
    if kind is EventType.RUN_BUDGET_CHANGED:
        return f"budget now {fmt_budget(d.get('budget'))}"
    error = d.get("error", d if "message" in d else None)
    if isinstance(error, dict):
        return f"{error.get('type', 'Error')}: {error.get('message', '')}"
    return compact(d) if d else ""


def event_detail(codec: PayloadCodec, event: HistoryEvent, width: int = 70,
                 models: ModelCalls | None = None) -> str:
    """The human part of an event line: what happened, briefly."""
    parts: list[str] = []
    if event.worker:
        parts.append(event.worker)
    if event.position is not None:
        if event.attempt and event.attempt > 1:
            parts.append(f"attempt {event.attempt}")
        if event.started_at is not None:
            parts.append(fmt_seconds(max(0.0, event.at - event.started_at)))
        if event.event is EventType.STEP_COMPLETED:
            value = result_of(codec, event, models or {})
            parts.append(f"→ {_result_text(event.step_kind, value, width)}{settled_by(event)}")
        elif event.event in _OP_TEXT:
            parts.append(preview(op_text(codec, event), width))
        elif event.detail:
            parts.append(preview(_problem(event), width))
    else:
        text = lifecycle_detail(event)
        if text:
            parts.append(preview(text, width))
    return "  ".join(parts)


_OP_TEXT = frozenset({EventType.OP_INTENT, EventType.OP_RECONCILED, EventType.OP_RESOLVED})


def settled_by(event: HistoryEvent) -> str:
    """How a tool result came to be recorded when the tool did not return it."""
    detail = event.detail or {}
    if detail.get("resolved_by") == "operator":
        return " (resolved by an operator)"
    if detail.get("reconciled") == "done":
        return " (reconciled: found applied)"
    return ""


def op_text(codec: PayloadCodec, event: HistoryEvent) -> str:
    """What an ``op.*`` entry says about a side effect."""
    d = event.detail or {}
    if event.event is EventType.OP_INTENT:
        arguments = decode(codec, event.payload)
        return f"{d.get('effect', '?')} op {d.get('operation_id', '?')} args {show_decoded(arguments, 200)}"
    if event.event is EventType.OP_RECONCILED:
        if d.get("outcome") == "not_found":
            return "reconcile: not applied; executing with the same operation id"
        reason = f" ({d['reason']})" if d.get("reason") else ""
        return f"reconcile: {d.get('outcome', '?')}{reason}; asking again at {_clock(d.get('next_at'))}"
    if event.event is EventType.OP_RESOLVED:
        return "operator: not done; executing again with the same operation id"
    return compact(d) if d else ""


def _result_text(kind: str | None, decoded: Decoded, width: int) -> str:
    if kind == "sleep" and isinstance(decoded.value, float):
        return f"until {_clock(decoded.value)}"
    if kind == "context" and isinstance(decoded.value, dict) and "strategy" in decoded.value:
        return compaction_text(decoded.value)
    return show_decoded(decoded, width)


def compaction_text(record: dict[str, Any]) -> str:
    """A compaction (``engine.contextwindow.Compaction``) as one line: what
    it removed and the request's size before and after."""
    def number(key: str) -> int:
        value = record.get(key, 0)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    done = []
    if number("removed"):
        done.append(f"summarized messages {number('first')}-{number('upto') - 1} "
                    f"({number('removed')} removed)")
    if number("trimmed"):
        done.append(f"trimmed {number('trimmed')} tool outputs")
    return (f"compacted: {', '.join(done) or 'nothing'}; {number('tokens_before')} -> "
            f"{number('tokens_after')} tokens ({line(str(record.get('counted_by', '?')))})")


def event_line(codec: PayloadCodec, event: HistoryEvent, models: ModelCalls | None = None) -> Text:
    where = f"#{event.position} {event.name}" if event.position is not None else ""
    style = "bold red" if event.event in _BAD_EVENTS else (
        "bold yellow" if event.event in _ATTENTION_EVENTS else "bold")
    text = Text()
    text.append(f"{event.seq:>5}  ", style="dim")
    text.append(f"{fmt_time(event.at)}  ")
    text.append(f"{event.event.value:<19}", style=style)
    text.append(f" {line(where):<18} ")
    text.append(line(event_detail(codec, event, models=models)))
    return text


def _problem(event: HistoryEvent) -> str:
    detail = event.detail or {}
    error = detail.get("error")
    if isinstance(error, dict):
        return f"{error.get('type', 'Error')}: {error.get('message', '')}"
    return compact(detail) if detail else ""


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


def journal_rows(codec: PayloadCodec, history: list[HistoryEvent]) -> list[JournalRow]:
    """Each attempt recorded in the journal, in history order."""
    models = model_calls(codec, history)
    rows = []
    for event in history:
        if event.event not in JOURNAL_EVENTS or event.position is None:
            continue
        duration = event.at - event.started_at if event.started_at is not None else None
        if event.event is EventType.STEP_COMPLETED:
            outcome = _result_text(event.step_kind, result_of(codec, event, models), 48) + settled_by(event)
        elif event.event in _OP_TEXT:
            outcome = preview(op_text(codec, event), 64)
        else:
            outcome = preview(_problem(event), 48)
        rows.append(JournalRow(event.position, line(event.step_kind or "?"), line(event.name or "?"),
                               event.attempt or 1, duration, journal_status(event),
                               line(event.worker) if event.worker else None, line(outcome)))
    return rows


def journal_table(rows: list[JournalRow]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for name, justify in (("pos", "right"), ("kind", "left"), ("name", "left"), ("try", "right"),
                          ("duration", "right"), ("status", "left"), ("worker", "left"),
                          ("result", "left")):
        table.add_column(name, justify=justify, no_wrap=name != "result")  # type: ignore[arg-type]
    styles = {"completed": "green", "failed": "red", "retried": "yellow", "intent": "blue",
              "reconciled": "yellow", "resolved": "yellow"}
    for row in rows:
        table.add_row(
            str(row.position), row.kind, row.name, str(row.attempt),
            f"{row.duration * 1000:,.0f} ms" if row.duration is not None else "-",
            Text(row.status, style=styles.get(row.status, "")), row.worker or "-", row.outcome,
        )
    return table


def first_at(history: list[HistoryEvent], *kinds: EventType) -> float | None:
    return next((e.at for e in history if e.event in kinds), None)


def last_at(history: list[HistoryEvent], *kinds: EventType) -> float | None:
    return next((e.at for e in reversed(history) if e.event in kinds), None)


def print_run(console: Console, codec: PayloadCodec, record: RunRecord, history: list[HistoryEvent]) -> None:
    """``cairn show``: the run's record, its journal and how it ended."""
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("run", Text(line(record.run_id), style="bold"))
    head.add_row("status", status_text(record.status))
    head.add_row("workflow", line(f"{record.workflow} (version {record.workflow_version})"))
    head.add_row("tenant", line(record.tenant))
    head.add_row("thread", line(record.thread_id or "-"))
    if record.parent_run_id:
        head.add_row("parent", line(record.parent_run_id))
    forked = lineage_of(history[0] if history else None)
    if forked is not None:
        head.add_row("lineage", line(forked.describe()))
    created = (history[0].detail or {}) if history and history[0].event is EventType.RUN_CREATED else {}
    if created.get("started_role"):  # the rights tools restricted by role check (engine.startedwith)
        token = f" (token {created['started_token']})" if created.get("started_token") else ""
        head.add_row("started as", line(f"{created['started_role']}{token}"))
    head.add_row("queue", line(f"{record.queue} (priority {record.priority})"))
    started = first_at(history, EventType.RUN_STARTED)
    ended = last_at(history, *_END_EVENTS) if record.status.terminal else None
    head.add_row("created", fmt_time(record.created_at))
    head.add_row("started", fmt_time(started))
    if ended is not None:
        head.add_row("ended", f"{fmt_time(ended)}  ({fmt_seconds(ended - record.created_at)} after creation)")
    head.add_row("updated", fmt_time(record.updated_at))
    lease = f", lease until {fmt_time(record.lease_expires_at)}" if record.status is RunStatus.RUNNING else ""
    head.add_row("owner", line(f"{record.owner or '-'}{lease}"))
    head.add_row("epoch", f"{record.epoch}   recoveries {record.recoveries}")
    if record.status is RunStatus.SUSPENDED:
        head.add_row("waiting", line(waiting_text(record, history)))
    if record.status is RunStatus.NEEDS_ATTENTION:
        needs = attention(history) or {}
        head.add_row("attention", Text(line(
            f"#{needs.get('position')} {needs.get('tool')} (operation {needs.get('operation_id')}) is "
            f"uncertain: {needs.get('why', '')}; see 'cairn ops {record.run_id}'"), style="bold yellow"))
    if record.budget:
        usage = Journal(history).usage
        head.add_row("budget", f"{fmt_budget(record.budget)}  (used: tokens {usage.tokens}, cost "
                               f"{usage.cost:g}, tool calls {usage.tool_calls})")
    head.add_row("input", show_decoded(decode(codec, record.input), 100))
    console.print(head)
    rows = journal_rows(codec, history)
    console.print()
    console.print(Text(f"journal ({len(rows)} entries)", style="bold"))
    if rows:
        console.print(journal_table(rows))
    console.print()
    if record.status is RunStatus.COMPLETED:
        result = decode(codec, record.result)
        body = f"<{result.error}>" if result.error else json.dumps(result.value, indent=2, ensure_ascii=False)
        console.print(Text("result", style="bold green"))
        console.print(body, markup=False, highlight=False)
    elif record.error is not None:
        console.print(Text(f"{record.status.value}: ", style="bold red") +
                      Text(clean(f"{record.error.get('type', 'Error')}: {record.error.get('message', '')}")))


def waiting_for_text(key: str, until: float | None) -> str:
    """What a suspended run waits for, said in words: ``waiting for signal
    'approve' until 2026-12-01 10:00:00`` (no ``until``: no timeout)."""
    return f"waiting for {delivery_text(key, until)}"


def delivery_text(key: str, until: float | None) -> str:
    """The delivery a run waits for and its timeout: ``signal 'approve'
    until 2026-12-01 10:00:00``, ``approval '...' (no timeout)``."""
    deadline = f" until {fmt_time(until)}" if until is not None else " (no timeout)"
    return f"{wait_label(key)}{deadline}"


def waiting_text(record: RunRecord, history: list[HistoryEvent]) -> str:
    """What a suspended run waits for (``cairn show``, ``cairn wait``)."""
    if record.waiting_on:
        return f"child {record.waiting_on}"
    if record.waiting_for:
        return delivery_text(record.waiting_for, record.wake_at)
    if record.wake_at is not None:
        return f"timer due {fmt_time(record.wake_at)}"
    last = next((e for e in reversed(history) if e.event is EventType.RUN_SUSPENDED), None)
    return lifecycle_detail(last) if last is not None else "-"


# -- operations (side-effecting tool calls) ---------------------------------------------------

OP_STYLE = {"done": "green", "failed": "red", "uncertain": "bold black on yellow", "pending": "yellow"}


def ops_table(ops: list[OperationView]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    # The operation id is what an operator looks up elsewhere: never cut it short.
    table.add_column("pos", justify="right", no_wrap=True)
    table.add_column("tool", overflow="fold")
    table.add_column("status", no_wrap=True, min_width=9)
    table.add_column("operation id", overflow="fold")
    table.add_column("try", justify="right", no_wrap=True, min_width=3)
    for op in ops:
        status = op.status.value
        table.add_row(str(op.position), line(op.tool), Text(status, style=OP_STYLE.get(status, "")),
                      line(op.operation_id), str(op.attempt))
    return table


def arguments_text(op: OperationView) -> str:
    """An operation's recorded arguments as one line of JSON (or why not)."""
    if op.arguments is None:
        return "(no intent recorded)"
    if op.arguments.error is not None:
        return f"<{op.arguments.error}>"
    return json.dumps(op.arguments.value, ensure_ascii=False, sort_keys=True, default=str)
