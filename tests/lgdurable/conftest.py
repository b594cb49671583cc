"""LangGraph-on-workers tests: a real App per test on every backend (ids
``[sqlite]`` and ``[postgres]``), as the graph tests have."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import cairn
from tests.engine.conftest import postgres_url
from tests.server.conftest import setup  # noqa: F401 (the HTTP tests' fixture: an App, tokens of two tenants)

BACKENDS = ("sqlite", "postgres")


@pytest.fixture(params=BACKENDS)
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[cairn.App]:
    if request.param == "postgres":
        url = postgres_url(request.getfixturevalue("pg_url"))
        application = cairn.App(db=url, lease_seconds=5.0)
    else:
        application = cairn.App(db=f"sqlite:///{tmp_path}/cairn.db", lease_seconds=5.0)
    yield application
    application.close()
