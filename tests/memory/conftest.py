"""The vector index's tests run on three stores: SQLite (sqlite-vec),
PostgreSQL without pgvector (the client scores), and PostgreSQL with
pgvector (``tests/pgvector_cluster.py``: a second throwaway cluster, started
only when one of these tests asks for it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import pgcluster, pgvector_cluster
from tests.backends import BACKENDS, PostgresBackend, SqliteBackend, StoreBackend
from tests.pgvector_cluster import PgvectorBackend

#: the backends of the vector index's tests, as their ids show them
VECTOR_BACKENDS = (*BACKENDS, "pgvector")


@pytest.fixture(scope="session")
def pgvector_admin_url() -> Iterator[str]:
    """Administration URL of the pgvector cluster (started on first use,
    stopped when the session ends); skips or fails as ``pgvector_cluster.require``."""
    url = pgvector_cluster.require()
    try:
        yield url
    finally:
        pgvector_cluster.shutdown()


@pytest.fixture(params=VECTOR_BACKENDS)
def vector_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreBackend]:
    """The root ``backend``, and pgvector's as a third parameter."""
    store: StoreBackend
    if request.param == "pgvector":
        store = PgvectorBackend(request.getfixturevalue("pgvector_admin_url"), prefix="cairn_vec")
    elif request.param == "postgres":
        store = PostgresBackend(request.getfixturevalue("pg_admin_url"),
                                copies=request.getfixturevalue("pg_crash_databases"))
    else:
        store = SqliteBackend(tmp_path)
    try:
        yield store
    finally:
        if isinstance(store, PostgresBackend):
            pgcluster.ensure_running()
        store.drop()
