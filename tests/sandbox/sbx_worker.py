"""Run one cairn worker over ``tests.sandbox.sbxapps`` until SIGTERM (or SIGKILL).

``python -m tests.sandbox.sbx_worker --worker-id X`` with ``CAIRN_TEST_DB``
and ``CAIRN_WORKSPACES`` in its environment.
"""

from __future__ import annotations

import argparse
import os
import sys

from tests.sandbox.sbxapps import DB_ENV, build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker-id", required=True)
    args = parser.parse_args(argv)
    app = build(os.environ[DB_ENV], os.environ["CAIRN_WORKSPACES"])
    app.worker(concurrency=1, worker_id=args.worker_id, poll_interval=0.02).run()
    app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
