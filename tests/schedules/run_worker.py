"""Run one cairn worker over ``tests.schedules.sched_app`` until SIGTERM.

Launched by the schedule crash tests as ``python -m tests.schedules.run_worker
--worker-id X`` from the repository root, with ``CAIRN_TEST_DB`` in its
environment; logs go to stderr (a file per worker process).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from tests.schedules.sched_app import build_app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker-id", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(created).6f pid={os.getpid()} %(name)s %(levelname)s %(message)s")
    app = build_app()
    worker = app.worker(concurrency=2, worker_id=args.worker_id, poll_interval=0.05)
    logging.getLogger("run_worker").info("worker %s starting", args.worker_id)
    worker.run()
    app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
