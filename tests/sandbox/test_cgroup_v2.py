"""Which cgroup hierarchy the sandbox uses, and what it writes there, on
cgroup v2 and hybrid layouts this host (v1) does not have: ``cgroups.ROOT``
and this process's cgroup (``cgroups._own``) are pointed at a directory
laid out as the kernel lays one out. What this cannot test: the kernel's
own v2 behaviour (a real ``cgroup.procs`` move, ``memory.max`` enforced,
``memory.events``' counts); the v1 path is tested on the real hierarchy
(tests/sandbox/test_cgroups.py, the escape tests)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cairn.sandbox import cgroups


def layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, own: dict[str, str], delegated: str = "",
           v1: tuple[str, ...] = ()) -> Path:
    """A fake ``/sys/fs/cgroup``: a v2 root (``cgroup.controllers``) with this
    process's cgroup delegating ``delegated``, and a v1 directory per ``v1`` controller."""
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu io memory pids\n")
    mine = root / own[""].lstrip("/")
    mine.mkdir(parents=True, exist_ok=True)
    (mine / "cgroup.subtree_control").write_text(delegated + "\n")
    for controller in v1:
        (root / controller / own[controller].lstrip("/")).mkdir(parents=True)
    monkeypatch.setattr(cgroups, "ROOT", root)
    monkeypatch.setattr(cgroups, "_own", lambda controller: own.get(controller))
    return root


def test_v2_with_both_controllers_delegated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = layout(tmp_path, monkeypatch, own={"": "/worker.service"}, delegated="memory pids")
    for controller in ("pids", "memory"):
        where = cgroups.place(controller)
        assert where == cgroups.Place(controller, root / "worker.service", v2=True)
        assert where.join == "cgroup.procs"  # v2 has no `tasks`
    group = cgroups.Group.make(pids_max=64, memory_max=1 << 30)
    (path,) = group.paths  # one directory holds both controllers
    assert path.parent == root / "worker.service"
    assert path.name.startswith(cgroups.PREFIX)
    assert group.joins == (str(path / "cgroup.procs"),)
    assert (path / "pids.max").read_text() == "64"
    assert (path / "memory.max").read_text() == str(1 << 30)
    (path / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n")
    assert group.oom_kills() == 2  # v2 counts them in memory.events, not v1's memory.oom_control


def test_v2_swap_is_capped_where_the_kernel_offers_it(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    layout(tmp_path, monkeypatch, own={"": "/w"}, delegated="memory")
    path = tmp_path / "cgroup" / "w" / "g"
    path.mkdir()
    (path / "memory.swap.max").write_text("max")
    cgroups._limit_memory(path, 64 << 20, v2=True)
    assert (path / "memory.max").read_text() == str(64 << 20)
    assert (path / "memory.swap.max").read_text() == "0"  # swap would otherwise extend the limit


def test_v2_without_delegation_is_a_missing_control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    layout(tmp_path, monkeypatch, own={"": "/w"}, delegated="pids")
    assert cgroups.place("pids") is not None
    assert cgroups.place("memory") is None
    assert "memory delegated" in (cgroups.available("memory") or "")
    with pytest.raises(OSError, match="no writable memory cgroup"):
        cgroups.Group.make(pids_max=8, memory_max=1 << 20)


def test_hybrid_prefers_the_v1_controller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """systemd's hybrid layout: v1 controllers beside a v2 tree (``unified``);
    a controller mounted on v1 is used there (on the v2 tree it is not
    available: a controller lives in one hierarchy)."""
    root = layout(tmp_path, monkeypatch, own={"": "/", "memory": "/w", "pids": "/"}, delegated="",
                  v1=("memory", "pids"))
    memory = cgroups.place("memory")
    assert memory == cgroups.Place("memory", root / "memory" / "w", v2=False)
    assert memory.join == "tasks"
    assert cgroups.place("pids") == cgroups.Place("pids", root / "pids", v2=False)
