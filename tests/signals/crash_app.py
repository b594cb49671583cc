"""Workflows the signals crash tests run in real worker processes.

``build_app`` binds them to the store named by ``$CAIRN_TEST_DB``; every step
body appends one JSON line to ``$CAIRN_TEST_EFFECTS`` (the outside world),
so a test can count how often each really ran. ``python -m
tests.signals.crash_app --worker-id X`` runs a worker over them until
SIGTERM; ``... --send RUN NAME JSON`` sends one signal and exits (a sender
process to kill mid-delivery).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

import cairn
from tests.acceptance.apps import DB_ENV, EFFECTS_ENV, append_effect


def build_app(db: str | None = None, effects: str | None = None, *, lease_seconds: float = 1.0) -> cairn.App:
    app = cairn.App(db=db or os.environ[DB_ENV], lease_seconds=lease_seconds, max_recoveries=50)
    effects_path = effects or os.environ[EFFECTS_ENV]

    @app.step
    def note(label: str) -> str:
        info = cairn.step_info()
        append_effect(effects_path, {"run_id": info.run_id, "position": info.position, "label": label,
                                     "pid": os.getpid()})
        return label

    @app.workflow(name="receiver")
    def receiver(ctx: cairn.Context, timeout: float | None = None) -> dict[str, Any]:
        note("before")
        try:
            data: dict[str, Any] = ctx.wait_for_signal("go", timeout=timeout, type_=dict)
        except cairn.SignalTimeout:
            data = {"timeout": True}
        note("after " + json.dumps(data, sort_keys=True))
        return data

    @app.workflow(name="areceiver")
    async def areceiver(ctx: cairn.Context, timeout: float | None = None) -> dict[str, Any]:
        note("before")  # a sync step from an async workflow: allowed
        try:
            data: dict[str, Any] = await ctx.wait_for_signal_async("go", timeout=timeout, type_=dict)
        except cairn.SignalTimeout:
            data = {"timeout": True}
        note("after " + json.dumps(data, sort_keys=True))
        return data

    @app.workflow(name="pinger")
    def pinger(ctx: cairn.Context, target: str, count: int) -> int:
        for i in range(count):
            ctx.signal(target, "n", i)
            note(f"sent {i}")
        return count

    @app.workflow(name="counter")
    def counter(ctx: cairn.Context, count: int) -> list[int]:
        return [int(ctx.wait_for_signal("n", type_=int)) for _ in range(count)]

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker-id")
    parser.add_argument("--send", nargs=3, metavar=("RUN", "NAME", "JSON"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(created).6f pid={os.getpid()} %(name)s %(levelname)s %(message)s")
    app = build_app()
    if args.send:
        run_id, name, data = args.send
        app.signal(run_id, name, json.loads(data))
        app.close()
        return 0
    worker = app.worker(concurrency=2, worker_id=args.worker_id, poll_interval=0.05)
    worker.run()
    app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
