"""Fixtures for the LangGraph checkpointer tests: a real App per test, on
SQLite (a file in ``tmp_path``) and on PostgreSQL (a fresh migrated database
on the session's private cluster), ids ``[sqlite]`` and ``[postgres]``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import cairn
from tests.engine.conftest import postgres_url

BACKENDS = ("sqlite", "postgres")


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The test's database: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "postgres":
        return postgres_url(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path}/cairn.db"


@pytest.fixture
def app(db_url: str) -> Iterator[cairn.App]:
    application = cairn.App(db=db_url, lease_seconds=5.0)
    yield application
    application.close()


@pytest.fixture
def pg_app(pg_url: str) -> Iterator[cairn.App]:
    """An App on a fresh PostgreSQL database alone: round trips are PostgreSQL's."""
    application = cairn.App(db=postgres_url(pg_url), lease_seconds=5.0)
    yield application
    application.close()


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Every command psycopg sends (each one round trip), by its first words."""
    sent: Counter[str] = Counter()
    execute = psycopg.Cursor.execute

    def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent[" ".join(str(query).split()[:2])] += 1
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", counted)
    return sent
