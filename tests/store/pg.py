"""Throwaway PostgreSQL databases for the store tests.

Each test gets a database of its own, so tests cannot see each other's runs
and need no cleanup inside the database. Running the migrations for every
test would dominate the suite's time, so they run once per session into a
template database, and each test's database is a ``CREATE DATABASE ...
TEMPLATE`` copy of it.

A copy costs one forced WAL flush (tens to hundreds of milliseconds,
depending on the disk and its load) but little CPU, so copies are made a few
at a time on background threads, ahead of the tests that will use them, and
dropped in the background after: the flushes overlap instead of adding up.

Names carry the process id and a random tag, so several test sessions (other
engineers, CI jobs) can share one server without colliding.

The server is the test session's own throwaway cluster, or the one named by
``CAIRN_TEST_POSTGRES_URL`` (see ``tests/pgcluster.py``, which also says when
the PostgreSQL tests skip and when they fail instead).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cairn.store.postgres import PostgresStore
from tests import pgcluster
from tests.pgcluster import ENV_SKIP, ENV_URL, skip_requested

__all__ = ["ENV_SKIP", "ENV_URL", "ServerUnavailable", "TestDatabases", "server_url", "skip_requested"]


def server_url() -> str:
    """The tests' server (starting the private cluster on first use); skips or
    fails the calling test where there is none (``pgcluster.require``)."""
    return pgcluster.require()


class ServerUnavailable(Exception):
    """The test server cannot be reached or used; the message says what to do."""


class TestDatabases:
    """A migrated template database and the per-test copies made from it."""

    __test__ = False  # not a test class, whatever pytest thinks of the name

    def __init__(self, url: str | None = None, *, ahead: int = 6, schema: str = "cairn",
                 prefix: str = "cairn_test") -> None:
        self.url = url or server_url()
        self.schema = schema
        self.prefix = f"{prefix}_{os.getpid()}_{secrets.token_hex(3)}"
        self.template = f"{self.prefix}_template"
        self.ahead = ahead
        self._numbers = itertools.count(1)
        self._executor: ThreadPoolExecutor | None = None
        self._ready: deque[Future[str]] = deque()
        self._dropping: list[Future[None]] = []

    def url_for(self, dbname: str) -> str:
        """A conninfo string for database ``dbname`` on the test server."""
        return make_conninfo(self.url, dbname=dbname)

    def start(self) -> None:
        """Build the template; ``ServerUnavailable`` if the server cannot be used."""
        params = conninfo_to_dict(self.url)
        where = f"{params.get('host', 'localhost')}:{params.get('port', 5432)}"
        try:
            self._execute(sql.SQL("SELECT 1"), connect_timeout=5)
        except psycopg.Error as exc:
            message = " ".join(str(exc).split())
            raise ServerUnavailable(
                f"PostgreSQL is not reachable at {where} ({message}). The tests start a cluster of their "
                f"own where the server binaries are installed, or use the one {ENV_URL} names. "
                f"Set {ENV_SKIP}=1 to skip these tests on purpose."
            ) from None
        try:
            self._create(self.template)
            PostgresStore(self.url_for(self.template), schema=self.schema).close()  # the migrations, once
        except Exception as exc:
            with contextlib.suppress(psycopg.Error):
                self._drop(self.template)
            raise ServerUnavailable(f"cannot prepare a template database on {where}: {exc}") from exc
        self._executor = ThreadPoolExecutor(max_workers=self.ahead, thread_name_prefix="cairn-test-db")
        self._top_up()

    def clone(self) -> str:
        """A fresh copy of the template (made ahead of time); return its name.
        A copy made while a chaos test restarted the server may have failed:
        that one is made again, here."""
        self._top_up()
        future = self._ready.popleft()
        try:
            name = future.result()
        except psycopg.Error:
            name = self._create(f"{self.prefix}_{next(self._numbers)}", self.template)
        self._top_up()
        return name

    def drop(self, name: str) -> None:
        """Drop a copy, in the background."""
        if self._executor is None:
            raise ServerUnavailable("the test databases are not started")
        self._dropping.append(self._executor.submit(self._drop, name))

    @contextlib.contextmanager
    def database(self) -> Iterator[str]:
        """A fresh migrated database for one test; dropped afterwards."""
        name = self.clone()
        try:
            yield self.url_for(name)
        finally:
            self.drop(name)

    def wait_idle(self) -> None:
        """Wait for the copies and drops under way. Each runs a transaction
        with an xid, and a transaction anywhere on the server keeps every
        database's scans from marking rows deleted after it began as dead
        (tests/langgraph/test_writes_index.py, which counts index pages)."""
        for future in [*self._ready, *self._dropping]:
            with contextlib.suppress(Exception):  # a failed copy is made again by clone()
                future.result()

    def close(self) -> None:
        """Drop every copy (used or made ahead) and the template."""
        if self._executor is None:
            return
        while self._ready:
            with contextlib.suppress(Exception):
                self.drop(self._ready.popleft().result())
        for future in self._dropping:
            with contextlib.suppress(Exception):
                future.result()
        self._executor.shutdown()
        self._executor = None
        with contextlib.suppress(psycopg.Error):
            self._drop(self.template)

    def _top_up(self) -> None:
        if self._executor is None:
            raise ServerUnavailable("the test databases are not started")
        while len(self._ready) < self.ahead:
            name = f"{self.prefix}_{next(self._numbers)}"
            self._ready.append(self._executor.submit(self._create, name, self.template))

    def _create(self, name: str, template: str | None = None) -> str:
        query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template is not None:
            query = sql.SQL("{} TEMPLATE {}").format(query, sql.Identifier(template))
        self._execute(query)
        return name

    def _drop(self, name: str) -> None:
        # FORCE: a test that failed before closing its store must not leave
        # the database behind because of its open connections.
        self._execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def _execute(self, query: sql.Composable, connect_timeout: int = 10) -> None:
        """One administrative statement on a connection of its own: the
        background threads each need one, and they are short-lived."""
        with psycopg.connect(self.url, autocommit=True, connect_timeout=connect_timeout) as conn:
            conn.execute(query)
