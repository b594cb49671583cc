"""Run one cairn worker over ``tests.workspace.wsapps`` until SIGTERM (or SIGKILL).

``python -m tests.workspace.ws_worker --worker-id X --lease S`` with
``CAIRN_TEST_DB`` and ``CAIRN_WORKSPACES`` in its environment.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from tests.workspace.wsapps import DB_ENV, build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--lease", type=float, default=1.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(created).6f pid={os.getpid()} %(name)s %(levelname)s %(message)s")
    app = build(os.environ[DB_ENV], os.environ["CAIRN_WORKSPACES"], lease_seconds=args.lease)
    app.worker(concurrency=1, worker_id=args.worker_id, poll_interval=0.02).run()
    app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
