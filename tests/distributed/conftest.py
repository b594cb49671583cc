"""Fixtures of the distributed tier: real workers on a real PostgreSQL server.

Every test gets a fresh database of its own (dropped afterwards), a bank
process, and a ``DistCluster`` whose worker processes are SIGKILLed and reaped
when the test ends, pass or fail. Tests that restart or stop the server use
``pg_server``; its finalizer starts the server again if a test left it down.

``CAIRN_SKIP_POSTGRES=1`` skips the tier on purpose; an unreachable server
fails it (a silent skip would hide a broken backend), as in ``tests/store``.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path

import psycopg
import pytest

from cairn.demo.bank import BankProcess
from tests.distributed.cluster import Database, DistCluster, PgServer
from tests.store.pg import ENV_SKIP, ENV_URL, server_url, skip_requested

_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[_FAILED] = report.failed
    return report


@pytest.fixture(scope="session")
def pg_admin_url() -> str:
    if skip_requested():
        pytest.skip(f"{ENV_SKIP} is set: PostgreSQL tests skipped on purpose")
    url = server_url()
    problem = None
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        problem = (f"PostgreSQL is not reachable ({' '.join(str(exc).split())}); start it or point {ENV_URL} "
                   f"at a server; set {ENV_SKIP}=1 to skip on purpose")
    if problem is not None:
        pytest.fail(problem, pytrace=False)
    return url


@pytest.fixture
def pg_server(pg_admin_url: str) -> Iterator[PgServer]:
    """Control of the local server (skips if this process cannot restart it);
    the finalizer makes sure it is running again."""
    server = PgServer(pg_admin_url)
    why = server.controllable()
    if why is not None:
        pytest.skip(f"cannot restart the PostgreSQL server: {why}")
    try:
        yield server
    finally:
        server.ensure_running()


@pytest.fixture
def database(pg_admin_url: str) -> Iterator[Database]:
    """A fresh database for this test, dropped at the end (the server is
    started first if a test left it stopped)."""
    db = Database(pg_admin_url)
    try:
        yield db
    finally:
        PgServer(pg_admin_url).ensure_running()
        db.drop()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "bank(**options): options of the test's bank process "
                            "(delay_ms, reply_delay_ms; see cairn.demo.bank.BankProcess.start)")


@pytest.fixture
def bank(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[BankProcess]:
    """The fake bank, a process with its own SQLite ledger (options from the
    test's ``bank`` marker)."""
    marker = request.node.get_closest_marker("bank")
    options = dict(marker.kwargs) if marker is not None else {}
    with BankProcess.start(tmp_path / "bank" / "bank.db", **options) as running:
        yield running


@pytest.fixture
def dist(tmp_path: Path, database: Database, bank: BankProcess,
         request: pytest.FixtureRequest) -> Iterator[DistCluster]:
    cluster = DistCluster(tmp_path, database, bank)
    try:
        yield cluster
    finally:
        if request.node.stash.get(_FAILED, False):
            print(f"\nworker logs (in {tmp_path}):\n{cluster.describe_workers()}\n--- bank ---\n"
                  f"{bank.log_tail(10)}")
        cluster.cleanup()
