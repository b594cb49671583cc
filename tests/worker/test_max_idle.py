"""``Worker.run(max_idle=...)`` stops only once there is nothing to do, even
when the last execution ends during a claim pass.

A child's end readies its parent. The loop used to claim, find nothing (the
child still running), then see no execution active (the child had just
ended) and stop: the parent stayed ready and unclaimed. The tests' ``drain``
and every ``run(max_idle=...)`` before ``result(timeout=5)`` depend on it; a
claim pass slow under load is that window, widened here on purpose."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import cairn
from cairn.store.records import Claim
from cairn.worker.worker import Worker


def test_a_run_readied_during_the_last_claim_pass_is_still_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app = cairn.App(f"sqlite:///{tmp_path / 'cairn.db'}")
    claim = Worker._claim

    def slow_claim(self: Worker) -> list[Claim]:
        claims = claim(self)
        if not claims and not self._idle():  # the child runs: it ends during this (slow) pass
            time.sleep(0.4)
        return claims

    monkeypatch.setattr(Worker, "_claim", slow_claim)

    @app.step()
    def work() -> int:
        time.sleep(0.6)  # longer than max_idle since its claim
        return 1

    @app.workflow(name="child")
    def child(ctx: cairn.Context) -> int:
        return work()

    @app.workflow(name="parent")
    def parent(ctx: cairn.Context) -> int:
        return ctx.child(child) + 1

    try:
        handle = app.start(parent)
        app.worker(concurrency=2, poll_interval=0.01).run(install_signals=False, max_idle=0.3)
        assert handle.result(timeout=5) == 2, "the worker stopped with the parent ready and unclaimed"
    finally:
        app.close()
