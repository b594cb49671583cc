"""Where a crash test's runs live: a SQLite file or a PostgreSQL database.

The crash harness (``tests/acceptance/harness.py``) spawns worker processes on
a store and freezes or kills them; what differs between the backends is
small and lives here:

* the store URL the test process and each worker open (a PostgreSQL worker's
  connections carry an ``application_name`` naming the worker, so a test can
  find exactly its sessions in ``pg_stat_activity``);
* whether a worker is inside a write transaction right now
  (``in_transaction``). A test that freezes a worker to exercise fencing must
  freeze it *outside* one: a SQLite writer frozen mid-transaction holds the
  database's write lock, a PostgreSQL one holds row locks, and either blocks
  the takeover for a reason that has nothing to do with fencing;
* how the store is thrown away at the end (a file in ``tmp_path``; a
  database dropped ``WITH (FORCE)``).
"""

from __future__ import annotations

import os
import secrets
import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from cairn.store.contract import Store

if TYPE_CHECKING:  # not imported at run time: worker processes import this module
    from tests.store.pg import TestDatabases

#: the names of the backends, as test ids show them
BACKENDS = ("sqlite", "postgres")


def with_query(url: str, **params: str) -> str:
    """``url`` with ``params`` set in its query string (replacing equal keys)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in params]
    query.extend(params.items())
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), parts.fragment))


def libpq_url(conninfo: str, dbname: str) -> str:
    """A ``postgresql://`` URL (what ``open_store`` takes) for ``dbname`` on the server of ``conninfo``."""
    params = conninfo_to_dict(conninfo)
    user = quote(str(params.get("user") or "postgres"), safe="")
    password = params.get("password")
    auth = f"{user}:{quote(str(password), safe='')}" if password else user
    host = params.get("host") or params.get("hostaddr") or "127.0.0.1"
    port = params.get("port") or 5432
    return f"postgresql://{auth}@{host}:{port}/{dbname}"


def application_name(worker_id: str) -> str:
    """The ``application_name`` of a worker's PostgreSQL connections."""
    return f"cairn-w-{worker_id}"[:63]


class StoreBackend(ABC):
    """One test's store, and what the crash harness needs to know about it."""

    name: str

    @property
    @abstractmethod
    def url(self) -> str:
        """The store URL (``cairn.App(db=...)``) for the test process."""

    def worker_url(self, worker_id: str) -> str:
        """The store URL for worker process ``worker_id``."""
        return self.url

    @abstractmethod
    def in_transaction(self, worker_id: str) -> bool:
        """Whether worker ``worker_id`` may hold a write transaction open right now."""

    @abstractmethod
    def open_store(self, clock: Callable[[], float]) -> Store:
        """A store object on this database whose clock is ``clock`` (in-process tests)."""

    @abstractmethod
    def drop(self) -> None:
        """Throw the store away (the fixture's finalizer)."""


class SqliteBackend(StoreBackend):
    """A database file in the test's directory."""

    name = "sqlite"

    def __init__(self, directory: Path) -> None:
        self.path = directory / "cairn.db"

    @property
    def url(self) -> str:
        return f"sqlite:///{self.path}"

    def in_transaction(self, worker_id: str) -> bool:
        """Whether some connection holds the database's write lock (SQLite has
        one per database, so this cannot tell whose it is)."""
        return write_locked(self.path)

    def open_store(self, clock: Callable[[], float]) -> Store:
        from cairn.store.sqlite import SQLiteStore

        return SQLiteStore(self.path, clock=clock)

    def drop(self) -> None:
        """Nothing to do: the file lives in the test's ``tmp_path``."""


def write_locked(db_path: Path) -> bool:
    """Whether some connection holds the SQLite database's write lock right now."""
    conn = sqlite3.connect(db_path, timeout=0.2, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            return True
        raise
    finally:
        conn.close()


class PostgresBackend(StoreBackend):
    """A fresh database on the tests' server, its store in schema ``schema``
    (the crash tiers exercise ``?schema=``): an empty one, where the store
    creates its schema on first open, or, given ``copies``, a copy of their
    template, migrated into ``copies.schema`` once a session (``backend``:
    migrating every crash test's database took it about a second of its
    setup; the migrations of a custom schema are pinned by
    ``tests/store/test_postgres_contract.py``)."""

    name = "postgres"

    def __init__(self, admin_url: str, *, schema: str = "cairn_dist", prefix: str = "cairn_crash",
                 copies: TestDatabases | None = None) -> None:
        self.admin_url = admin_url
        self.copies = copies
        if copies is not None:
            self.schema = copies.schema
            self.name_in_server = copies.clone()
            return
        self.schema = schema
        self.name_in_server = f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"
        self._admin(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name_in_server)))

    @property
    def url(self) -> str:
        return with_query(libpq_url(self.admin_url, self.name_in_server), schema=self.schema)

    def worker_url(self, worker_id: str) -> str:
        return with_query(self.url, application_name=application_name(worker_id))

    def connect(self, timeout: int = 5) -> psycopg.Connection[Any]:
        """An autocommit connection to this database, search_path on the store's schema."""
        conn = psycopg.connect(libpq_url(self.admin_url, self.name_in_server), autocommit=True,
                               connect_timeout=timeout, application_name="cairn-test-observer")
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
        return conn

    def sessions(self, worker_id: str) -> list[tuple[int, str]]:
        """(pid, state) of the server sessions of worker ``worker_id`` in this database."""
        with self.connect() as conn:
            rows = conn.execute(
                "SELECT pid, coalesce(state, '') FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = %s AND pid <> pg_backend_pid()",
                (application_name(worker_id),)).fetchall()
        return [(int(pid), str(state)) for pid, state in rows]

    def in_transaction(self, worker_id: str) -> bool:
        """Whether any session of the worker is not idle (inside a transaction,
        or running a statement that may be one)."""
        sessions = self.sessions(worker_id)
        assert sessions, f"no connection of {worker_id} is visible in pg_stat_activity"
        return not all(state == "idle" for _, state in sessions)

    def open_store(self, clock: Callable[[], float]) -> Store:
        from cairn.store.postgres import PostgresStore

        return PostgresStore(libpq_url(self.admin_url, self.name_in_server), schema=self.schema, clock=clock)

    def drop(self) -> None:
        """Drop the database ``WITH (FORCE)`` (a killed worker's sessions may
        linger): a copy in the background, as its siblings are."""
        if self.copies is not None:
            self.copies.drop(self.name_in_server)
            return
        self._admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(self.name_in_server)))

    def _admin(self, query: sql.Composed) -> None:
        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(query)
