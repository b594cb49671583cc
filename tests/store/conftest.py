"""Fixtures shared by the store tests: throwaway PostgreSQL databases (see
``tests/store/pg.py``), one migrated template per session for every module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.store.pg import ServerUnavailable, TestDatabases, skip_requested


@pytest.fixture(scope="session")
def pg_databases() -> Iterator[TestDatabases]:
    if skip_requested():
        pytest.skip("CAIRN_SKIP_POSTGRES is set: PostgreSQL store tests skipped on purpose")
    databases = TestDatabases()
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
