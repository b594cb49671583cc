"""A worker stand-in for tests/sandbox/test_pool.py: a process holding a
warm pool with a sandbox ready for each workspace given, then idle (until
it is SIGKILLed)."""

from __future__ import annotations

import sys
import time

from cairn.sandbox.pool import Pool


def main() -> None:
    pool = Pool(size=len(sys.argv) - 1, refill=False)
    for workspace in sys.argv[1:]:
        pool.prepare(workspace)
    print(f"ready {pool.ready()} {pool.last_failure}", flush=True)
    time.sleep(300)


if __name__ == "__main__":
    main()
