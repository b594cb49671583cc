"""``python -m tests.bundles.run_worker --worker-id ID DEPLOYMENT``: a worker
process serving one deployment of ``tests.bundles.apps`` on ``$CAIRN_DB``."""

from __future__ import annotations

import logging
import sys

from tests.bundles.apps import APP_MODULES


def main() -> None:
    args = sys.argv[1:]
    worker_id = args[args.index("--worker-id") + 1]
    deployment = args[-1]
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = APP_MODULES[deployment](None)
    try:
        app.worker(worker_id=worker_id, concurrency=4, poll_interval=0.05, lease_seconds=1.0).run()
    finally:
        app.close()


if __name__ == "__main__":
    main()
