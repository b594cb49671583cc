"""Run one cairn worker over ``tests.acceptance.txn_apps`` until SIGTERM (the
transactional-step crash tests; options as ``tests.acceptance.run_worker``)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from tests.acceptance.txn_apps import build_app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--lease", type=float, default=1.0)
    parser.add_argument("--poll-interval", type=float, default=0.02)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(created).6f pid={os.getpid()} %(name)s %(levelname)s %(message)s")
    app = build_app(lease_seconds=args.lease)
    app.worker(concurrency=1, worker_id=args.worker_id, poll_interval=args.poll_interval).run()
    app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
