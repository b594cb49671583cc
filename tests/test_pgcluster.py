"""The tests' PostgreSQL is a private cluster of the session's own, never the machine's.

``tests/pgcluster.py`` starts it; these tests pin what the rest of the suite
relies on: it is the server the fixtures hand out, it lives in a temporary
directory with its own socket directory and port, and it commits
synchronously without flushing to disk (``pgcluster.SETTINGS`` says why). They
also pin when a missing PostgreSQL skips and when it fails the run.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests import pgcluster


def setting(url: str, name: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
    assert row is not None
    return str(row[0])


def test_the_tests_server_is_the_private_cluster(pg_admin_url: str) -> None:
    cluster = pgcluster.private_cluster()
    if cluster is None:
        pgcluster.unavailable(f"{pgcluster.ENV_URL} names an external server: nothing private to check")
    assert cluster is not None
    assert pg_admin_url == cluster.url
    assert Path(setting(pg_admin_url, "data_directory")).resolve() == cluster.data.resolve()
    assert int(setting(pg_admin_url, "port")) == cluster.port
    assert Path(setting(pg_admin_url, "unix_socket_directories")).resolve() == cluster.sockets.resolve()
    assert setting(pg_admin_url, "listen_addresses") == "127.0.0.1"


def test_the_private_cluster_commits_synchronously_without_flushing(pg_admin_url: str) -> None:
    """A commit is acknowledged once its WAL reached the operating system (the
    chaos test's immediate restart must not lose it), never flushed further
    (no test crashes the operating system)."""
    assert setting(pg_admin_url, "synchronous_commit") == "on"
    assert setting(pg_admin_url, "fsync") == "off"
    assert setting(pg_admin_url, "full_page_writes") == "off"


def test_no_postgres_skips_unless_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(pgcluster.ENV_REQUIRE, raising=False)
    with pytest.raises(pytest.skip.Exception, match="no server here"):
        pgcluster.unavailable("no server here")
    monkeypatch.setenv(pgcluster.ENV_REQUIRE, "1")
    with pytest.raises(pytest.fail.Exception, match=f"{pgcluster.ENV_REQUIRE}=1 but no server here"):
        pgcluster.unavailable("no server here")


def test_a_requested_skip_fails_when_postgres_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(pgcluster.ENV_SKIP, "1")
    monkeypatch.setenv(pgcluster.ENV_REQUIRE, "1")
    with pytest.raises(pytest.fail.Exception, match=pgcluster.ENV_SKIP):
        pgcluster.require()
