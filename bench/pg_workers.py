"""Worker processes for the PostgreSQL scaling benchmark, and their parent-side handling.

Child side (``python -m bench.pg_workers cairn|dbos --url URL ...``): build
the app, connect, then print ``BENCH ready`` and wait on stdin. ``go``
starts the work (a Cairn worker starts claiming; a DBOS worker is already
polling its queue, which the parent opens by raising the queue's
``worker_concurrency`` from 0). ``stop``, or end of file on stdin (the parent
is gone), makes the child stop and exit: a Cairn worker drains, DBOS is
destroyed. The child also asks Linux to SIGKILL it if its parent dies
(``PR_SET_PDEATHSIG``), so no worker outlives a killed benchmark.

Parent side: :func:`worker_processes` spawns the children, waits until each
is ready, and on every way out of the block (success, exception, Ctrl-C)
stops them, waits for them, and kills those that do not exit in time.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any

from bench.common import REPO_ROOT

READY = "BENCH ready"
DONE = "BENCH done "
_PR_SET_PDEATHSIG = 1


# -- child side ------------------------------------------------------------------


def _die_with_parent() -> None:
    """Linux: get SIGKILL when the parent process exits, however it exits."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _next_command() -> str:
    """The next line on stdin, stripped; ``""`` at end of file."""
    return sys.stdin.readline().strip()


def cairn_child(url: str, concurrency: int, poll: float, worker_id: str) -> int:
    from bench.cairn_workloads import build_url

    w = build_url(url)
    try:
        worker = w.app.worker(concurrency=concurrency, worker_id=worker_id, poll_interval=poll)
        _say(READY)
        if _next_command() != "go":
            return 0

        def watch_stdin() -> None:
            _next_command()  # "stop" or end of file: either way, stop
            worker.stop()

        threading.Thread(target=watch_stdin, name="bench-stdin", daemon=True).start()
        worker.run(install_signals=True)
        _say(DONE + json.dumps({"claimed": worker.claimed}))
    finally:
        w.close()
    return 0


def _queue_thread_running(name: str) -> bool:
    return any(t.name == f"queue-worker-{name}" and t.is_alive() for t in threading.enumerate())


def dbos_child(url: str, executor_id: str, pool_size: int) -> int:
    from bench.pg_baselines import DBOS_QUEUE, dbos_session, register_dbos_workloads

    with dbos_session(url, executor_id=executor_id, pool_size=pool_size) as dbos:
        register_dbos_workloads(dbos)
        dbos.launch()
        deadline = time.monotonic() + 15.0
        while not _queue_thread_running(DBOS_QUEUE):
            if time.monotonic() > deadline:
                print(f"dbos worker {executor_id}: no thread for queue {DBOS_QUEUE!r}", file=sys.stderr)
                return 2
            time.sleep(0.01)
        _say(READY)
        if _next_command() != "go":
            return 0
        _next_command()  # the queue does the work; wait for "stop" or end of file
        _say(DONE + json.dumps({}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    _die_with_parent()
    parser = argparse.ArgumentParser(prog="python -m bench.pg_workers")
    sub = parser.add_subparsers(dest="system", required=True)
    cairn = sub.add_parser("cairn", help="a Cairn worker")
    cairn.add_argument("--url", required=True)
    cairn.add_argument("--concurrency", type=int, default=8)
    cairn.add_argument("--poll", type=float, default=0.01)
    cairn.add_argument("--worker-id", required=True)
    dbos = sub.add_parser("dbos", help="a DBOS process dequeuing the benchmark queue")
    dbos.add_argument("--url", required=True)
    dbos.add_argument("--executor-id", required=True)
    dbos.add_argument("--pool-size", type=int, default=12)
    args = parser.parse_args(argv)
    if args.system == "cairn":
        return cairn_child(args.url, args.concurrency, args.poll, args.worker_id)
    return dbos_child(args.url, args.executor_id, args.pool_size)


# -- parent side --------------------------------------------------------------------


@dataclass
class Child:
    argv: list[str]
    proc: subprocess.Popen[str]
    stderr: IO[str]
    lines: queue.Queue[str] = field(default_factory=queue.Queue)
    pump: threading.Thread | None = None

    def tail(self, limit: int = 1500) -> str:
        """The end of the child's stderr (for error messages)."""
        with contextlib.suppress(OSError, ValueError):
            self.stderr.flush()
            self.stderr.seek(0)
            return self.stderr.read()[-limit:].strip()
        return ""

    def send(self, command: str) -> None:
        stdin = self.proc.stdin
        if stdin is None or stdin.closed:
            return
        with contextlib.suppress(OSError, ValueError):
            stdin.write(command + "\n")
            stdin.flush()


class WorkerGroup:
    """Children that are all ready; see :func:`worker_processes`."""

    def __init__(self, children: list[Child]) -> None:
        self.children = children

    def go(self) -> None:
        for child in self.children:
            child.send("go")

    def check_alive(self) -> None:
        for child in self.children:
            code = child.proc.poll()
            if code is not None:
                raise RuntimeError(f"worker {child.argv[3:]} exited early ({code}): {child.tail()}")

    def results(self) -> list[dict[str, Any]]:
        """The ``BENCH done`` summaries the children printed (after they stopped)."""
        found: list[dict[str, Any]] = []
        for child in self.children:
            while True:
                try:
                    line = child.lines.get_nowait()
                except queue.Empty:
                    break
                if line.startswith(DONE):
                    found.append(json.loads(line[len(DONE):]))
        return found


def _pump(stream: IO[str], lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))


def _wait_ready(child: Child, deadline: float) -> None:
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError(f"worker {child.argv[3:]} not ready in time: {child.tail()}")
        try:
            line = child.lines.get(timeout=min(left, 0.2))
        except queue.Empty:
            if child.proc.poll() is not None:
                raise RuntimeError(
                    f"worker {child.argv[3:]} exited ({child.proc.returncode}) before it was ready: "
                    f"{child.tail()}"
                ) from None
            continue
        if line == READY:
            return


def _stop(children: Sequence[Child], timeout: float) -> None:
    """Ask every child to stop, wait up to ``timeout`` s in all, then SIGKILL the rest."""
    for child in children:
        child.send("stop")
        with contextlib.suppress(OSError, ValueError):
            if child.proc.stdin is not None:
                child.proc.stdin.close()
    deadline = time.monotonic() + timeout
    for child in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    for child in children:
        if child.proc.poll() is None:
            child.proc.kill()
            child.proc.wait()
        if child.pump is not None:
            child.pump.join(timeout=5.0)  # its last lines (the summary) are queued by now
        child.stderr.close()


@contextmanager
def worker_processes(
    commands: Sequence[Sequence[str]], ready_timeout: float = 60.0, stop_timeout: float = 30.0
) -> Iterator[WorkerGroup]:
    """Spawn ``python -m bench.pg_workers <command>`` for each command; yield
    once every child said it is ready; stop (and if need be kill) all of them
    on the way out, whatever the way out is."""
    children: list[Child] = []
    try:
        for command in commands:
            argv = [sys.executable, "-m", "bench.pg_workers", *command]
            # Closed by _stop, after the child has exited: not a with-block.
            stderr = tempfile.TemporaryFile("w+", prefix="cairn-bench-worker-", encoding="utf-8")  # noqa: SIM115
            try:
                proc = subprocess.Popen(argv, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=stderr, text=True, bufsize=1)
            except BaseException:
                stderr.close()
                raise
            child = Child(argv, proc, stderr)
            children.append(child)
            assert proc.stdout is not None
            child.pump = threading.Thread(target=_pump, args=(proc.stdout, child.lines), daemon=True)
            child.pump.start()
        deadline = time.monotonic() + ready_timeout
        for child in children:
            _wait_ready(child, deadline)
        yield WorkerGroup(children)
    finally:
        _stop(children, stop_timeout)


if __name__ == "__main__":
    sys.exit(main())
