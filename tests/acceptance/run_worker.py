"""Run one cairn worker over ``tests.acceptance.apps`` until SIGTERM.

Launched by the harness as ``python -m tests.acceptance.run_worker --worker-id X
--concurrency N --lease S`` from the repository root, with ``CAIRN_TEST_DB``
and ``CAIRN_TEST_EFFECTS`` in its environment. Logs go to stderr (the
harness sends them to a file per worker process).
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys

from tests.acceptance.apps import build_app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--lease", type=float, default=1.0)
    parser.add_argument("--poll-interval", type=float, default=0.02)
    parser.add_argument("--max-recoveries", type=int, default=50)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr,
        format=f"%(created).6f pid={os.getpid()} %(name)s %(levelname)s %(message)s",
    )
    # SIGUSR1 writes every thread's stack to the log: the harness asks for it when a worker
    # does not exit in time (``WorkerProcess.wait_exit``), so the failure says where it was
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    app = build_app(lease_seconds=args.lease, max_recoveries=args.max_recoveries)
    worker = app.worker(concurrency=args.concurrency, worker_id=args.worker_id,
                        poll_interval=args.poll_interval)
    logging.getLogger("run_worker").info("worker %s starting", args.worker_id)
    worker.run()
    logging.getLogger("run_worker").info("worker %s drained; exiting", args.worker_id)
    app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
