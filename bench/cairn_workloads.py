"""The Cairn workflows the benchmark runs, shared by ``bench.engine`` and its crash child.

The crash child (``python -m bench.cairn_workloads crash-child ...``) runs the
``crashy`` workflow inline under a run id chosen by the parent; the step at
index :data:`CRASH_AT` kills its own process with SIGKILL the first time it
runs (a marker file remembers that it already did). The parent then resumes
the run in its own process; every ``tick`` body that executes appends
``(index, time.perf_counter())`` to :data:`STEP_LOG`, which is how the parent
sees when the first *new* step body started.

This module deliberately avoids ``from __future__ import annotations``: Cairn
reads step and workflow annotations to decode values, so they stay real
objects.
"""

import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import cairn

#: 0-based index of the step that crashes the child: the 50th step.
CRASH_AT = 49
#: Steps in the ``crashy`` workflow.
CRASHY_STEPS = 100
#: Lease the crash child takes on its run. The parent can only take the run
#: over once this has expired (Cairn's fencing), so it is kept short; the
#: parent waits it out *before* timing the resume.
CHILD_LEASE_S = 0.5

#: ``(step index, time.perf_counter())`` for each ``tick`` body executed in this process.
STEP_LOG: list[tuple[int, float]] = []


@dataclass
class CairnWorkloads:
    """A Cairn app with the benchmark's workflows registered on it."""

    app: cairn.App
    chain: cairn.Workflow[int]  # (ctx, n: int): n increments, one step each
    three: cairn.Workflow[int]  # (ctx): three increments
    crashy: cairn.Workflow[int]  # (ctx, n: int, marker: str): n ticks; SIGKILL at CRASH_AT once
    reads: cairn.Workflow[int]  # (ctx, n: int): n calls of a trivial effect="read" tool
    writes: cairn.Workflow[int]  # (ctx, n: int): n calls of a trivial effect="write" tool (fsync barrier)

    def close(self) -> None:
        self.app.close()


def build(db_path: Path, durability: str = "process", lease_seconds: float | None = None) -> CairnWorkloads:
    """A fresh ``cairn.App`` on the SQLite file ``db_path`` with the benchmark workflows."""
    return build_url(f"sqlite:///{db_path}", durability, lease_seconds)


def build_url(url: str, durability: str = "process", lease_seconds: float | None = None) -> CairnWorkloads:
    """A ``cairn.App`` on the database ``url`` (SQLite or PostgreSQL) with the benchmark workflows."""
    if lease_seconds is None:
        app = cairn.App(db=url, durability=durability)
    else:
        app = cairn.App(db=url, durability=durability, lease_seconds=lease_seconds)

    @app.step()
    def inc(x: int) -> int:
        return x + 1

    @app.workflow(name="chain")
    def chain(ctx: cairn.Context, n: int) -> int:
        x = 0
        for _ in range(n):
            x = inc(x)
        return x

    @app.workflow(name="three")
    def three(ctx: cairn.Context) -> int:
        return inc(inc(inc(0)))

    @app.step()
    def tick(i: int, marker: str) -> int:
        STEP_LOG.append((i, time.perf_counter()))
        if i == CRASH_AT and not os.path.exists(marker):
            Path(marker).touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return i

    @app.workflow(name="crashy")
    def crashy(ctx: cairn.Context, n: int, marker: str) -> int:
        total = 0
        for i in range(n):
            total += tick(i, marker)
        return total

    @app.tool(effect="read")
    def peek(x: int) -> int:
        return x + 1

    @app.tool(effect="write")
    def poke(op: cairn.Operation, x: int) -> int:
        return x + 1

    @app.workflow(name="reads")
    def reads(ctx: cairn.Context, n: int) -> int:
        x = 0
        for _ in range(n):
            x = peek(x)
        return x

    @app.workflow(name="writes")
    def writes(ctx: cairn.Context, n: int) -> int:
        x = 0
        for _ in range(n):
            x = poke(x)
        return x

    return CairnWorkloads(app=app, chain=chain, three=three, crashy=crashy, reads=reads, writes=writes)


def crash_child(db_path: Path, marker: Path, run_id: str, steps: int) -> int:
    """Run ``crashy`` inline as ``run_id``; expected never to return (SIGKILL at step CRASH_AT + 1)."""
    workloads = build(db_path, durability="process", lease_seconds=CHILD_LEASE_S)
    try:
        workloads.app.run(workloads.crashy, steps, str(marker), run_id=run_id)
    finally:
        workloads.close()
    print("crash child: the run completed without crashing", file=sys.stderr)
    return 3


def main(argv: list[str]) -> int:
    if len(argv) == 5 and argv[0] == "crash-child":
        return crash_child(Path(argv[1]), Path(argv[2]), argv[3], int(argv[4]))
    print("usage: python -m bench.cairn_workloads crash-child DB MARKER RUN_ID STEPS", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
