"""Fixtures for the approval tests: a real App per test on SQLite and on
PostgreSQL (as ``tests/engine``), and one pass of a worker over a run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import cairn
from tests.engine.conftest import BACKENDS, postgres_url


@pytest.fixture(params=BACKENDS)
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[cairn.App]:
    if request.param == "postgres":
        url = postgres_url(request.getfixturevalue("pg_url"))
    else:
        url = f"sqlite:///{tmp_path}/cairn.db"
    application = cairn.App(db=url, lease_seconds=5.0)
    yield application
    application.close()


def one_pass(app: cairn.App, run_id: str) -> str:
    """Claim ``run_id`` and execute it once, as one worker pass would; the
    outcome's status (``suspended``, ``completed``, ``failed``)."""
    from cairn.engine.executor import execute

    claim = app.store.claim_run(run_id, "test-worker", 5.0, 5)
    assert claim is not None, f"run {run_id} is not claimable"
    return execute(app.runtime, claim, "test-worker").status
