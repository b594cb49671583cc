"""Fixtures of the retention tests: a database URL on each backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engine.conftest import postgres_url


@pytest.fixture(params=("sqlite", "postgres"))
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database URL on each backend (PostgreSQL: a fresh migrated database)."""
    if request.param == "postgres":
        yield postgres_url(request.getfixturevalue("pg_url"))
    else:
        yield f"sqlite:///{tmp_path}/cairn.db"
