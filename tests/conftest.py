"""Fixtures every tier shares: PostgreSQL from the session's own throwaway
cluster (``tests/pgcluster.py``), per-test databases copied from one
migrated template (``tests/store/pg.py``), the crash tiers' ``backend`` (a
store on SQLite or PostgreSQL, ``tests/backends.py``) and the fake ``bank``."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

from cairn.demo.bank import BankProcess
from tests import pgcluster, processes
from tests.backends import BACKENDS, PostgresBackend, SqliteBackend, StoreBackend
from tests.store.pg import ServerUnavailable, TestDatabases
from tests.timing import TIMEOUT_SLACK

#: the fewest worker processes ``-n auto`` (the README's test command) starts, whatever the core count
MIN_WORKERS = 2
#: the most tests marked ``slow`` that run at once under pytest-xdist
SLOW_AT_ONCE = 2


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """How many processes ``-n auto`` runs the suite in: one per core, but at
    least ``MIN_WORKERS``. Much of a test's time is spent waiting (on an fsync,
    a subprocess, a lease or a timer), so even one core gains from a second
    process; more processes than cores starve the worker processes the crash
    tests spawn. ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still decides when set (as it
    does for xdist's own hook, which this one replaces)."""
    given = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "").strip()
    if given.isdigit():
        return int(given)
    return max(MIN_WORKERS, os.cpu_count() or 1)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (--dist loadgroup)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, at most two of the ``slow`` tests (worker
    processes spawned, SIGKILLed, servers restarted) run at once: three of
    them at once on a 2-core machine starve the worker processes they spawn
    (starting one takes seconds there), and their deadlines are about the
    behaviour, not about a machine that busy. With two processes (the
    README's command on this project's 2-core CI) that holds by itself, and
    every test goes to whichever process is free. With more processes, the
    slow tests are dealt alternately into two groups (``--dist loadgroup``
    runs a group in one process), which bounds them at two while the other
    processes take the rest of the suite. (Grouping them by backend instead,
    as before, put 323 of the 459 in one process: on two processes that one
    group was the suite's critical path.)

    A test's own ``timeout`` mark is scaled by ``TIMEOUT_SLACK``: it was set
    for a quiet machine, and is only the bound that ends a hung test."""
    for item in items:
        timeout = item.get_closest_marker("timeout")
        if timeout is not None and timeout.args:
            item.add_marker(pytest.mark.timeout(float(timeout.args[0]) * TIMEOUT_SLACK), append=False)
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    if workers <= SLOW_AT_ONCE:
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    for index, item in enumerate(slow):  # the same order in every process, so the same groups
        item.add_marker(pytest.mark.xdist_group(f"slow-{index % SLOW_AT_ONCE}"))


def pytest_configure(config: pytest.Config) -> None:
    processes.install()
    # the code hash's per-user cache (cairn.engine.codecache) in a directory of
    # this session's, for its processes and every worker it starts: never the
    # user's own ~/.cache
    os.environ["XDG_CACHE_HOME"] = _CACHE_HOME
    config.addinivalue_line("markers", "bank(**options): options of the test's bank process "
                            "(delay_ms, reply_delay_ms; see cairn.demo.bank.BankProcess.start)")


CALL_FAILED = pytest.StashKey[bool]()
REFUSED_SPAWNS = pytest.StashKey[list[str]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    """A test not marked ``slow`` may not start a process, in its fixtures or
    its body (``tests/processes.py``): ``pytest -m "not slow"`` is the quick
    loop, and a spawned worker is what makes a test slow."""
    with processes.guard(item.nodeid, slow=item.get_closest_marker("slow") is not None) as refused:
        item.stash[REFUSED_SPAWNS] = refused
        return (yield)


@pytest.fixture
def call_failed(request: pytest.FixtureRequest) -> Callable[[], bool]:
    """Whether the test's body failed, for finalizers that print worker logs then."""
    return lambda: request.node.stash.get(CALL_FAILED, False)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    pgcluster.shutdown()
    shutil.rmtree(_CACHE_HOME, ignore_errors=True)


_CACHE_HOME = tempfile.mkdtemp(prefix="cairn-test-cache-")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Remember whether the test's call failed (``call_failed``), and report
    every test skipped for want of PostgreSQL at one location, so ``-ra``
    folds them into one line (``SKIPPED [N] tests/pgcluster.py: ...``)
    instead of one per test, which would bury the reason."""
    report = yield
    refused = item.stash.get(REFUSED_SPAWNS, [])
    if report.when == "call" and refused and report.passed:  # the test swallowed the refusal
        report.outcome = "failed"
        report.longrepr = "\n".join(refused)
    if report.when == "call":
        item.stash[CALL_FAILED] = report.failed
    longrepr = report.longrepr
    if report.skipped and isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2]).removeprefix("Skipped: ")
        if reason in pgcluster.SKIP_REASONS:
            report.longrepr = (os.path.relpath(pgcluster.__file__), 1, longrepr[2])
    return report


@pytest.fixture(scope="session")
def pg_admin_url() -> str:
    """Administration URL of the tests' PostgreSQL server (the private
    cluster, started on first use); skips or fails as ``pgcluster.require``."""
    return pgcluster.require()


def _started(databases: TestDatabases) -> Iterator[TestDatabases]:
    """``databases`` with their template built, for a session fixture; closed after."""
    problem = None
    try:
        databases.start()
    except ServerUnavailable as exc:
        problem = str(exc)
    if problem is not None:  # failed outside the except block: the message is printed once
        pytest.fail(problem, pytrace=False)
    yield databases
    databases.close()


@pytest.fixture(scope="session")
def pg_databases(pg_admin_url: str) -> Iterator[TestDatabases]:
    yield from _started(TestDatabases(pg_admin_url))


@pytest.fixture(scope="session")
def pg_crash_databases(pg_admin_url: str) -> Iterator[TestDatabases]:
    """The crash tiers' PostgreSQL databases (``backend``, ``database``):
    copies of a template migrated into their schema, ``cairn_dist``, made
    two ahead (fewer tests use them than ``pg_url``)."""
    yield from _started(TestDatabases(pg_admin_url, ahead=2, schema="cairn_dist", prefix="cairn_crash"))


@pytest.fixture
def pg_url(pg_databases: TestDatabases) -> Iterator[str]:
    """A fresh database with the migrations applied (schema ``cairn``)."""
    with pg_databases.database() as url:
        yield url


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite store file with every migration applied, made once a session:
    a test's fresh store can start from a copy of it, as a PostgreSQL test's
    starts from a copy of a template database. Migrating a new file took
    60-270 ms of each such test's setup, a copy takes 2; opening, migrating
    and recording the migrations are pinned by tests that make their files
    themselves (``tests/store/test_sqlite_contract.py``)."""
    from cairn.store.sqlite import SQLiteStore

    path = tmp_path_factory.mktemp("sqlite-template") / "migrated.db"
    SQLiteStore(path).close()
    leftovers = [p.name for p in path.parent.iterdir() if p != path]
    assert leftovers == [], f"closing the store left {leftovers}: a copy of the file alone would miss them"
    return path


@pytest.fixture
def sqlite_url(tmp_path: Path, migrated_sqlite: Path) -> str:
    """The URL of a fresh, migrated SQLite store: ``cairn.db`` in ``tmp_path``,
    a copy of ``migrated_sqlite``."""
    path = tmp_path / "cairn.db"
    shutil.copyfile(migrated_sqlite, path)
    return f"sqlite:///{path}"


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreBackend]:
    """The crash tiers' store, once per backend (ids ``[sqlite]`` and
    ``[postgres]``): a file in ``tmp_path``, or a fresh database on the
    tests' server, dropped at the end. A test bound to one backend says so
    with ``@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)``
    and a reason."""
    store: StoreBackend
    if request.param == "postgres":
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


@pytest.fixture
def bank(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[BankProcess]:
    """The fake bank, a process with its own SQLite ledger (options from the
    test's ``bank`` marker)."""
    marker = request.node.get_closest_marker("bank")
    options = dict(marker.kwargs) if marker is not None else {}
    with BankProcess.start(tmp_path / "bank" / "bank.db", **options) as running:
        yield running
