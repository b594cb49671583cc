"""A retention controller pass in a child process, for the SIGKILL test:
``python -m tests.retention.controller_child URL OFFSET`` runs one pass,
one unit per batch, on the store of ``URL`` whose clock reads the wall
clock plus ``OFFSET`` seconds (the test's data is aged by a fake clock);
``$CAIRN_FAULTS`` kills it midway."""

from __future__ import annotations

import sys
import time

import cairn
from cairn.worker.retention import Controller

if __name__ == "__main__":
    app = cairn.App(db=sys.argv[1])
    offset = float(sys.argv[2])
    app.store.clock = lambda: time.time() + offset
    done = Controller(app.store, "child", lease_seconds=30.0, batch=1).run()
    print("pass complete:", None if done is None else {c.value: len(k) for c, k in done.units.items()})
    app.close()
