"""Fixtures for the audit tests: a real App per test on SQLite and on
PostgreSQL (as ``tests/engine``), with a workflow of a few steps."""

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
    register(application)
    yield application
    application.close()


def register(app: cairn.App) -> None:
    """``steps(n)``: n steps, the fourth with a payload large enough to be
    compressed and spilled out of its row on SQLite."""

    @app.step(name="piece")
    def piece(i: int) -> str:
        return "".join(f"{i}:{k};" for k in range(900)) if i == 3 else f"p{i}"

    @app.workflow(name="steps")
    def steps(ctx: cairn.Context, n: int) -> int:
        return sum(len(piece(i)) for i in range(n))
