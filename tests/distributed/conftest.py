"""Fixtures of the distributed tier: real workers on a real PostgreSQL server.

The server is the session's private cluster (``tests/pgcluster.py``; the
``pg_admin_url`` fixture is in the root ``conftest.py``). Every test gets a
fresh database of its own (dropped afterwards), a bank process, and a
``DistCluster`` whose worker processes are SIGKILLed and reaped when the test
ends, pass or fail. Tests that restart or stop the server use ``pg_server``:
it is the private cluster (an external server named by
``CAIRN_TEST_POSTGRES_URL`` is never restarted: those tests skip), and its
finalizer starts the server again if a test left it down.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cairn.demo.bank import BankProcess
from tests import pgcluster
from tests.backends import PostgresBackend
from tests.distributed.cluster import DistCluster, PgServer
from tests.store.pg import TestDatabases


@pytest.fixture
def pg_server(pg_admin_url: str) -> Iterator[PgServer]:
    """Control of the session's private cluster; the finalizer makes sure it
    is running again."""
    cluster = pgcluster.private_cluster()
    if cluster is None:
        pgcluster.unavailable(f"{pgcluster.ENV_URL} names an external server, and the tests restart only "
                              "a server they started")
    assert cluster is not None
    server = PgServer(cluster)
    try:
        yield server
    finally:
        server.ensure_running()


@pytest.fixture
def database(pg_admin_url: str, pg_crash_databases: TestDatabases) -> Iterator[PostgresBackend]:
    """A fresh database for this test, dropped at the end (the server is
    started first if a test left it stopped)."""
    db = PostgresBackend(pg_admin_url, copies=pg_crash_databases)
    try:
        yield db
    finally:
        pgcluster.ensure_running()
        db.drop()


@pytest.fixture
def dist(tmp_path: Path, database: PostgresBackend, bank: BankProcess,
         call_failed: Callable[[], bool]) -> Iterator[DistCluster]:
    cluster = DistCluster(tmp_path, database, bank)
    try:
        yield cluster
    finally:
        if call_failed():
            print(f"\nworker logs (in {tmp_path}):\n{cluster.describe_workers()}\n--- bank ---\n"
                  f"{bank.log_tail(10)}")
        cluster.cleanup()
