"""Where the time goes on PostgreSQL: round trips and transactions per run.

``python -m bench.postgres --round-trips`` (this module's :func:`run`) counts,
for each system, without timing anything:

* **sends per run**: ``sendto`` system calls of the process executing the
  runs (``strace -f -c`` attached to every thread, only while the runs
  execute). libpq sends each request (a statement, ``BEGIN``, ``COMMIT``)
  in one call and then waits for the answer, so outside pipeline mode a send
  is a round trip. Background threads (DBOS's pollers, lease renewals) count
  too: they are part of what the system costs.
* **receives per run**: successful ``recvfrom`` calls in the same window
  (``EAGAIN`` not counted). A client reads once per answer it waited for,
  so this counts round trips in pipeline mode too, where several requests
  (``BEGIN``, statements, ``COMMIT``, sync) are sent one ``sendto`` each
  but answered together.
* **transactions per run**: ``xact_commit`` of the sample's database in
  ``pg_stat_database``, with ``K`` runs minus with none (every backend has
  exited, so its statistics are flushed). Each autocommit statement is a
  transaction; read-only ones count too, but only writing ones wait for a WAL
  flush.

Inline mode runs in a child process (``python -m bench.pg_trace child ...``)
so strace can attach to it; worker mode attaches to one worker process of
``bench.pg_workers`` draining pre-started runs.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import psycopg

from bench import pgdb
from bench.common import REPO_ROOT, render_table
from bench.pg_workers import READY, _die_with_parent, _next_command, _say, worker_processes

SYSTEMS = ("cairn", "langgraph", "dbos")
ATTEMPTS = 3


# -- child: run K workloads inline, between "go" and "done" -------------------------


def _inline(system: str, url: str) -> tuple[Any, Any, Any]:
    """(three-step runner, chain runner, closer) for ``system`` on ``url``."""
    if system == "cairn":
        from bench.cairn_workloads import build_url

        w = build_url(url)
        return (lambda: w.app.run(w.three)), (lambda n: w.app.run(w.chain, n)), w.close
    if system == "langgraph":
        from langgraph.checkpoint.postgres import PostgresSaver

        from bench.pg_baselines import _chain_graph, _three_graph

        manager = PostgresSaver.from_conn_string(url)
        saver = manager.__enter__()
        saver.setup()
        three = _three_graph().compile(checkpointer=saver)
        counter = iter(range(10**9))

        def chain(n: int) -> Any:
            graph = _chain_graph(n).compile(checkpointer=saver)
            config: Any = {"configurable": {"thread_id": f"chain-{next(counter)}"}, "recursion_limit": n + 10}
            return graph.invoke({"count": 0}, config)

        def run_three() -> Any:
            return three.invoke({"count": 0}, {"configurable": {"thread_id": f"run-{next(counter)}"}})

        return run_three, chain, (lambda: manager.__exit__(None, None, None))
    from bench.pg_baselines import dbos_session, register_dbos_workloads

    session = dbos_session(url)
    dbos = session.__enter__()
    wl = register_dbos_workloads(dbos)
    dbos.launch()
    return wl.three, wl.chain, (lambda: session.__exit__(None, None, None))


def child(system: str, kind: str, url: str, count: int) -> int:
    _die_with_parent()
    three, chain, close = _inline(system, url)
    try:
        three() if kind == "runs" else chain(1)  # warm-up: connections open, statements prepared
        _say(READY)
        if _next_command() != "go":
            return 0
        if kind == "runs":
            for _ in range(count):
                three()
        elif count:
            chain(count)
        _say("BENCH done")
        _next_command()
    finally:
        close()
    return 0


# -- parent ----------------------------------------------------------------------------


def _traced(pid: int, tid: int) -> bool:
    """Whether thread ``tid`` of ``pid`` has a tracer attached (or is gone)."""
    try:
        status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    except OSError:
        return True
    return any(line.startswith("TracerPid:") and line.split()[1] != "0" for line in status.splitlines())


class Tracer:
    """``strace -f -c -e trace=sendto,recvfrom`` attached to every thread of ``pid``."""

    def __init__(self, pid: int) -> None:
        self.out = Path(tempfile.mkstemp(prefix="cairn-bench-strace-")[1])
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
        argv = ["strace", "-f", "-c", "-e", "trace=sendto,recvfrom", "-o", str(self.out)]
        for tid in tids:
            argv += ["-p", str(tid)]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not all(_traced(pid, tid) for tid in tids):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"strace could not attach to process {pid}")
            time.sleep(0.01)

    def stop(self) -> tuple[int, int]:
        """Detach; the ``sendto`` calls and the successful ``recvfrom`` calls seen."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        try:
            calls = {"sendto": 0, "recvfrom": 0}
            for line in self.out.read_text().splitlines():
                parts = line.split()
                if parts and parts[-1] in calls:
                    # % time, seconds, usecs/call, calls, [errors,] syscall
                    errors = int(parts[4]) if len(parts) == 6 else 0
                    calls[parts[-1]] = int(parts[3]) - errors
            return calls["sendto"], calls["recvfrom"]
        finally:
            self.out.unlink(missing_ok=True)


def _xact_commit(dbname: str) -> int:
    time.sleep(0.3)  # exited backends flush their statistics on the way out
    with psycopg.connect(pgdb.admin_url(), autocommit=True) as conn:
        query = "SELECT xact_commit FROM pg_stat_database WHERE datname = %s"
        row = conn.execute(query, (dbname,)).fetchone()
    return int(row[0]) if row else 0


def _inline_child(system: str, kind: str, count: int, trace: bool) -> tuple[tuple[int, int] | None, int]:
    """Run one traced (or untraced) child; ((sendto, recvfrom) calls during the window, xact_commit
    at the end)."""
    name = pgdb.create_database(f"trace_{system}")
    try:
        url = pgdb.url_for(name)
        argv = [sys.executable, "-m", "bench.pg_trace", "child", system, kind, url, str(count)]
        with tempfile.TemporaryFile("w+") as err:
            proc = subprocess.Popen(argv, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=err, text=True, bufsize=1)
            sends: tuple[int, int] | None = None
            try:
                assert proc.stdout is not None
                assert proc.stdin is not None
                if proc.stdout.readline().strip() != READY:
                    err.seek(0)
                    raise RuntimeError(f"trace child {system} failed: {err.read()[-800:]}")
                tracer = Tracer(proc.pid) if trace else None
                try:
                    proc.stdin.write("go\n")
                    proc.stdin.flush()
                    if proc.stdout.readline().strip() != "BENCH done":
                        err.seek(0)
                        raise RuntimeError(f"trace child {system} failed: {err.read()[-800:]}")
                finally:
                    if tracer is not None:
                        sends = tracer.stop()
                proc.stdin.write("exit\n")
                proc.stdin.close()
                proc.wait(timeout=60)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        return sends, _xact_commit(name)
    finally:
        pgdb.drop_database(name)


@dataclass
class Count:
    what: str
    system: str
    per: str
    sends: float | None
    transactions: float | None
    receives: float | None = None


def inline_counts(system: str, kind: str, count: int) -> Count:
    sends, with_k = _inline_child(system, kind, count, trace=True)
    _, without = _inline_child(system, kind, 0, trace=False)
    per = "run" if kind == "runs" else "step"
    what = "app.run / invoke / call, 3 steps" if kind == "runs" else f"one run of {count} steps"
    if sends is None:
        return Count(what, system, per, None, (with_k - without) / count)
    return Count(what, system, per, sends[0] / count, (with_k - without) / count, sends[1] / count)


def worker_counts(system: str, count: int) -> Count:
    """Sends per run of one worker process draining ``count`` pre-started runs."""
    from bench import postgres as pg
    from bench.pg_baselines import DBOS_QUEUE, dbos_session, register_dbos_workloads

    with pgdb.fresh_database(f"trace_w_{system}") as url:
        if system == "cairn":
            from bench.cairn_workloads import build_url

            w = build_url(url)
            try:
                for _ in range(count):
                    w.app.start(w.three)
                command = ["cairn", "--url", url, "--concurrency", "8", "--poll", "0.01", "--worker-id", "t0"]
                with worker_processes([command]) as group, psycopg.connect(url, autocommit=True) as conn:
                    tracer = Tracer(group.children[0].proc.pid)
                    try:
                        group.go()
                        pg._wait_until_done(conn, pg._CAIRN_PROGRESS, (), count, group.check_alive, 300)
                    finally:
                        sends = tracer.stop()
            finally:
                w.close()
        else:
            with dbos_session(url, listen=[]) as dbos:
                wl = register_dbos_workloads(dbos)
                dbos.launch()
                queue = dbos.register_queue(DBOS_QUEUE, worker_concurrency=0, polling_interval_sec=0.01)
                for _ in range(count):
                    queue.enqueue(wl.three)
                command = ["dbos", "--url", url, "--executor-id", "t0", "--pool-size", "12"]
                with worker_processes([command]) as group, psycopg.connect(url, autocommit=True) as conn:
                    tracer = Tracer(group.children[0].proc.pid)
                    try:
                        queue.set_worker_concurrency(8)
                        group.go()
                        pg._wait_until_done(conn, pg._DBOS_PROGRESS, (DBOS_QUEUE,), count,
                                            group.check_alive, 300)
                    finally:
                        sends = tracer.stop()
    what = "worker process (concurrency 8, poll 0.01 s), 3 steps"
    return Count(what, system, "run", sends[0] / count, None, sends[1] / count)


def run(quick: bool = False) -> int:
    if shutil.which("strace") is None:
        print("bench: --round-trips needs strace (apt-get install strace)", file=sys.stderr)
        return 2
    runs, steps, drained = (20, 50, 100) if quick else (100, 300, 500)
    jobs: list[tuple[str, Callable[[], Count]]] = []
    for system in SYSTEMS:
        for kind, n in (("runs", runs), ("chain", steps)):
            jobs.append((f"{system} {kind}", partial(inline_counts, system, kind, n)))
    for system in ("cairn", "dbos"):
        jobs.append((f"{system} workers", partial(worker_counts, system, drained)))
    counts: list[Count] = []
    for label, job in jobs:
        for attempt in range(1, ATTEMPTS + 1):  # the shared server may be restarted under us
            try:
                counts.append(job())
                break
            except Exception as exc:  # one system failing must not hide the others
                print(f"bench: {label} (attempt {attempt}): {type(exc).__name__}: {exc}", file=sys.stderr)
                time.sleep(2.0)
                pgdb.wait_for_server()
    rows = [
        [c.what, c.system, c.per, "—" if c.sends is None else f"{c.sends:.1f}",
         "—" if c.receives is None else f"{c.receives:.1f}",
         "—" if c.transactions is None else f"{c.transactions:.1f}"]
        for c in counts
    ]
    print("Client sends, receives (answers waited for) and transactions per run or step, PostgreSQL")
    print(render_table(["workload", "system", "per", "sends", "receives", "transactions"], rows,
                       [False, False, False, True, True, True]))
    return 0


def main(argv: Sequence[str]) -> int:
    if len(argv) == 5 and argv[0] == "child":
        return child(argv[1], argv[2], argv[3], int(argv[4]))
    print("usage: python -m bench.pg_trace child SYSTEM runs|chain URL COUNT", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
