"""The test session's own PostgreSQL cluster: started on demand, thrown away at the end.

Tests never touch a PostgreSQL server they did not start: a developer's or a
CI machine's cluster may hold data, and the chaos tests restart (even crash)
the server they run on. So the first test that needs PostgreSQL starts a
private one:

* the server binaries come from ``$CAIRN_TEST_PG_BINDIR``, ``pg_config
  --bindir``, the newest ``/usr/lib/postgresql/*/bin``, or ``initdb`` on the
  ``PATH`` (in that order);
* ``initdb`` writes a fresh cluster into a temporary directory; when the tests
  run as root (CI does) the directory is handed to the ``postgres`` user and
  every server command runs as that user (``runuser``, or ``su`` where there
  is none), since the server refuses to run as root;
* the server listens on a free port of 127.0.0.1 only, its unix socket lives
  in the temporary directory (so it never collides with a system cluster), and
  it runs without ``fsync`` (see ``SETTINGS``);
* the root ``conftest.py`` stops it and deletes the directory when the session
  ends (an ``atexit`` hook does it too, should the session end abnormally);
* under pytest-xdist (the README's ``-n auto``) every worker process is a
  session of its own and starts its own cluster (``cairn-test-pg-gw0-...``),
  so a chaos test that restarts or crashes its server disturbs only the tests
  of its own process, which run one after another; ``max_connections`` and
  ``shared_buffers`` are per cluster (a few clusters fit in a small machine).

``CAIRN_TEST_POSTGRES_URL`` may still name an external server (a libpq URL of
a user allowed to create databases and roles); then nothing is started, and
tests that would restart the server skip instead: they restart only a server
they started.

When no server binaries exist the PostgreSQL tests skip, all with one reason
(one line of pytest's ``-ra`` summary). ``CAIRN_REQUIRE_POSTGRES=1`` (set by
``.ci/run``) turns every such skip into a failure, so CI cannot go green with
its PostgreSQL tests unrun. ``CAIRN_SKIP_POSTGRES=1`` skips them on purpose.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psycopg
import pytest

from tests import processes

ENV_URL = "CAIRN_TEST_POSTGRES_URL"
ENV_SKIP = "CAIRN_SKIP_POSTGRES"
ENV_REQUIRE = "CAIRN_REQUIRE_POSTGRES"
ENV_BINDIR = "CAIRN_TEST_PG_BINDIR"

#: the server user when the tests run as root (the server refuses to run as root)
SERVER_USER = "postgres"
#: superuser of the private cluster (what the tests' URLs log in as)
SUPERUSER = "postgres"
_TOOLS = ("initdb", "pg_ctl", "postgres")

#: written into the private cluster's postgresql.conf.
#:
#: ``fsync`` and ``full_page_writes`` off: a flush (and a whole page in the WAL
#: after each checkpoint) protects committed data from a crash of the operating
#: system or a power cut, and no test crashes the machine: the SIGKILL tests kill
#: worker processes, and the chaos test's "immediate" restart kills the server's
#: processes, after which the WAL they wrote is still in the page cache and
#: recovery replays it. A throwaway cluster that would not survive a power cut is
#: gone after one anyway. The flush only cost time: every commit of every test
#: waited on the disk, which on a busy shared disk is the slowest thing a test
#: does. (No test reads the server's fsync: the barrier tests pin the
#: ``synchronous_commit`` a commit asks for, ``test_effect_barrier_postgres``.)
#:
#: ``synchronous_commit`` stays on: off, a commit is acknowledged before its WAL
#: leaves the server's memory, so the chaos test's immediate restart
#: (``tests/distributed/test_pg_chaos.py``) would lose acknowledged steps. With
#: ``fsync`` off it costs a write to the page cache, not a flush.
SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",
    "synchronous_commit": "on",
    "full_page_writes": "off",
    "max_connections": "200",  # the chaos tests: 4 workers x pools, observers, the test itself
    "shared_buffers": "128MB",
    "autovacuum": "off",  # tests are short; vacuum would only add noise
    "timezone": "'UTC'",
    "log_timezone": "'UTC'",
    "logging_collector": "off",
    "log_min_messages": "warning",
}


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def skip_requested() -> bool:
    return _flag(ENV_SKIP)


def required() -> bool:
    return _flag(ENV_REQUIRE)


class Unavailable(Exception):
    """No PostgreSQL for the tests. ``missing`` says whether that is because
    the machine has no server binaries (a skip) rather than a broken setup."""

    def __init__(self, message: str, *, missing: bool) -> None:
        super().__init__(message)
        self.missing = missing


def find_bindir() -> Path | None:
    """The directory of ``initdb``, ``pg_ctl`` and ``postgres``, or ``None``."""
    candidates: list[str] = []
    if os.environ.get(ENV_BINDIR):
        candidates.append(os.environ[ENV_BINDIR])
    if shutil.which("pg_config"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            with processes.infrastructure():
                done = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, timeout=10,
                                      check=False)
            if done.returncode == 0:
                candidates.append(done.stdout.strip())

    def version(path: str) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", path))

    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(str(Path(initdb).resolve().parent))
    for candidate in candidates:
        if candidate and all((Path(candidate) / tool).is_file() for tool in _TOOLS):
            return Path(candidate)
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateCluster:
    """One PostgreSQL cluster in a temporary directory, controlled with ``pg_ctl``."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        # one cluster per test process: under pytest-xdist each worker (gw0, gw1, ...)
        # starts its own, named for it, on a port of its own (``free_port``)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "")
        self.root = Path(tempfile.mkdtemp(prefix=f"cairn-test-pg-{worker + '-' if worker else ''}"))
        self.data = self.root / "data"
        self.sockets = self.root / "sockets"
        self.log = self.root / "server.log"
        self.port = 0
        self.as_root = os.geteuid() == 0
        self.started = False

    @property
    def url(self) -> str:
        """Superuser URL of the ``postgres`` database (for administration)."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/postgres"

    def _command(self, tool: str, *args: str) -> list[str]:
        command = [str(self.bindir / tool), *args]
        if not self.as_root:
            return command
        if shutil.which("runuser"):
            return ["runuser", "-u", SERVER_USER, "--", *command]
        return ["su", SERVER_USER, "-s", "/bin/sh", "-c", shlex.join(command)]

    def _run(self, tool: str, *args: str, timeout: float = 120.0) -> None:
        # output to a file, never a pipe: the server pg_ctl forks inherits the
        # descriptors, and a pipe held open by it would never reach EOF
        with (self.root / "commands.log").open("ab") as out, processes.infrastructure():
            done = subprocess.run(self._command(tool, *args), stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(args)} failed ({done.returncode}): {self.log_tail()}")

    def log_tail(self, lines: int = 15) -> str:
        text = ""
        for path in (self.root / "commands.log", self.log):
            with contextlib.suppress(OSError):
                text += path.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def init(self) -> None:
        self.sockets.mkdir()
        if self.as_root:
            try:
                entry = pwd.getpwnam(SERVER_USER)
            except KeyError:
                raise RuntimeError(f"running as root, but there is no {SERVER_USER!r} user to run the "
                                   "server as (PostgreSQL refuses to run as root)") from None
            for path in (self.root, self.sockets):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        # --no-sync: initdb's own files need no flush (a crash of the machine
        # loses the whole throwaway cluster anyway); nor does the server (SETTINGS)
        self._run("initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8",
                  "--locale=C", "--no-sync", "--no-instructions")
        settings = dict(SETTINGS, unix_socket_directories=f"'{self.sockets}'")
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n# cairn tests\n" + "".join(f"{k} = {v}\n" for k, v in settings.items()))

    def _set_port(self, port: int) -> None:
        self.port = port
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(f"port = {port}\n")

    def start(self) -> None:
        """Start the server (on a free port the first time) and wait until it accepts connections."""
        if self.port:
            self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "120", "start")
        else:
            for attempt in range(5):  # the free port may be taken between the probe and the start
                self._set_port(free_port())
                try:
                    self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "120", "start")
                    break
                except RuntimeError:
                    if attempt == 4:
                        raise
        self.started = True
        self.wait_up()

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "120", "stop")

    def restart(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-m", mode, "-w", "-t", "120",
                  "restart")

    def running(self) -> bool:
        """Whether the postmaster is running (``pg_ctl status``)."""
        with processes.infrastructure():
            done = subprocess.run(self._command("pg_ctl", "-D", str(self.data), "status"),
                                  capture_output=True, timeout=30, check=False)
        return done.returncode == 0

    def is_up(self, timeout: int = 2) -> bool:
        try:
            with psycopg.connect(self.url, autocommit=True, connect_timeout=timeout) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def wait_up(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.is_up():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the test cluster did not accept connections in {timeout:.0f}s: "
                                   f"{self.log_tail()}")
            time.sleep(0.05)

    def destroy(self) -> None:
        """Stop the server (if running) and delete its directory."""
        if self.started:
            with contextlib.suppress(Exception):
                if self.running():
                    self.stop("immediate")  # throwaway data: no checkpoint needed
        shutil.rmtree(self.root, ignore_errors=True)


_lock = threading.Lock()
_cluster: PrivateCluster | None = None
_problem: Unavailable | None = None


def _start_private() -> PrivateCluster:
    bindir = find_bindir()
    if bindir is None:
        raise Unavailable(
            "no PostgreSQL server binaries (initdb, pg_ctl, postgres) on this machine: PostgreSQL tests "
            f"skipped (install the server, set {ENV_BINDIR}, or point {ENV_URL} at a server)", missing=True)
    cluster = PrivateCluster(bindir)
    try:
        cluster.init()
        cluster.start()
    except Exception as exc:
        tail = cluster.log_tail()
        cluster.destroy()
        raise Unavailable(f"cannot start a private PostgreSQL cluster with {bindir}: {exc} {tail}",
                          missing=False) from exc
    atexit.register(shutdown)
    return cluster


def private_cluster() -> PrivateCluster | None:
    """The cluster this session started (``None`` when the server is external or none was started)."""
    return _cluster


def admin_url() -> str:
    """The administration URL of the tests' server, starting the private
    cluster on first use; ``Unavailable`` if there is none."""
    global _cluster, _problem
    external = os.environ.get(ENV_URL)
    if external:
        return external
    with _lock:
        if _cluster is None and _problem is None:
            try:
                _cluster = _start_private()
            except Unavailable as exc:
                _problem = exc
        if _problem is not None:
            raise _problem
        assert _cluster is not None
        return _cluster.url


#: the reasons ``unavailable`` skipped tests for (the root conftest reports
#: each as one line, not one line per test)
SKIP_REASONS: set[str] = set()


def unavailable(reason: str) -> None:
    """Skip the calling test for ``reason``, or fail it when PostgreSQL is required."""
    if required():
        pytest.fail(f"{ENV_REQUIRE}=1 but {reason}", pytrace=False)
    SKIP_REASONS.add(reason)
    pytest.skip(reason)


def require() -> str:
    """``admin_url()`` for a test: skips (one reason for all) where there is
    no PostgreSQL, fails where it is required or where starting it broke."""
    if skip_requested():
        unavailable(f"{ENV_SKIP} is set: PostgreSQL tests skipped on purpose")
    try:
        return admin_url()
    except Unavailable as exc:
        if exc.missing:
            unavailable(str(exc))
        pytest.fail(str(exc), pytrace=False)
    raise AssertionError("unreachable")  # pragma: no cover


def ensure_running() -> None:
    """Start the private cluster again if a test left it stopped (finalizers
    that drop a database call this first)."""
    cluster = _cluster
    if cluster is not None and not cluster.is_up():
        if not cluster.running():
            cluster.start()
        cluster.wait_up()


def shutdown() -> None:
    """Stop and delete the private cluster (session end; idempotent)."""
    global _cluster
    with _lock:
        cluster, _cluster = _cluster, None
    if cluster is not None:
        cluster.destroy()
