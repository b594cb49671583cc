"""The worker process of ``test_no_busy_sleeps``: ``python -m tests.pins.busy_worker DB``
drains every run of ``three`` with 4 slots and a 10 ms poll, then exits."""

from __future__ import annotations

import sys

import cairn


def build(db: str) -> cairn.App:
    app = cairn.App(db=db)

    @app.step()
    def inc(x: int) -> int:
        return x + 1

    @app.workflow(name="three")
    def three(ctx: cairn.Context) -> int:
        return inc(inc(inc(0)))

    return app


if __name__ == "__main__":
    worker_app = build(sys.argv[1])
    worker_app.worker(concurrency=4, poll_interval=0.01).run(install_signals=False, max_idle=0.5)
    worker_app.close()
