"""The gVisor tier (``Policy(tier="gvisor")``): the command runs under
``runsc`` in a bundle of its own, sees only the standard tier's binds, has
no network, is not root, and nothing of it outlives the call.

Few launches on purpose (each ``runsc`` start costs ~0.25 s). Skipped only
where ``runsc`` is absent and ``CAIRN_REQUIRE_GVISOR`` is not set (CI sets
it, so a missing ``runsc`` fails there rather than skipping).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

import pytest

from cairn.errors import InvalidArgument
from cairn.sandbox import Limits, Policy, bwrap, run, run_python
from cairn.sandbox.controls import SandboxUnavailable
from cairn.sandbox.policy import Egress
from tests.sandbox.conftest import Listener

_ABSENT = shutil.which("runsc") is None and not os.environ.get("CAIRN_REQUIRE_GVISOR")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(_ABSENT, reason="no runsc and CAIRN_REQUIRE_GVISOR unset")]

GVISOR = Policy(tier="gvisor")


@pytest.fixture
def gws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A workspace; the run's bundle and state go under ``tmp_path/runs``
    (so a test can see what is left of them, whatever else runs at once)."""
    bwrap.etc_view()  # made once per process, outside this test's directories
    runs = tmp_path / "runs"
    runs.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(runs))
    path = tmp_path / "workspace"
    path.mkdir()
    return path


def test_runs_as_non_root_and_workspace_writes_persist(gws: Path) -> None:
    code = ("import os, sys; print(os.getuid(), os.getgid(), os.getcwd(), sys.stdin.read());"
            "open('made.txt', 'w').write('kept'); print('err', file=sys.stderr); sys.exit(7)")
    result = run_python(code, gws, GVISOR, stdin=b"fed", env={"X": "1"})
    assert result.stdout.split() == ["1000", "1000", "/workspace", "fed"]
    assert result.stderr == "err\n"
    assert result.exit_code == 7
    assert not result.timed_out
    assert (gws / "made.txt").read_text() == "kept"


def test_host_files_outside_the_binds_cannot_be_read(gws: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host-secret")
    db = tmp_path / "cairn.db"
    with sqlite3.connect(db) as conn:
        conn.execute("create table t (v text)")
        conn.execute("insert into t values ('db-secret')")
    conn.close()
    code = f"""
import os
for path in ({str(secret)!r}, {str(db)!r}, '/root', '/home', '/var', '/run', '/etc/shadow'):
    try:
        data = open(path, 'rb').read() if not os.path.isdir(path) else str(os.listdir(path)).encode()
        print('READ', path, data[:200])
    except OSError as exc:
        print('DENIED', path, type(exc).__name__)
print('ROOT', sorted(os.listdir('/')))
"""
    result = run_python(code, gws, GVISOR)
    assert result.exit_code == 0, result.stderr
    assert "ROOT" in result.stdout  # it really ran
    assert "READ" not in result.stdout
    assert "host-secret" not in result.stdout
    assert "db-secret" not in result.stdout
    assert result.stdout.count("DENIED") == 7


def test_no_host_tcp_listener_is_reachable(gws: Path, listener: Listener) -> None:
    code = f"""
import socket
s = socket.socket()
s.settimeout(3)
try:
    s.connect(('127.0.0.1', {listener.port}))
    print('CONNECTED')
except OSError as exc:
    print('REFUSED', type(exc).__name__)
"""
    result = run_python(code, gws, GVISOR)
    assert "REFUSED" in result.stdout, result.stdout + result.stderr
    assert listener.accepted == 0


def _host_processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{pid}: {cmdline}")
    return found


def test_killed_at_timeout_and_nothing_is_left(gws: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    policy = Policy(tier="gvisor", limits=Limits(wall_seconds=3))  # room for a slow start under load
    result = run(["/bin/sh", "-c", "sleep 300 & setsid sleep 300 & echo started; sleep 300"], gws, policy)
    assert result.timed_out
    assert result.exit_code == -9
    assert result.stdout == "started\n"  # it ran, then was killed
    assert _host_processes_mentioning(str(runs)) == []  # no runsc, gofer or sandbox process survives
    assert list(runs.iterdir()) == []  # its bundle and state are gone (so is the container's record)


def test_missing_runsc_is_a_clear_error_never_a_fallback(gws: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(SandboxUnavailable, match=r"^sandbox tier 'gvisor' unavailable: runsc is not "):
        run(["/usr/bin/touch", "ran"], gws, GVISOR)
    assert not (gws / "ran").exists()


def test_bad_tier_and_gvisor_egress_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="tier 'firecracker' is not one of"):
        Policy(tier="firecracker")
    with pytest.raises(InvalidArgument, match="does not support egress"):
        Policy(tier="gvisor", egress=Egress(hosts=("example.com",)))


def test_process_and_memory_limits_hold(gws: Path) -> None:
    forks = """
import os
n = 0
try:
    for _ in range(40):
        if os.fork() == 0:
            import time; time.sleep(30); os._exit(0)
        n += 1
except OSError as exc:
    print('STOPPED', n, exc.errno, flush=True)
os._exit(0)
"""
    result = run_python(forks, gws, Policy(tier="gvisor", limits=Limits(processes=10, wall_seconds=20)))
    assert result.stdout.split()[:3] == ["STOPPED", "9", "11"], result.stdout + result.stderr  # EAGAIN
    big = "x = bytearray(1 << 30); print('ALLOCATED')"
    small = Limits(memory_bytes=256 << 20, wall_seconds=20)
    result = run_python(big, gws, Policy(tier="gvisor", limits=small))
    assert "ALLOCATED" not in result.stdout
    assert result.exit_code != 0
