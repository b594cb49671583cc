"""PostgreSQL plumbing for the benchmark: fresh databases, server facts, cleanup.

Every sample of ``bench.postgres`` gets a database of its own, created just
before and dropped (``WITH (FORCE)``) just after, whatever happens in between.
Names are ``cairnbench_<pid>_<n>_<label>``: if a run is killed so hard that its
``finally`` blocks never run (SIGKILL), the next run drops the leftovers of
every benchmark process that no longer exists (:func:`drop_stale_databases`).

The server is ``$CAIRN_BENCH_PG`` (a libpq URL of any database on it, used
for ``CREATE``/``DROP DATABASE``), by default
``postgresql://postgres@127.0.0.1:5432/postgres``.
"""

from __future__ import annotations

import itertools
import os
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

#: Environment variable naming the server to benchmark against.
PG_ENV = "CAIRN_BENCH_PG"
DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/postgres"
PREFIX = "cairnbench_"
_NAME = re.compile(rf"^{PREFIX}(\d+)_\d+_[a-z0-9_]*$")

_counter = itertools.count(1)
_live: set[str] = set()
_live_lock = threading.Lock()


def admin_url() -> str:
    return os.environ.get(PG_ENV) or DEFAULT_PG


def url_for(dbname: str, base: str | None = None) -> str:
    """``base`` (default :func:`admin_url`) with its database name replaced by ``dbname``."""
    parts = urlsplit(base or admin_url())
    return urlunsplit((parts.scheme, parts.netloc, f"/{dbname}", parts.query, parts.fragment))


def _admin() -> psycopg.Connection[Any]:
    return psycopg.connect(admin_url(), autocommit=True, connect_timeout=10)


def create_database(label: str) -> str:
    """Create a new empty database; return its name. Drop it with :func:`drop_database`."""
    safe = re.sub(r"[^a-z0-9_]", "_", label.lower())[:24]
    name = f"{PREFIX}{os.getpid()}_{next(_counter)}_{safe}"
    with _live_lock:
        _live.add(name)
    with _admin() as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return name


def drop_database(name: str) -> None:
    """``DROP DATABASE ... WITH (FORCE)``: ends any session still connected to it."""
    with _admin() as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    with _live_lock:
        _live.discard(name)


@contextmanager
def fresh_database(label: str) -> Iterator[str]:
    """A new database for one sample; yields its URL and drops it afterwards."""
    name = create_database(label)
    try:
        yield url_for(name)
    finally:
        drop_database(name)


def drop_live_databases() -> list[str]:
    """Drop every database this process created and has not dropped yet (exit path)."""
    with _live_lock:
        names = sorted(_live)
    dropped: list[str] = []
    for name in names:
        try:
            drop_database(name)
            dropped.append(name)
        except psycopg.Error:
            pass
    return dropped


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def drop_stale_databases() -> list[str]:
    """Drop benchmark databases left by benchmark processes that no longer exist."""
    with _admin() as conn:
        names = [str(row[0]) for row in conn.execute("SELECT datname FROM pg_database")]
    stale: list[str] = []
    for name in names:
        match = _NAME.match(name)
        if match and int(match.group(1)) != os.getpid() and not _pid_alive(int(match.group(1))):
            stale.append(name)
    for name in stale:
        drop_database(name)
    return stale


def wait_for_server(timeout: float = 120.0) -> None:
    """Return once the server accepts connections (another engineer's test may
    be restarting it); raise the last connection error after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with _admin() as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def setting(url: str, name: str) -> str:
    """``current_setting(name)`` as a new session on ``url`` sees it."""
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
    return str(row[0]) if row else ""


def server_facts() -> dict[str, Any]:
    """What the figures depend on, recorded with every run."""
    names = ("server_version", "synchronous_commit", "fsync", "wal_sync_method", "full_page_writes",
             "commit_delay", "shared_buffers", "max_connections")
    facts: dict[str, Any] = {"url": _redacted(admin_url())}
    with _admin() as conn:
        for name in names:
            row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
            facts[name] = str(row[0]) if row else None
    return facts


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        user, host = netloc.rsplit("@", 1)
        netloc = f"{user.split(':', 1)[0]}@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
