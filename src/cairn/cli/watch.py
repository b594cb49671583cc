"""``cairn watch RUN``: a run's live timeline in the terminal, with a progress
line (status, steps, tool calls, tokens, cost, elapsed) kept at the bottom.

It follows the run's history through ``App`` (the same entries the HTTP
stream sends): the status is read before each page of entries, so once the
status is terminal one more page holds every entry there will ever be, and
it waits between pages for the store's notification where there is one,
else a backoff of 50 ms doubling to 0.5 s.
"""

from __future__ import annotations

import threading
import time

import click
from rich.live import Live
from rich.text import Text

from cairn.api import views
from cairn.api.app import App
from cairn.engine.journal import Journal
from cairn.store.records import EventType, HistoryEvent, RunRecord

from . import render
from .loading import open_session
from .options import app_option, db_from_context, db_option, stdout_console


def progress(record: RunRecord, history: list[HistoryEvent], now: float) -> Text:
    steps = sum(1 for e in history if e.event is EventType.STEP_COMPLETED)
    usage = Journal(history).usage
    end = record.updated_at if record.status.terminal else now
    text = Text()
    text.append("▶ ", style="bold")
    text.append(record.status.value, style=render.status_text(record.status).style)
    text.append(f"  {steps} steps done · {usage.tool_calls} tool calls · {usage.tokens} tokens · "
                f"cost {usage.cost:g} · {render.fmt_seconds(max(end - record.created_at, 0.0))}"
                f" · {len(history)} entries")
    return text


def _follow(app: App, run_id: str, live: Live | None, console_print: object) -> RunRecord:
    woken = threading.Event()
    stop = app.listen_for_changes(woken.set)
    history: list[HistoryEvent] = []
    delay = 0.05
    try:
        while True:
            record = app.get_run(run_id)
            batch = app.history(run_id, history[-1].seq if history else 0)
            history.extend(batch)
            models = views.model_calls(app.runtime.payloads, history) if any(
                e.step_kind == "model" for e in batch) else {}
            for event in batch:
                line = render.event_line(app.runtime.payloads, event, models)
                if live is not None:
                    live.console.print(line, soft_wrap=True)
                else:
                    assert callable(console_print)
                    console_print(line)
            if live is not None:
                live.update(progress(record, history, time.time()))
            if record.status.terminal and not batch:
                return record
            if batch:
                delay = 0.05
                continue
            woken.wait(delay)
            woken.clear()
            delay = min(delay * 2, 0.5)
    finally:
        if stop is not None:
            stop()


@click.command()
@click.argument("run_id", metavar="RUN")
@app_option(required=False)
@db_option
@click.pass_context
def watch(ctx: click.Context, run_id: str, app_spec: str | None, db: str | None) -> None:
    """Follow a run live: its timeline as it happens and a progress line,
    until it ends (Ctrl-C stops watching; the run goes on)."""
    console = stdout_console()
    with open_session(db_from_context(ctx, db), app_spec, read_only=True) as session:
        app = session.app
        record = app.get_run(run_id)
        try:
            if console.is_terminal:
                with Live(progress(record, [], time.time()), console=console, refresh_per_second=4,
                          transient=False) as live:
                    _follow(app, run_id, live, None)
            else:
                record = _follow(app, run_id, None, lambda line: console.print(line, soft_wrap=True))
                history = app.history(run_id)
                console.print(progress(record, history, time.time()), soft_wrap=True)
        except KeyboardInterrupt:
            ctx.exit(130)
