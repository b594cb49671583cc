"""Graph tests: a real App per test on every backend (ids ``[sqlite]`` and
``[postgres]``), as the engine tests have (``tests/engine/conftest.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import cairn
from tests.engine.conftest import postgres_url

BACKENDS = ("sqlite", "postgres")


@pytest.fixture(params=BACKENDS)
def app(request: pytest.FixtureRequest) -> Iterator[cairn.App]:
    if request.param == "postgres":
        url = postgres_url(request.getfixturevalue("pg_url"))
        application = cairn.App(db=url, lease_seconds=5.0)
    else:
        application = cairn.App(db=request.getfixturevalue("sqlite_url"), lease_seconds=5.0)
    yield application
    application.close()
