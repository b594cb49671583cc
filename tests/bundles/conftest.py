"""Fixtures of the bundle tests: one database per test on every backend, on
which several apps (deployments of different code) may be opened at once."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import cairn
from tests.engine.conftest import postgres_url

BACKENDS = ("sqlite", "postgres")


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return postgres_url(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path}/cairn.db"


@pytest.fixture
def deploy(db_url: str) -> Iterator[Callable[[Callable[[str | None], cairn.App]], cairn.App]]:
    """``deploy(apps.serving_v1)``: that deployment's app on the test's
    database (closed at the end)."""
    opened: list[cairn.App] = []

    def make(build: Callable[[str | None], cairn.App]) -> cairn.App:
        app = build(db_url)
        opened.append(app)
        return app

    yield make
    for app in opened:
        app.close()
