"""A worker process for the chaos tests: ``cairn worker`` plus ``--max-recoveries``.

``python -m tests.payments.run_worker --app MODULE:ATTR --db URL --worker-id X
--lease S --max-recoveries N`` from the repository root. The chaos test kills
workers more than 50 times; with the default limit (5) the run would be
quarantined after the fifth takeover, which is the right default in production
and the wrong one for a test that kills on purpose.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--app", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--lease", type=float, default=1.0)
    parser.add_argument("--poll", type=float, default=0.02)
    parser.add_argument("--max-recoveries", type=int, default=1000)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(created).6f pid={os.getpid()} %(name)s %(levelname)s %(message)s")
    os.environ["CAIRN_DB"] = args.db  # before the import: the module builds its App from it
    module_name, _, attr = args.app.partition(":")
    app = getattr(importlib.import_module(module_name), attr)
    app.lease_seconds = args.lease
    app.runtime.max_recoveries = args.max_recoveries
    worker = app.worker(concurrency=1, worker_id=args.worker_id, poll_interval=args.poll)
    logging.getLogger("run_worker").info("worker %s starting", args.worker_id)
    worker.run()
    app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
