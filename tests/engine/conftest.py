"""Fixtures for engine tests: a real App per test, on every backend.

The ``app`` fixture is parametrized over SQLite (a file in ``tmp_path``) and
PostgreSQL (a fresh database copied from the migrated template, on the
session's private cluster; see ``tests/conftest.py``), so every engine test
that takes ``app`` runs on both, with ids ``[sqlite]`` and ``[postgres]``.
The engine must not behave differently on either: a test that passes on one
and fails on the other found a backend bug.

A test that genuinely cannot run on PostgreSQL (it opens the SQLite file
itself, say) says so with ``@pytest.mark.parametrize("app", ["sqlite"],
indirect=True)`` and a comment giving the reason.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from psycopg.conninfo import conninfo_to_dict

import cairn

BACKENDS = ("sqlite", "postgres")


def postgres_url(conninfo: str) -> str:
    """The ``postgresql://`` URL ``cairn.App(db=...)`` takes, for a libpq conninfo."""
    params = conninfo_to_dict(conninfo)
    return f"postgresql://{params['user']}@{params['host']}:{params['port']}/{params['dbname']}"


@pytest.fixture(params=BACKENDS)
def app(request: pytest.FixtureRequest) -> Iterator[cairn.App]:
    if request.param == "postgres":
        # only a PostgreSQL test starts the cluster: ``-k sqlite`` needs none
        url = postgres_url(request.getfixturevalue("pg_url"))
        application = cairn.App(db=url, lease_seconds=5.0)
    else:
        application = cairn.App(db=request.getfixturevalue("sqlite_url"), lease_seconds=5.0)
    yield application
    application.close()


class Calls:
    """Counts how often each step body really ran (the 'outside world')."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def hit(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1

    def __getitem__(self, name: str) -> int:
        return self.counts.get(name, 0)


@pytest.fixture
def calls() -> Calls:
    return Calls()


def execute_once(app: cairn.App, run_id: str) -> str:
    """Claim ``run_id`` and execute it once, like one worker pass; returns the
    outcome's status (``suspended``, ``completed``, ...)."""
    from cairn.engine.executor import execute

    claim = app.store.claim_run(run_id, "test-worker", 5.0, 5)
    assert claim is not None, f"run {run_id} is not claimable"
    return execute(app.runtime, claim, "test-worker").status
