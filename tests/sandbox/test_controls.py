"""A control the host lacks: the sandbox refuses to start naming it, or
runs without it only when the policy says so (and the result says it did).
Controls go missing for real here: ``bwrap`` off the ``PATH``, ``pyseccomp``
unimportable; the per-process caches are cleared around each test."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from cairn.cli.main import main
from cairn.sandbox import Limits, Policy, SandboxUnavailable, cgroups, controls, run, run_python, seccomp

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _fresh_checks() -> Iterator[None]:
    controls.check.cache_clear()
    seccomp.filter_bytes.cache_clear()
    yield
    controls.check.cache_clear()
    seccomp.filter_bytes.cache_clear()


def test_all_controls_on_this_host(ws: Path) -> None:
    done = CliRunner().invoke(main, ["sandbox", "check"])
    assert done.exit_code == 0, done.output
    names = [line.split()[1] for line in done.output.splitlines()]
    assert names == ["bwrap", "namespaces", "processes", "memory", "rlimits", "seccomp", "python"]
    assert all(line.startswith("ok ") for line in done.output.splitlines())


def test_missing_bwrap_refuses_with_its_name(ws: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    controls.check.cache_clear()  # the ws fixture checked them with bwrap there
    with pytest.raises(SandboxUnavailable, match=r"^sandbox control unavailable: bwrap \(bubblewrap is not"):
        run(["true"], ws, Policy(allow_degraded=frozenset({"seccomp", "processes"})))
    assert not list(ws.iterdir())
    done = CliRunner().invoke(main, ["sandbox", "check"])
    assert done.exit_code == 1
    assert "MISSING  bwrap" in done.output


def test_missing_seccomp_refuses_unless_allowed(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyseccomp", None)  # as if the sandbox extra were not installed
    controls.check.cache_clear()
    seccomp.filter_bytes.cache_clear()
    with pytest.raises(SandboxUnavailable, match=r"sandbox control unavailable: seccomp .*'sandbox' extra"):
        run(["true"], ws)
    degraded = run_python("import ctypes\nprint(ctypes.CDLL(None).syscall(101, 0, 0, 0, 0))", ws,
                          Policy(allow_degraded=frozenset({"seccomp"})))
    assert degraded.degraded == ("seccomp",)
    assert degraded.stdout.strip() == "0"  # ptrace(PTRACE_TRACEME) allowed: weaker, and it says so


def test_missing_cgroups_refuse_unless_allowed(ws: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """No cgroup hierarchy where the sandbox looks for one (as on a host
    without cgroups delegated): both the process and the memory limit are
    missing, each refuses by name until allowed, and a degraded run says
    which it ran without (its per-process rlimits still hold)."""
    monkeypatch.setattr(cgroups, "ROOT", tmp_path / "no-cgroups")
    controls.check.cache_clear()
    unavailable = r"^sandbox control unavailable: "
    with pytest.raises(SandboxUnavailable, match=unavailable + r"processes \(no writable pids"):
        run(["true"], ws)
    with pytest.raises(SandboxUnavailable, match=unavailable + r"memory \(no writable memory"):
        run(["true"], ws, Policy(allow_degraded={"processes"}))
    without = Policy(limits=Limits(memory_bytes=32 << 20), allow_degraded={"processes", "memory"})
    degraded = run_python("b = bytearray(64 << 20)\nprint('ran')", ws, without)
    assert degraded.degraded == ("memory", "processes"), degraded
    assert "MemoryError" in degraded.stderr, degraded
    assert not degraded.oom_killed, degraded
    done = CliRunner().invoke(main, ["sandbox", "check"])
    assert done.exit_code == 1
    assert "MISSING  memory" in done.output
    assert "MISSING  processes" in done.output
