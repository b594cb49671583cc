"""A second throwaway PostgreSQL cluster, one that has pgvector.

The machine's PostgreSQL (``tests/pgcluster.py`` finds it) has no pgvector:
Debian ships none for every server version. The ``pgserver`` wheel (a dev
extra) carries a relocatable PostgreSQL 16 build *with* pgvector
(``pgserver/pginstall``: ``bin/``, ``lib/postgresql/vector.so`` and the
extension's SQL). Only its binaries are used, through the same
``PrivateCluster`` as the main test cluster: a fresh ``initdb`` in a
temporary directory, a free port of 127.0.0.1, run as the ``postgres`` user
when the tests run as root.

The cluster starts on first use (only the tests of the pgvector path ask for
it) and is stopped and deleted at the end of the session (the fixture that
starts it finalizes it; an ``atexit`` hook does it too). Where the wheel is
not installed the tests skip with one reason, except under
``CAIRN_REQUIRE_POSTGRES=1`` (CI), where they fail, as every PostgreSQL test
does (``pgcluster.unavailable``). ``CAIRN_TEST_PGVECTOR_URL`` may name an
external server with pgvector instead.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import pwd
import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from cairn.store.contract import Store
from tests import pgcluster, processes
from tests.backends import PostgresBackend
from tests.pgcluster import PrivateCluster, Unavailable

ENV_URL = "CAIRN_TEST_PGVECTOR_URL"

_lock = threading.Lock()
_cluster: PrivateCluster | None = None
_problem: Unavailable | None = None


def pginstall() -> Path | None:
    """The ``pginstall`` tree of the ``pgserver`` wheel, or ``None`` where it is not installed."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        tree = Path(location) / "pginstall"
        if (tree / "bin" / "postgres").is_file() and (tree / "lib" / "postgresql" / "vector.so").is_file():
            return tree
    return None


def _runs_as_server_user(cluster: PrivateCluster) -> bool:
    """Whether the server user can execute the cluster's binaries where they
    are (a venv under a root-only home directory is out of its reach)."""
    try:
        with processes.infrastructure():
            done = subprocess.run(cluster._command("postgres", "--version"), capture_output=True, timeout=30,
                                  check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _start() -> PrivateCluster:
    tree = pginstall()
    if tree is None:
        raise Unavailable("the pgserver wheel (PostgreSQL with pgvector, in the dev extra) is not installed: "
                          "the tests of the pgvector path skipped", missing=True)
    cluster = PrivateCluster(tree / "bin")
    try:
        if cluster.as_root and not _runs_as_server_user(cluster):
            # a copy the server user can read: the build is relocatable, but its
            # binaries find their shared libraries (libpq, ...) through an RPATH of
            # ``$ORIGIN/../../../pgserver.libs``, the wheel's sibling directory in
            # site-packages, so the copy keeps that layout
            site = cluster.root / "site"
            copy = site / "pgserver" / "pginstall"
            shutil.copytree(tree, copy, symlinks=True)
            libs = tree.parent.parent / "pgserver.libs"
            if libs.is_dir():
                shutil.copytree(libs, site / "pgserver.libs", symlinks=True)
            entry = pwd.getpwnam(pgcluster.SERVER_USER)
            for path in (cluster.root, site, *site.rglob("*")):
                os.chown(path, entry.pw_uid, entry.pw_gid, follow_symlinks=False)
            cluster.bindir = copy / "bin"
        cluster.init()
        cluster.start()
    except Exception as exc:
        tail = cluster.log_tail()
        cluster.destroy()
        raise Unavailable(f"cannot start the pgvector test cluster with {tree}: {exc} {tail}",
                          missing=False) from exc
    atexit.register(shutdown)
    return cluster


def admin_url() -> str:
    """The superuser URL of the pgvector cluster, starting it on first use;
    ``Unavailable`` if there is none."""
    global _cluster, _problem
    external = os.environ.get(ENV_URL)
    if external:
        return external
    with _lock:
        if _cluster is None and _problem is None:
            try:
                _cluster = _start()
            except Unavailable as exc:
                _problem = exc
        if _problem is not None:
            raise _problem
        assert _cluster is not None
        return _cluster.url


def require() -> str:
    """``admin_url()`` for a test: skips where the wheel is missing (fails
    under ``CAIRN_REQUIRE_POSTGRES=1``), fails where starting it broke."""
    import pytest

    if pgcluster.skip_requested():
        pgcluster.unavailable(f"{pgcluster.ENV_SKIP} is set: PostgreSQL tests skipped on purpose")
    try:
        return admin_url()
    except Unavailable as exc:
        if exc.missing:
            pgcluster.unavailable(str(exc))
        pytest.fail(str(exc), pytrace=False)
    raise AssertionError("unreachable")  # pragma: no cover


def shutdown() -> None:
    """Stop and delete the pgvector cluster (session end; idempotent)."""
    global _cluster
    with _lock:
        cluster, _cluster = _cluster, None
    if cluster is not None:
        cluster.destroy()


class PgvectorBackend(PostgresBackend):
    """A fresh database on the pgvector cluster: the store's migration
    creates the extension and the ``vec`` column, and every store opened on
    it must report that it searches with pgvector (a silent fallback to the
    client's scorer would pass every search test while testing nothing)."""

    name = "pgvector"

    def open_store(self, clock: Callable[[], float]) -> Store:
        store = super().open_store(clock)
        if not getattr(store, "pgvector", False):
            store.close()
            raise AssertionError("a store on the pgvector cluster does not use pgvector")
        return store
