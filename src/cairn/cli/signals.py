"""``cairn signal`` and ``cairn wait``: talk to a running agent from a shell.

``cairn signal RUN NAME --data JSON`` puts a signal into the run's mailbox
(through the operator, which records who sent it); ``cairn wait RUN`` blocks
until the run finishes or suspends, showing a live progress line, and says
how it ended in its exit code, so scripts can chain the two:

====  ==========================================================
code  the run
====  ==========================================================
0     completed (its result is printed as JSON on stdout)
1, 2  an error of the command itself (unknown run, bad option)
10    failed, quarantined or halted
11    cancelled or killed
20    suspended: waiting for a signal, a timer, a child or a budget
21    needs attention: an operator must settle an uncertain effect
124   ``--timeout`` passed while it was still pending or running
====  ==========================================================
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click
import msgspec

from cairn.api.app import App
from cairn.api.ledger import decode
from cairn.codec import values
from cairn.errors import RunNotFound
from cairn.store.records import HistoryEvent, RunRecord, RunStatus

from . import render
from .loading import open_session
from .options import app_option, db_from_context, db_option, stderr_console
from .terminal import clean, echo, echo_json, json_text

#: ``cairn wait`` exit codes (see the module docstring).
EXIT_COMPLETED = 0
EXIT_FAILED = 10
EXIT_CANCELLED = 11
EXIT_SUSPENDED = 20
EXIT_NEEDS_ATTENTION = 21
EXIT_TIMEOUT = 124

_EXIT_BY_STATUS = {
    RunStatus.COMPLETED: EXIT_COMPLETED,
    RunStatus.FAILED: EXIT_FAILED,
    RunStatus.QUARANTINED: EXIT_FAILED,
    RunStatus.HALTED: EXIT_FAILED,
    RunStatus.CANCELLED: EXIT_CANCELLED,
    RunStatus.KILLED: EXIT_CANCELLED,
    RunStatus.SUSPENDED: EXIT_SUSPENDED,
    RunStatus.NEEDS_ATTENTION: EXIT_NEEDS_ATTENTION,
}


def parse_json_option(text: str | None, option: str) -> Any:
    """A JSON option's value: JSON text, ``@PATH`` for a file's contents, or
    ``-`` for standard input; NaN and Infinity are refused (JSON has no such
    numbers and the journal could not record them)."""
    if text is None:
        return None
    source = option
    if text == "-":
        text, source = sys.stdin.read(), "standard input"
    elif text.startswith("@"):
        path = text[1:]
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise click.BadParameter(f"cannot read {path!r}: {reason}", param_hint=f"'{option}'") from None
        source = repr(path)
    try:
        return json.loads(text, parse_constant=_no_constant)
    except (json.JSONDecodeError, ValueError) as exc:
        raise click.BadParameter(f"{source} is not valid JSON: {exc}", param_hint=f"'{option}'") from None
    except RecursionError:
        raise click.BadParameter(f"{source} is nested too deeply", param_hint=f"'{option}'") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


@click.command("signal")
@click.argument("run_id", metavar="RUN")
@click.argument("name")
@click.option("--data", "data_json", metavar="JSON",
              help="The signal's data as JSON; @PATH reads it from a file, - from standard input. "
                   "Default: null.")
@click.option("--dedupe", default=None, metavar="KEY",
              help="Idempotency key: a second send with the same key delivers nothing more.")
@app_option(required=False)
@db_option
@click.pass_context
def signal(ctx: click.Context, run_id: str, name: str, data_json: str | None, dedupe: str | None,
           app_spec: str | None, db: str | None) -> None:
    """Send signal NAME to run RUN: kept in its mailbox until the run's
    ctx.wait_for_signal(NAME) takes it; a run waiting for it resumes at once
    on any worker. Refused for a finished or unknown run. The data is checked
    against the type the run expects when the run receives it."""
    data = parse_json_option(data_json, "--data")
    with open_session(db_from_context(ctx, db), app_spec) as session:
        sent = session.operator.signal(run_id, name, data, dedupe=dedupe)
    message = sent.delivery
    if sent.created:
        echo(f"sent signal {name!r} to run {run_id} (message {message.seq})")
    else:
        echo(f"signal {name!r} with key {dedupe!r} was sent to run {run_id} already (message {message.seq}); "
             "nothing more was sent")


@click.command("wait")
@click.argument("run_id", metavar="RUN")
@click.option("--timeout", type=click.FloatRange(min=0), default=None,
              help="Give up after S seconds (exit 124).")
@click.option("--finished", is_flag=True,
              help="Wait through suspensions until the run is finished (or needs an operator).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object saying how it ended.")
@app_option(required=False)
@db_option
@click.pass_context
def wait(ctx: click.Context, run_id: str, timeout: float | None, finished: bool, as_json: bool,
         app_spec: str | None, db: str | None) -> None:
    """Block until run RUN finishes or suspends, with a live progress line.

    Exit code: 0 completed (result as JSON on stdout), 10 failed, quarantined
    or halted, 11 cancelled or killed, 20 suspended (what it waits for is
    printed), 21 needs attention, 124 --timeout passed.
    """
    with open_session(db_from_context(ctx, db), app_spec, read_only=True) as session:
        app = session.app
        record = app.get_run(run_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        progress = _Progress(app, run_id)
        console = stderr_console()
        try:
            with console.status(progress.line(record)) as status:
                delay = 0.02
                while not _settled(app, record, finished):
                    if deadline is not None and time.monotonic() >= deadline:
                        break
                    left = delay if deadline is None else deadline - time.monotonic()
                    time.sleep(max(0.0, min(delay, left)))
                    delay = min(delay * 1.5, 0.25)
                    record = app.get_run(run_id)
                    status.update(progress.line(record))
        except KeyboardInterrupt:
            ctx.exit(130)
        settled = _settled(app, record, finished)
        code = _EXIT_BY_STATUS.get(record.status, EXIT_TIMEOUT) if settled else EXIT_TIMEOUT
        suspended = record.status is RunStatus.SUSPENDED
        waiting = render.waiting_text(record, progress.history) if suspended else None
        if as_json:
            out: dict[str, Any] = {"run_id": run_id, "status": record.status.value, "exit_code": code,
                                   "waiting": waiting, "error": record.error, "result": None}
            if record.status is RunStatus.COMPLETED:
                out["result"] = decode(session.codec, record.result).value
            echo_json(out)
        elif record.status is RunStatus.COMPLETED:
            result = decode(session.codec, record.result)
            body = values.encode(result.value) if result.error is None else values.encode(None)
            click.echo(json_text(msgspec.json.format(body, indent=2).decode()))
        elif not settled:
            echo(f"run {run_id} is still {record.status.value} after {timeout:g}s", err=True)
        elif waiting is not None:
            echo(f"run {run_id} is suspended, waiting for {waiting}", err=True)
        elif record.status is RunStatus.NEEDS_ATTENTION:
            echo(f"run {run_id} needs attention: see 'cairn ops {run_id}'", err=True)
        else:
            error = record.error or {}
            detail = f": {error.get('type', 'Error')}: {error.get('message', '')}" if error else ""
            echo(f"run {run_id} {record.status.value}{detail}", err=True)
    ctx.exit(code)


def _settled(app: App, record: RunRecord, finished: bool) -> bool:
    """Whether ``cairn wait`` is done with the run as ``record`` shows it."""
    status = record.status
    if status.terminal or status is RunStatus.NEEDS_ATTENTION:
        return True
    if status is not RunStatus.SUSPENDED or finished:
        return False
    # A suspended run that is due to run again (a signal in its mailbox, a
    # timer passed, a child ended) has not suspended for us: it is about to
    # be claimed.
    if record.waiting_for is not None:
        if any(m.taken_at is None for m in app.operator.mailbox(record.run_id, record.waiting_for)):
            return False
    elif record.waiting_on is not None:
        try:
            if app.get_run(record.waiting_on).status.terminal:
                return False
        except RunNotFound:
            return False
    return record.wake_at is None or record.wake_at > time.time()


class _Progress:
    """The live line: status, journal entries so far, the latest one."""

    def __init__(self, app: App, run_id: str) -> None:
        self.app = app
        self.run_id = run_id
        self.history: list[HistoryEvent] = []

    def line(self, record: RunRecord) -> str:
        last = self.history[-1].seq if self.history else 0
        self.history.extend(self.app.history(self.run_id, last))
        steps = [e for e in self.history if e.position is not None and e.step_kind is not None]
        latest = f", latest: {steps[-1].step_kind} {steps[-1].name!r}" if steps else ""
        suspended = record.status is RunStatus.SUSPENDED
        what = f" (waiting for {render.waiting_text(record, self.history)})" if suspended else ""
        entries = f"{len(steps)} journal entr{'y' if len(steps) == 1 else 'ies'}"
        return clean(f"run {self.run_id}: {record.status.value}{what}, {entries}{latest}", newlines=False)
