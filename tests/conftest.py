"""Fixtures every tier shares: PostgreSQL from the session's own throwaway
cluster (``tests/pgcluster.py``) and per-test databases copied from one
migrated template (``tests/store/pg.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests import pgcluster
from tests.store.pg import ServerUnavailable, TestDatabases


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    pgcluster.shutdown()


@pytest.fixture(scope="session")
def pg_admin_url() -> str:
    """Administration URL of the tests' PostgreSQL server (the private
    cluster, started on first use); skips or fails as ``pgcluster.require``."""
    return pgcluster.require()


@pytest.fixture(scope="session")
def pg_databases(pg_admin_url: str) -> Iterator[TestDatabases]:
    databases = TestDatabases(pg_admin_url)
    problem = None
    try:
        databases.start()
    except ServerUnavailable as exc:
        problem = str(exc)
    if problem is not None:  # failed outside the except block: the message is printed once
        pytest.fail(problem, pytrace=False)
    yield databases
    databases.close()


@pytest.fixture
def pg_url(pg_databases: TestDatabases) -> Iterator[str]:
    """A fresh database with the migrations applied (schema ``cairn``)."""
    with pg_databases.database() as url:
        yield url
