"""Fixtures for engine tests: a real SQLite-backed App per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import cairn


@pytest.fixture
def app(tmp_path: Path) -> Iterator[cairn.App]:
    application = cairn.App(db=f"sqlite:///{tmp_path}/cairn.db", lease_seconds=5.0)
    yield application
    application.close()


class Calls:
    """Counts how often each step body really ran (the 'outside world')."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def hit(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1

    def __getitem__(self, name: str) -> int:
        return self.counts.get(name, 0)


@pytest.fixture
def calls() -> Calls:
    return Calls()


def execute_once(app: cairn.App, run_id: str) -> str:
    """Claim ``run_id`` and execute it once, like one worker pass; returns the
    outcome's status (``suspended``, ``completed``, ...)."""
    from cairn.engine.executor import execute

    claim = app.store.claim_run(run_id, "test-worker", 5.0, 5)
    assert claim is not None, f"run {run_id} is not claimable"
    return execute(app.runtime, claim, "test-worker").status
