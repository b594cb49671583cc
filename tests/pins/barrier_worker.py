"""A worker process for the effect-barrier pin (``test_effect_barrier``).

``python -m tests.pins.barrier_worker DB DURABILITY MARKER`` runs a real
``cairn`` worker over one workflow that calls one ``write`` tool; the tool's
first act is ``os.stat(MARKER)``, a syscall that ``strace`` shows, so the
trace says exactly when the tool touched the outside world. The worker
exits once it has been idle for a moment (the test starts the run first).
"""

from __future__ import annotations

import contextlib
import os
import sys

import cairn


def build(db: str, durability: str, marker: str) -> cairn.App:
    app = cairn.App(db=db, durability=durability)

    @app.tool(effect="write", name="pay")
    def pay(amount: int) -> int:
        with contextlib.suppress(FileNotFoundError):
            os.stat(marker)  # the tool call, as strace sees it
        return amount

    @app.workflow(name="barrier")
    def barrier(ctx: cairn.Context, amount: int) -> int:
        return int(pay(amount))

    return app


def main() -> int:
    db, durability, marker = sys.argv[1:4]
    app = build(db, durability, marker)
    app.worker(concurrency=1, worker_id="barrier-worker", poll_interval=0.02).run(max_idle=0.5)
    app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
