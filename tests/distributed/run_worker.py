"""Run one cairn worker over ``tests.distributed.bank_app`` until SIGTERM.

Launched by ``tests.distributed.cluster`` as ``python -m
tests.distributed.run_worker --worker-id X ...`` from the repository root,
with the store URL in ``$CAIRN_DIST_DB`` (PostgreSQL for this tier; the
fencing test runs it on SQLite too) (and the bank's URL and the
effects file, see ``bank_app``). ``--application-name`` tags this process's
database connections so a test can find (and cut) exactly them in
``pg_stat_activity``. Logs go to stderr (the harness sends them to a file),
including one ``outcome run=... epoch=... status=...`` line per ended claim.

Like a process supervisor, it waits for the database when it cannot open it
or run the worker's start-up (``reclaim_owned``) because the server is down
or restarting: a worker spawned during a PostgreSQL restart starts once the
server is back instead of exiting. Once running, the worker itself rides out
outages (that is what the tests check); this only covers start-up.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from types import FrameType

import cairn
from cairn.engine.executor import Outcome
from cairn.errors import StoreError
from cairn.store.records import Claim
from cairn.worker.worker import Worker
from tests.backends import with_query
from tests.distributed.bank_app import APP_NAME_ENV, DB_ENV, WORKER_ENV, build_app

#: how long start-up waits for an unreachable database before giving up
STARTUP_PATIENCE = 60.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--poll-interval", type=float, default=0.02)
    parser.add_argument("--max-recoveries", type=int, default=1000)
    parser.add_argument("--application-name", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr,
        format=f"%(created).6f pid={os.getpid()} %(name)s %(levelname)s %(message)s",
    )
    # SIGUSR1 writes every thread's stack to the log: the harness asks for it when a worker
    # does not exit in time (``WorkerProcess.wait_exit``), so the failure says where it was
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    log = logging.getLogger("run_worker")
    # SIGTERM before the worker installs its own handler (while this process imports, opens the
    # store or waits for the database) asks for the same drain, instead of killing the process
    stopping = threading.Event()
    worker: Worker | None = None

    def on_term(signum: int, frame: FrameType | None) -> None:
        stopping.set()
        if worker is not None:
            worker.stop()

    signal.signal(signal.SIGTERM, on_term)
    # the harness waits for this before any SIGTERM; the CPU time it took to get here (interpreter,
    # imports) against the wall time tells a test how slow the machine is (``tests.timing.slowness``)
    log.info("worker %s launching (cpu %.3fs)", args.worker_id, time.process_time())
    os.environ[WORKER_ENV] = args.worker_id
    url = os.environ[DB_ENV]
    if args.application_name:
        url = with_query(url, application_name=args.application_name)
        os.environ[APP_NAME_ENV] = args.application_name
    deadline = time.monotonic() + STARTUP_PATIENCE
    app: cairn.App | None = None
    while app is None and not stopping.is_set():
        try:
            app = build_app(url, lease_seconds=args.lease, max_recoveries=args.max_recoveries)
        except StoreError as exc:
            if time.monotonic() > deadline:
                raise
            log.warning("start-up: cannot open the database (%s); trying again", exc)
            time.sleep(0.25)

    def report(claim: Claim, outcome: Outcome) -> None:
        # parsed by tests.distributed.cluster.outcomes: which lease ended how, and when
        log.info("outcome run=%s epoch=%d status=%s", claim.run.run_id, claim.run.epoch, outcome.status)

    if app is not None:
        worker = app.worker(concurrency=args.concurrency, worker_id=args.worker_id,
                            poll_interval=args.poll_interval, on_outcome=report)
    if app is None or worker is None or stopping.is_set():
        log.info("worker %s asked to stop before it started; exiting", args.worker_id)
        if app is not None:
            app.close()
        return 0
    log.info("worker %s starting", args.worker_id)
    while True:
        try:
            worker.run()
            break
        except StoreError as exc:  # only start-up (reclaim_owned) raises: claims are retried inside
            if time.monotonic() > deadline or worker.claimed:
                raise
            log.warning("start-up: worker %s could not reclaim its runs (%s); trying again",
                        args.worker_id, exc)
            time.sleep(0.25)
    log.info("worker %s drained; exiting", args.worker_id)
    app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
