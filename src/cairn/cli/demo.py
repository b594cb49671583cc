"""``cairn demo``: kill a worker mid-run and prove nothing finished ran twice.

The demo is an experiment with a verdict, not a slideshow. It starts one run
of the offline research agent (``cairn.demo.agent``), executes it in a real
worker *process*, SIGKILLs that process once about 40% of the steps are
journaled (no cleanup, no drain: the same as a crashed machine), starts a
second worker process, and then compares the run's journal with the effects
log the steps wrote to. The verdict holds when every completed step left
exactly one effect, except at most the one step that was executing when the
kill landed: that step had started acting but not yet been recorded, so it
runs again. That is the at-least-once window every step boundary has; steps
that must not repeat pass ``cairn.step_info().operation_id`` on as an
idempotency key.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

import cairn
from cairn.store import sqlite_path
from cairn.store.records import EventType, HistoryEvent, RunStatus

from . import render
from .loading import load_app

APP_SPEC = "cairn.demo.agent:app"
#: The demo workers' lease. A SIGKILLed worker cannot give its runs back, so
#: another worker may only take over once the lease runs out. Production
#: leases are long (30 s by default) so that a GC pause or a slow disk never
#: looks like a death; the demo shortens it to keep the takeover watchable.
DEMO_LEASE = 2.0
KILL_FRACTION = 0.4
#: A demo that cannot finish reports it and exits rather than hang. It takes
#: about 10 s on a quiet machine; the bound is generous because a loaded one
#: (a busy CI box, two cores shared) starts the second worker's interpreter
#: slowly, and that is no failure of the run.
DEADLINE = 90.0
POLL = 0.05


# -- the verdict ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JournalStep:
    """One settled journal position and the worker that recorded it."""

    position: int
    kind: str
    name: str
    worker: str | None


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    message: str
    #: the position that ran twice because it was in flight at the kill, if any
    repeated: int | None = None
    executions: dict[int, list[str]] = field(default_factory=dict)


def judge(
    steps: list[JournalStep],
    effects: list[dict[str, Any]],
    workers_by_pid: dict[int, str],
    killed_pid: int | None,
    run_status: RunStatus,
) -> Verdict:
    """Compare the journal with the effects log (pure, so it can be tested).

    Holds when the run completed, every completed step (``kind == "step"``;
    clock, uuid and timer entries touch nothing outside) left exactly one
    effect, no effect exists for a position the journal never settled, and
    at most one position ran twice: first on the killed worker, then once
    more elsewhere.
    """
    executions: dict[int, list[str]] = {}
    pids: dict[int, list[int]] = {}
    for effect in sorted(effects, key=lambda e: float(e.get("at", 0))):
        position, pid = int(effect["position"]), int(effect["pid"])
        executions.setdefault(position, []).append(workers_by_pid.get(pid, f"pid {pid}"))
        pids.setdefault(position, []).append(pid)
    problems: list[str] = []
    if run_status is not RunStatus.COMPLETED:
        problems.append(f"the run ended {run_status.value}, not completed")
    effectful = {s.position: s for s in steps if s.kind == "step"}
    for position, step in sorted(effectful.items()):
        if not executions.get(position):
            problems.append(f"#{position} {step.name} is journaled but left no effect")
    for position in sorted(set(executions) - set(effectful)):
        problems.append(f"an effect at #{position} has no completed journal entry")
    repeated = [p for p in effectful if len(executions.get(p, [])) > 1]
    allowed: int | None = None
    if len(repeated) == 1:
        position = repeated[0]
        ran = pids[position]
        if len(ran) == 2 and killed_pid is not None and ran[0] == killed_pid and ran[1] != killed_pid:
            allowed = position
    for position in repeated:
        if position != allowed:
            step = effectful[position]
            problems.append(f"#{position} {step.name} ran {len(executions[position])} times "
                            f"({', '.join(executions[position])})")
    count = len(effectful)
    if problems:
        return Verdict(False, "FAILED: " + "; ".join(problems), allowed, executions)
    if allowed is not None:
        step = effectful[allowed]
        first, second = executions[allowed]
        message = (f"OK: each of the {count} tool/model steps ran exactly once, except #{allowed} "
                   f"{step.name}, which was in flight when {first} was killed and ran again on {second}")
    else:
        message = (f"OK: each of the {count} tool/model steps ran exactly once "
                   "(no step was in flight at the kill)")
    return Verdict(True, message, allowed, executions)


def journal_steps(history: list[HistoryEvent]) -> list[JournalStep]:
    return [
        JournalStep(e.position, e.step_kind or "?", e.name or "?", e.worker)
        for e in history
        if e.event is EventType.STEP_COMPLETED and e.position is not None
    ]


# -- worker processes -------------------------------------------------------------------------


class WorkerProcess:
    """A ``cairn worker`` subprocess with its output going to a log file (so it
    does not interleave with the live display)."""

    def __init__(self, name: str, db_url: str, log_path: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log_path = log_path
        self.killed = False
        self._log: IO[bytes] = log_path.open("wb")
        command = [sys.executable, "-m", "cairn", "worker", "--app", APP_SPEC, "--db", db_url,
                   "--worker-id", name, "--lease", f"{DEMO_LEASE:g}", "--poll", f"{POLL:g}"]
        # A new session: a Ctrl-C in the terminal reaches only the demo, which
        # then stops its workers itself, in order.
        self.proc = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no drain, no lease release, nothing the worker can react to."""
        self.killed = True
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM (drain) and wait; SIGKILL if it does not exit in time."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


# -- the run ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DemoPaths:
    db_file: Path
    db_url: str
    effects: Path
    reports: Path

    @classmethod
    def choose(cls, db: str | None) -> DemoPaths:
        if db is None:
            directory = Path(".cairn").resolve()
            directory.mkdir(parents=True, exist_ok=True)
            stamp = time.strftime("%Y%m%d-%H%M%S")
            file = directory / f"demo-{stamp}.db"
            n = 2
            while file.exists():
                file = directory / f"demo-{stamp}-{n}.db"
                n += 1
        else:
            found = sqlite_path(db)
            if found is None:
                raise click.UsageError(f"the demo needs a SQLite database file that its worker processes can "
                                       f"share, not {db!r}")
            file = found.resolve()
        configured = os.environ.get("CAIRN_DEMO_EFFECTS")
        effects = Path(configured).resolve() if configured else file.with_name(file.stem + ".effects.jsonl")
        return cls(file, f"sqlite:///{file}", effects, file.with_name(file.stem + "-reports"))

    def log(self, worker: str) -> Path:
        return self.db_file.with_name(f"{self.db_file.stem}.{worker}.log")


def _worker_env(paths: DemoPaths) -> dict[str, str]:
    env = dict(os.environ)
    env["CAIRN_DB"] = paths.db_url
    env["CAIRN_DEMO_EFFECTS"] = str(paths.effects)
    # Make `python -m cairn` find this very copy of the package, installed or not.
    package_root = str(Path(cairn.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    return env


def _narrate(event: HistoryEvent, console: Console, killed_at: float | None) -> None:
    """One line per interesting history entry, as it happens."""
    kind = event.event
    if kind is EventType.STEP_COMPLETED:
        took = render.fmt_seconds(event.at - event.started_at) if event.started_at is not None else ""
        label = event.name if event.step_kind == "step" else f"ctx.{event.step_kind}()"
        console.print(f"  [green]✓[/] #{event.position:<2} {label:<14} {took:>7}  [dim]{event.worker}[/]")
    elif kind is EventType.RUN_SUSPENDED:
        wake = (event.detail or {}).get("wake_at")
        wait = f" for {max(0.0, wake - event.at):.1f} s" if isinstance(wake, float) else ""
        console.print(f"  [blue]⏸[/] run suspended on a durable timer{wait}: no worker holds it meanwhile")
    elif kind is EventType.RUN_WOKEN:
        console.print(f"  [blue]▶[/] timer due: {event.worker} claimed the run again")
    elif kind is EventType.LEASE_TAKEN_OVER:
        source = (event.detail or {}).get("from_worker")
        after = f" {event.at - killed_at:.1f} s after the kill" if killed_at is not None else ""
        console.print(f"  [yellow]⚑[/] {event.worker} took the run over from {source}{after} "
                      f"(lease expired; epoch is now {event.epoch}, fencing out the old holder)")
    elif kind is EventType.RUN_STARTED:
        console.print(f"  [cyan]▶[/] {event.worker} claimed the run")
    elif kind in (EventType.RUN_FAILED, EventType.RUN_QUARANTINED, EventType.RUN_CANCELLED):
        console.print(f"  [red]✗ {kind.value}[/] {render.preview(event.detail or {}, 100)}")


class _Demo:
    def __init__(self, console: Console, paths: DemoPaths, budget: int) -> None:
        self.console = console
        self.paths = paths
        self.budget = budget
        self.workers: list[WorkerProcess] = []
        self.env = _worker_env(paths)
        self.killed_at: float | None = None

    def spawn(self, name: str) -> WorkerProcess:
        worker = WorkerProcess(name, self.paths.db_url, self.paths.log(name), self.env)
        self.workers.append(worker)
        return worker

    def cleanup(self) -> None:
        for worker in self.workers:
            worker.stop()

    def run(self) -> int:
        paths = self.paths
        os.environ["CAIRN_DEMO_EFFECTS"] = str(paths.effects)
        loaded = load_app(APP_SPEC, paths.db_url)
        try:
            return self._run(loaded.app)
        finally:
            loaded.close()

    def _run(self, app: cairn.App) -> int:
        from cairn.demo import agent

        console, paths = self.console, self.paths
        total = agent.expected_steps(agent.QUESTION, self.budget)
        kill_at = max(1, math.floor(total * KILL_FRACTION))
        handle: cairn.RunHandle[Any] = app.start(agent.WORKFLOW, agent.QUESTION, max_steps=self.budget,
                                                 out_dir=str(paths.reports))
        run_id = handle.run_id
        console.print(Text("Cairn demo: an agent run, a worker killed mid-step, a second worker that "
                           "finishes the job", style="bold"))
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column()
        grid.add_row("database", str(paths.db_file))
        grid.add_row("run", f"{run_id} ({agent.WORKFLOW}, {total} journal steps)")
        grid.add_row("question", agent.QUESTION)
        grid.add_row("effects", f"{paths.effects}  (each tool/model call appends a line: the outside world)")
        grid.add_row("plan", f"SIGKILL demo-worker-1 after {kill_at} of {total} steps, "
                             "then start demo-worker-2")
        console.print(grid)
        console.print()

        started = time.monotonic()
        first = self.spawn("demo-worker-1")
        second: WorkerProcess | None = None
        completed: set[int] = set()
        last_seq = 0
        progress = Progress(SpinnerColumn(), TextColumn("{task.description:<34}"), BarColumn(),
                            MofNCompleteColumn(), TimeElapsedColumn(), console=console)
        with progress:
            task = progress.add_task("demo-worker-1 executing", total=total)
            while True:
                record = app.get_run(run_id)
                for event in app.history(run_id, last_seq):
                    last_seq = event.seq
                    _narrate(event, progress.console, self.killed_at)
                    if event.event is EventType.STEP_COMPLETED and event.position is not None:
                        completed.add(event.position)
                        if second is not None:
                            progress.update(task, description=f"{second.name} executing")
                progress.update(task, completed=len(completed))
                if record.status.terminal:
                    break
                if second is None and len(completed) >= kill_at:
                    second = self._kill_and_replace(first, run_id, completed, progress.console)
                    progress.update(task, description="waiting for the lease to expire")
                for worker in self.workers:
                    if not worker.alive() and not worker.killed:
                        console.print(f"[red]error:[/] {worker.name} exited with code "
                                      f"{worker.proc.returncode}; see {worker.log_path}")
                        return 1
                if time.monotonic() - started > DEADLINE:
                    console.print(f"[red]error:[/] the run did not finish within {DEADLINE:g} s "
                                  f"(it is {record.status.value}); worker logs: {paths.log('demo-worker-1')}")
                    return 1
                time.sleep(POLL)
        elapsed = time.monotonic() - started
        self.cleanup()  # drain demo-worker-2 now, so the summary is final
        return self._summarize(app, run_id, first, elapsed)

    def _kill_and_replace(
        self, first: WorkerProcess, run_id: str, completed: set[int], console: Console
    ) -> WorkerProcess:
        first.kill()
        self.killed_at = time.time()
        from cairn.demo import agent

        effects = agent.read_effects(self.paths.effects, run_id)
        in_flight = sorted({int(e["position"]) for e in effects
                            if e["pid"] == first.pid and int(e["position"]) not in completed})
        names = {int(e["position"]): str(e["step"]) for e in effects}
        flight = ", ".join(f"#{p} {names[p]}" for p in in_flight)
        flight = (f"in flight: [bold]{flight}[/] (started, not yet recorded)" if flight
                  else "nothing was in flight (killed between steps)")
        console.print()
        console.print(f"[bold red]✗ SIGKILL[/] demo-worker-1 (pid {first.pid}) after {len(completed)} "
                      f"journaled steps; {flight}.")
        console.print(f"  Its lease still names it the owner. Both demo workers run with "
                      f"--lease {DEMO_LEASE:g}, so it runs out within {DEMO_LEASE:g} s "
                      "(the default, 30 s, rides out GC pauses and slow disks).")
        second = self.spawn("demo-worker-2")
        console.print(f"[bold]→[/] started demo-worker-2 (pid {second.pid}); it takes over once the lease "
                      "expires and replays the journal instead of redoing the work.")
        console.print()
        return second

    def _summarize(self, app: cairn.App, run_id: str, first: WorkerProcess, elapsed: float) -> int:
        from cairn.demo import agent

        console = self.console
        record = app.get_run(run_id)
        history = app.history(run_id)
        steps = journal_steps(history)
        effects = agent.read_effects(self.paths.effects, run_id)
        by_pid = {w.pid: w.name for w in self.workers}
        verdict = judge(steps, effects, by_pid, first.pid if first.killed else None, record.status)

        console.print()
        table = Table(title="journal vs. effects log", title_justify="left", header_style="bold",
                      pad_edge=False)
        table.add_column("pos", justify="right")
        table.add_column("step")
        table.add_column("recorded by")
        table.add_column("executions (from the effects log)")
        for step in steps:
            label = step.name if step.kind == "step" else f"ctx.{step.kind}()"
            ran = verdict.executions.get(step.position, [])
            if step.kind != "step":
                runs = Text("journal only (no side effect)", style="dim")
            elif step.position == verdict.repeated:
                runs = Text(f"{len(ran)}: {ran[0]} (killed mid-step), {ran[1]}", style="yellow")
            else:
                counts = Counter(ran)
                runs = Text(", ".join(f"{n} x {w}" if n > 1 else w for w, n in counts.items()),
                            style="green" if len(ran) == 1 else "red")
            table.add_row(str(step.position), label, step.worker or "-", runs)
        console.print(table)
        console.print()

        result = app.handle(run_id).result() if record.status is RunStatus.COMPLETED else None
        report = result.get("report") if isinstance(result, dict) else None
        console.print(f"run {run_id} [bold]{record.status.value}[/] in {elapsed:.1f} s "
                      f"(epoch {record.epoch}, recoveries {record.recoveries})")
        if report:
            console.print(f"report: {report}")
        style = "bold green" if verdict.ok else "bold red"
        console.print(Text("verdict: ", style=style) + Text(verdict.message, style=style), soft_wrap=True)
        console.print(f"inspect: cairn show {run_id} --db {self.paths.db_url}", soft_wrap=True, markup=False)
        console.print(f"         cairn events {run_id} --db {self.paths.db_url}", soft_wrap=True,
                      markup=False)
        return 0 if verdict.ok and record.status is RunStatus.COMPLETED else 1


def _exit_on(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def run_demo(db: str | None, budget: int, console: Console) -> int:
    """Run the demo; the exit code is 0 only if the run completed and the verdict holds."""
    paths = DemoPaths.choose(db)
    demo = _Demo(console, paths, budget)
    # The workers run in their own sessions, so nothing else stops them: turn
    # SIGTERM and SIGHUP into an exception so the cleanup below always runs.
    previous = {sig: signal.signal(sig, _exit_on) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return demo.run()
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping the demo workers[/]")
        return 130
    finally:
        demo.cleanup()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
