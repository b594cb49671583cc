"""Escape attempts from a standard-tier sandbox: each must fail, from a
sandbox launched for its command (cold) and from one launched ahead and
handed the command (warm, ``cairn.sandbox.pool``): every test runs both.

Every test also checks that its hostile code really ran (it prints what it
saw), so a sandbox that failed to start cannot pass as one that held. The
hostile writes target files these tests made; nothing of the host is
written.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cairn.sandbox import Limits, Policy, Result, run, run_python
from cairn.sandbox.pool import Pool
from tests.sandbox.conftest import Listener, UdpListener

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True, params=("cold", "warm"))
def launch(request: pytest.FixtureRequest, ws: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``warm``: this module's ``run`` and ``run_python`` hand each command
    to a sandbox of a pool, launched for it ahead (one for the default
    policy before the test starts, as a worker's pool would hold), and
    check that a pooled sandbox ran it."""
    if request.param == "cold":
        yield "cold"
        return
    pool = Pool(size=2, refill=False)
    pool.prepare(ws)

    def warm(call: Any) -> Any:
        def launched(command: Any, workspace: Path, policy: Policy | None = None, **kwargs: Any) -> Result:
            pool.prepare(workspace, policy)
            result: Result = call(command, workspace, policy, **kwargs)
            assert result.warm, pool.last_failure
            return result
        return launched

    module = sys.modules[__name__]
    monkeypatch.setattr(module, "run", warm(pool.run))
    monkeypatch.setattr(module, "run_python", warm(pool.run_python))
    yield "warm"
    pool.close()


def attempt(code: str, ws: Path, policy: Policy | None = None) -> dict[str, object]:
    """Run ``code`` (which sets ``seen``, a dict) in a sandbox; ``seen`` as it printed it."""
    result = run_python(code + "\nimport json\nprint(json.dumps(seen))", ws, policy)
    assert result.exit_code == 0, result
    found: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return found


# -- network -------------------------------------------------------------------------------------


def test_no_host_port_is_reachable(ws: Path, listener: Listener, pg_url: str) -> None:
    from psycopg.conninfo import conninfo_to_dict

    pg = conninfo_to_dict(pg_url)
    pg_port = int(pg.get("port") or 5432)
    seen = attempt(f"""
import socket
seen = {{}}
for name, host, port in [("listener", "127.0.0.1", {listener.port}), ("postgres", "127.0.0.1", {pg_port}),
                         ("postgres-v6", "::1", {pg_port}), ("default-pg", "127.0.0.1", 5432)]:
    try:
        socket.create_connection((host, port), timeout=2).close()
        seen[name] = "connected"
    except OSError as exc:
        seen[name] = type(exc).__name__
seen["interfaces"] = sorted(line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:])
""", ws)
    assert listener.accepted == 0
    assert "connected" not in seen.values(), seen
    assert seen["interfaces"] == ["lo"]  # its own loopback, nothing else


def test_dns_never_reaches_a_resolver(ws: Path, udp_listener: UdpListener) -> None:
    query = bytes.fromhex("abcd01000001000000000000076578616d706c6503636f6d0000010001")  # example.com A
    seen = attempt(f"""
import socket
seen = {{}}
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    s.sendto({query!r}, ("127.0.0.1", {udp_listener.port}))
    seen["sent"] = "sent into the sandbox's own loopback"
except OSError as exc:
    seen["sent"] = type(exc).__name__
try:
    socket.getaddrinfo("example.com", 443)
    seen["resolve"] = "resolved"
except OSError as exc:
    seen["resolve"] = type(exc).__name__
for line in open("/etc/resolv.conf") if __import__("os").path.exists("/etc/resolv.conf") else []:
    if line.startswith("nameserver"):
        try:
            s.sendto({query!r}, (line.split()[1], 53))
            s.settimeout(1)
            s.recvfrom(512)
            seen["host-resolver"] = "answered"
        except OSError as exc:
            seen["host-resolver"] = type(exc).__name__
""", ws)
    assert udp_listener.received() == 0
    assert seen["resolve"] != "resolved", seen
    assert seen.get("host-resolver") != "answered", seen


# -- files ---------------------------------------------------------------------------------------


def test_host_files_are_not_there(tmp_path: Path, ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = tmp_path / "other-run"
    other.mkdir()
    (other / "secret.txt").write_text("another run's file")
    db = tmp_path / "cairn.db"
    db.write_text("the database")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("CAIRN_TEST_SECRET", "hunter2-in-the-environment")
    targets = [str(other / "secret.txt"), str(db), str(home / ".ssh" / "id_ed25519"), "/proc/1/environ",
               "/proc/self/environ", "/etc/shadow", "/root/.ssh", os.path.expanduser("~/.ssh/id_ed25519")]
    seen = attempt(f"""
import os
seen = {{}}
for path in {targets!r}:
    try:
        with open(path, "rb") as f:
            seen[path] = f.read().decode("latin-1")
    except OSError as exc:
        seen[path] = type(exc).__name__
seen["cwd"] = os.getcwd()
seen["writable-root"] = "no"
try:
    open("/evil", "w")
    seen["writable-root"] = "yes"
except OSError:
    pass
""", ws)
    for path in [*targets[:3], "/etc/shadow", "/root/.ssh", targets[-1]]:
        assert seen[path] in ("FileNotFoundError", "PermissionError", "IsADirectoryError"), (path, seen[path])
    for path in ("/proc/1/environ", "/proc/self/environ"):
        assert "hunter2" not in str(seen[path]), seen[path]
        assert str(home) not in str(seen[path]), seen[path]
    assert seen["cwd"] == "/workspace"
    assert seen["writable-root"] == "no"
    assert not (other / "evil").exists()


def test_only_the_workspace_and_tmp_are_writable(ws: Path) -> None:
    result = run(["sh", "-c", "echo kept > /workspace/out.txt; echo gone > /tmp/t.txt; "
                              "touch /usr/evil /etc/passwd 2>&1; echo done"], ws)
    assert result.exit_code == 0
    assert "done" in result.stdout
    assert "Read-only file system" in result.stdout or "Permission denied" in result.stdout
    assert (ws / "out.txt").read_text() == "kept\n"
    assert not Path("/usr/evil").exists()


# -- kernel surface ------------------------------------------------------------------------------


def test_ptrace_bpf_and_nested_namespaces_are_refused(ws: Path) -> None:
    seen = attempt("""
import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
seen = {}
def call(name, *args):
    ctypes.set_errno(0)
    rc = libc.syscall(*args)
    seen[name] = "ok" if rc >= 0 else os.strerror(ctypes.get_errno())
call("ptrace", 101, 0, 0, 0, 0)                  # ptrace(PTRACE_TRACEME)
call("ptrace-attach", 101, 16, 1, 0, 0)           # ptrace(PTRACE_ATTACH, 1)
call("bpf", 321, 0, 0, 0)                         # bpf(BPF_MAP_CREATE, NULL, 0)
call("unshare-user", 272, 0x10000000)             # unshare(CLONE_NEWUSER)
call("unshare-mount", 272, 0x00020000)            # unshare(CLONE_NEWNS): no capability
call("keyctl", 250, 0, -3, 0)                     # keyctl(KEYCTL_GET_KEYRING_ID, session)
call("mount", 165, 0, 0, 0, 0, 0)
for name, family in (("netlink", socket.AF_NETLINK), ("unix", socket.AF_UNIX), ("packet", 17)):
    try:
        socket.socket(family, socket.SOCK_RAW if family != socket.AF_UNIX else socket.SOCK_STREAM).close()
        seen[name] = "ok"
    except OSError as exc:
        seen[name] = exc.strerror
try:  # the family as a 64-bit value with high bits set: the kernel truncates it to AF_UNIX
    seen["unix-high-bits"] = "ok" if libc.syscall(41, ctypes.c_long(0x100000001), 1, 0) >= 0 else \\
        os.strerror(ctypes.get_errno())
except OSError as exc:
    seen["unix-high-bits"] = str(exc)
""", ws)
    assert all(value != "ok" for value in seen.values()), seen
    assert seen["ptrace"] == seen["bpf"] == seen["keyctl"] == "Operation not permitted", seen


def test_nested_user_namespace_via_unshare_command_fails(ws: Path) -> None:
    result = run(["sh", "-c", "unshare -U id 2>&1; echo rc=$?"], ws)
    assert result.exit_code == 0, result
    assert "rc=0" not in result.stdout, result
    assert "rc=" in result.stdout, result


# -- resources -----------------------------------------------------------------------------------


def test_fork_bomb_is_contained(ws: Path) -> None:
    result = run_python("""
import os, time
started = refused = 0
for _ in range(200):
    try:
        pid = os.fork()
    except OSError:
        refused += 1
        continue
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    started += 1
print(started, refused, flush=True)
""", ws, Policy(limits=Limits(processes=20, wall_seconds=60)))
    started, refused = (int(n) for n in result.stdout.split())
    assert started < 20, result
    assert refused == 200 - started, result
    assert not result.timed_out  # the command returned: its sleeping children died with the sandbox


def test_memory_bomb_is_contained(ws: Path) -> None:
    result = run_python("b = bytearray(512 << 20)\nprint('allocated')", ws,
                        Policy(limits=Limits(memory_bytes=256 << 20)))
    assert "allocated" not in result.stdout, result
    assert "MemoryError" in result.stderr, result


def test_a_memory_bomb_of_many_processes_is_killed_by_the_memory_cgroup(ws: Path) -> None:
    """Six processes, each under the per-process address-space limit, that
    together want 2.5 times the sandbox's memory: the memory cgroup holds
    them to ``memory_bytes`` (the kernel's OOM killer acts inside it, not on
    the host), the result says so, and the host and the next sandbox are fine."""
    limit = 160 << 20
    result = run_python("""
import os, sys, time
children = []
for i in range(6):
    pid = os.fork()
    if pid == 0:
        block = b"x" * (64 << 20)  # written: every page resident, charged to the sandbox
        print("child", i, "holds", len(block), flush=True)
        time.sleep(1)
        os._exit(0)
    children.append(pid)
codes = [os.waitpid(pid, 0)[1] for pid in children]
print("started", len(children), "killed", sum(os.WIFSIGNALED(c) for c in codes), flush=True)
""", ws, Policy(limits=Limits(memory_bytes=limit, wall_seconds=60)))
    assert result.oom_killed, result
    assert result.as_dict()["oom_killed"] is True
    assert not result.timed_out, result
    # How many children printed "holds" says nothing: the OOM killer may take a child after its
    # print, freeing room for the next (CI saw all six print, with oom_killed and most killed).
    # What holds them to the limit shows in the kills: 384 MiB wanted at once, 2 blocks fit.
    if "started 6" in result.stdout:  # the parent survived: it saw some children killed
        killed = int(result.stdout.split("killed")[1].split()[0])
        assert killed >= 6 - (limit // (64 << 20)), result
    after = run_python("print('next sandbox ok')", ws)
    assert after.stdout == "next sandbox ok\n", after
    assert not after.oom_killed, after


def test_disk_bombs_are_contained(ws: Path) -> None:
    policy = Policy(limits=Limits(file_bytes=4 << 20, tmp_bytes=8 << 20))
    result = run_python("""
import os
seen = {}
for path, n in (("/workspace/big.bin", 16), ("/tmp/a.bin", 3), ("/tmp/b.bin", 3), ("/tmp/c.bin", 3)):
    try:
        with open(path, "wb") as f:
            for _ in range(n):
                f.write(bytes(1 << 20))
        seen[path] = "written"
    except OSError as exc:
        seen[path] = exc.strerror
print(seen)
""", ws, policy)
    assert "File too large" in result.stdout, result
    assert "No space left on device" in result.stdout, result
    assert (ws / "big.bin").stat().st_size <= 4 << 20


def test_cpu_bomb_is_stopped(ws: Path) -> None:
    result = run_python("while True: pass", ws, Policy(limits=Limits(cpu_seconds=1, wall_seconds=60)))
    assert not result.timed_out, result
    assert result.exit_code in (-9, -24, 137, 152), result  # SIGXCPU / SIGKILL


def _survivors(marker: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(pid)
    return found


def test_no_process_survives_the_timeout(ws: Path) -> None:
    marker = f"cairn-survivor-{os.getpid()}-{time.monotonic_ns()}"
    sleeper = f"python3 -c 'import time; time.sleep(300)' {marker}"
    script = (f"({sleeper} &) ; setsid {sleeper} & nohup {sleeper} >/dev/null 2>&1 & "
              f"sh -c \"{sleeper} &\" ; echo started; {sleeper}")
    result = run(["sh", "-c", script], ws, Policy(limits=Limits(wall_seconds=3)))
    assert result.timed_out, result
    assert "started" in result.stdout, result
    deadline = time.monotonic() + 5
    while _survivors(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _survivors(marker) == []


def test_daemons_die_when_the_command_exits(ws: Path) -> None:
    marker = f"cairn-daemon-{os.getpid()}-{time.monotonic_ns()}"
    result: Result = run_python(f"""
import os, subprocess
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp("python3", ["python3", "-c", "import time; time.sleep(300)", "{marker}"])
    os._exit(0)
print("detached")
""", ws)
    assert result.exit_code == 0, result
    assert "detached" in result.stdout, result
    deadline = time.monotonic() + 5
    while _survivors(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _survivors(marker) == []


def test_no_process_survives_an_interrupted_call(ws: Path) -> None:
    """The caller is interrupted while the command runs (here a signal handler
    raising, as Ctrl-C would): the sandbox is killed before the exception
    leaves ``run``."""
    import signal

    marker = f"cairn-interrupted-{os.getpid()}-{time.monotonic_ns()}"

    def interrupt(signum: int, frame: object) -> None:
        raise RuntimeError("interrupted")

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        with pytest.raises(RuntimeError, match="interrupted"):
            run_python(f"import time, sys\nprint('{marker}', flush=True)\ntime.sleep(60)", ws,
                       Policy(limits=Limits(wall_seconds=60)))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert _survivors(marker) == []
