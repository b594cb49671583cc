"""A directory per parallel graph branch, merged at the super-step's barrier.

``merge`` alone (pure, no database): disjoint changes combine, identical
ones agree, different ones are ``WorkspaceConflict`` naming the path and the
nodes, a removed directory under which another branch changed something is
a conflict on the directory, and the merged root is what a scan of the
merged directory computes. Through the engine (``ws-branches`` in
``wsapps``), on SQLite and PostgreSQL: each parallel node finds the
super-step's starting snapshot (never a sibling's files), the checkpoint
records the merge, the next node finds it, the root is the same whatever
order the branches finished in, and a conflict fails the run with nothing
of the super-step recorded. (The SIGKILL test is test_branches_kill.py.)
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn import RunStatus
from cairn.engine.workspace import BRANCH_KEY, DETAIL_KEY
from cairn.errors import RunFailed, WorkspaceConflict
from cairn.graph.checkpoints import KIND
from cairn.workspace import Objects, TreeCache, restore, snapshot
from cairn.workspace.merge import merge
from tests.engine.conftest import postgres_url
from tests.workspace.wsapps import build, root_of

BACKENDS = ("sqlite", "postgres")


# -- the merge alone ---------------------------------------------------------------


class _Memory:
    """Objects in a dict (what a snapshot's sink stored)."""

    def __init__(self) -> None:
        self.stored: dict[str, bytes] = {}

    def fetch(self, oids: Any) -> dict[str, bytes]:
        return {o: self.stored[o] for o in oids if o in self.stored}


def _tree(memory: _Memory, where: Path, files: dict[str, str]) -> str:
    where.mkdir(parents=True)
    for rel, text in files.items():
        (where / rel).parent.mkdir(parents=True, exist_ok=True)
        (where / rel).write_text(text)
    return snapshot(where, TreeCache(), memory.stored.update).root


BASE = {"keep.txt": "k", "gone.txt": "g", "sub/a.txt": "a", "sub/deep/x.txt": "x"}


def test_disjoint_changes_combine_into_the_tree_a_scan_computes(tmp_path: Path) -> None:
    memory = _Memory()
    base = _tree(memory, tmp_path / "base", BASE)
    left = _tree(memory, tmp_path / "left", {**BASE, "left.txt": "l", "sub/l.txt": "l"})
    right_files = {k: v for k, v in BASE.items() if k != "gone.txt"}
    right = _tree(memory, tmp_path / "right", {**right_files, "sub/deep/r.txt": "r", "new/r.txt": "r"})
    expected = _tree(memory, tmp_path / "expected", {**right_files, "left.txt": "l", "sub/l.txt": "l",
                                                    "sub/deep/r.txt": "r", "new/r.txt": "r"})
    merged = merge(Objects(memory, base), base, [("left", left), ("right", right)])
    assert merged.root == expected
    assert merge(Objects(memory, base), base, [("right", right), ("left", left)]).root == expected
    # every tree it built is stored with it; restoring the result gives the expected files
    memory.stored.update(merged.new)
    restore(tmp_path / "restored", merged.root, memory, TreeCache())
    assert root_of(tmp_path / "restored") == expected
    # a branch that changed nothing, or only one branch changing: no tree to build
    assert merge(Objects(memory, base), base, [("a", base), ("b", left)]).root == left
    assert merge(Objects(memory, base), base, [("a", base), ("b", base)]).new == {}


def test_identical_changes_agree_different_ones_conflict(tmp_path: Path) -> None:
    memory = _Memory()
    base = _tree(memory, tmp_path / "base", BASE)
    same_a = _tree(memory, tmp_path / "a", {**BASE, "sub/both.txt": "same", "a.txt": "a"})
    same_b = _tree(memory, tmp_path / "b", {**BASE, "sub/both.txt": "same", "b.txt": "b"})
    expected = _tree(memory, tmp_path / "e", {**BASE, "sub/both.txt": "same", "a.txt": "a", "b.txt": "b"})
    assert merge(Objects(memory, base), base, [("a", same_a), ("b", same_b)]).root == expected

    other = _tree(memory, tmp_path / "c", {**BASE, "sub/both.txt": "other"})
    with pytest.raises(WorkspaceConflict, match=r"'sub/both.txt'.*'a', 'c'") as caught:
        merge(Objects(memory, base), base, [("a", same_a), ("c", other)])
    assert caught.value.path == "sub/both.txt"
    assert caught.value.nodes == ("a", "c")


def test_a_removed_directory_conflicts_with_a_change_under_it(tmp_path: Path) -> None:
    memory = _Memory()
    base = _tree(memory, tmp_path / "base", BASE)
    removed = _tree(memory, tmp_path / "rm", {"keep.txt": "k", "gone.txt": "g"})
    changed = _tree(memory, tmp_path / "ch", {**BASE, "sub/deep/x.txt": "changed"})
    with pytest.raises(WorkspaceConflict, match="'sub'") as caught:
        merge(Objects(memory, base), base, [("rm", removed), ("ch", changed)])
    assert caught.value.nodes == ("rm", "ch")
    # a file made a directory by one branch and rewritten by the other
    as_dir = _tree(memory, tmp_path / "d", {**{k: v for k, v in BASE.items() if k != "keep.txt"},
                                            "keep.txt/inner": "i"})
    rewritten = _tree(memory, tmp_path / "w", {**BASE, "keep.txt": "new"})
    with pytest.raises(WorkspaceConflict, match=r"'keep\.txt'"):
        merge(Objects(memory, base), base, [("d", as_dir), ("w", rewritten)])


# -- through the engine ------------------------------------------------------------


@pytest.fixture(params=BACKENDS)
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[cairn.App]:
    if request.param == "postgres":
        db = postgres_url(request.getfixturevalue("pg_url"))
    else:
        db = f"sqlite:///{tmp_path}/cairn.db"
    application = build(db, tmp_path / "workspaces", lease_seconds=5.0)
    yield application
    application.close()


def checkpoint_roots(app: cairn.App, run_id: str) -> dict[str, str]:
    """The workspace root each checkpoint entry records, by entry name."""
    return {e.name or "": e.detail[DETAIL_KEY] for e in app.history(run_id)
            if e.event is cairn.EventType.STEP_COMPLETED and e.step_kind == KIND and e.detail
            and DETAIL_KEY in e.detail}


def step_roots(app: cairn.App, run_id: str) -> list[tuple[Any, str]]:
    """``(branch key or None, root)`` of each step entry recording a snapshot."""
    return [(e.detail.get(BRANCH_KEY), e.detail[DETAIL_KEY]) for e in app.history(run_id)
            if e.event is cairn.EventType.STEP_COMPLETED and e.step_kind != KIND and e.detail
            and DETAIL_KEY in e.detail]


def _run(app: cairn.App, run_id: str, edits: dict[str, Any]) -> dict[str, Any]:
    handle = app.start("ws-branches", {"edits": edits, "seen": []}, run_id=run_id)
    app.worker(concurrency=1).run(max_idle=0.5)
    handle.result(timeout=30)
    return dict(app.graph_state(run_id))


SETUP = {"writes": {"base.txt": "base", "sub/keep.txt": "keep"}}


def test_parallel_nodes_each_find_the_base_and_their_changes_merge(app: cairn.App, tmp_path: Path) -> None:
    edits = {"setup": SETUP,
             "left": {"writes": {"left.txt": "l", "sub/l.txt": "l"}, "removes": ["base.txt"]},
             "right": {"writes": {"right.txt": "r", "sub/r.txt": "r"}}}
    state = _run(app, "b1", edits)
    seen = dict(state["seen"])
    steps = step_roots(app, "b1")
    setup_root = steps[0][1]
    assert steps[0][0] is None  # setup ran alone: in the run's own directory
    assert seen["left"] == seen["right"] == setup_root  # each branch found the base, not its sibling's files
    assert sorted(key for key, _ in steps[1:3]) == [[1, 0], [1, 1]]
    merged = checkpoint_roots(app, "b1")
    assert len(merged) == 1
    (root,) = merged.values()
    assert seen["join"] == root  # the next super-step found the merged tree
    assert steps[3] == (None, root)  # join changed nothing: its snapshot is the merge

    class Source:
        def fetch(self, oids: Any) -> dict[str, bytes]:
            return app.store.workspace_objects("default", list(oids))

    out = tmp_path / "restored"
    restore(out, root, Source(), TreeCache())
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == ["left.txt", "right.txt", "sub/keep.txt", "sub/l.txt", "sub/r.txt"]
    # the run's line of snapshots (ls, diff, export) leaves the branches' out; asked, it has them
    views = app.operator.workspaces
    own = views.snapshots("b1")
    assert [s.branch for s in own] == [None] * len(own)
    assert [s.root for s in own][-2:] == [root, root]  # the merge's checkpoint, then join's step
    everything = views.snapshots("b1", branches=True)
    assert sorted(s.branch for s in everything if s.branch is not None) == [(1, 0), (1, 1)]
    assert views.pick("b1").root == root
    # the run ended: its directory and its branches' are gone
    main = app.runtime.workspaces.path_for("default", "b1")
    assert not main.exists()
    assert not list(main.parent.glob(main.name + ".b*"))
    assert app.get_run("b1").status is RunStatus.COMPLETED


def test_the_merge_is_the_same_whatever_order_the_branches_finish_in(app: cairn.App) -> None:
    roots = []
    for i, (slow, fast) in enumerate([("left", "right"), ("right", "left")]):
        edits = {"setup": SETUP,
                 "left": {"writes": {"left.txt": "l", "sub/keep.txt": "by left"}},
                 "right": {"writes": {"right.txt": "r"}, "removes": ["base.txt"]}}
        edits[slow]["delay"] = random.uniform(0.15, 0.3)
        edits[fast]["delay"] = random.uniform(0.0, 0.02)
        _run(app, f"o{i}", edits)
        finished = [key[1] for key, _ in step_roots(app, f"o{i}") if key is not None]
        assert finished == ([1, 0] if slow == "left" else [0, 1])  # they did finish in that order
        roots.append(checkpoint_roots(app, f"o{i}"))
    assert list(roots[0].values()) == list(roots[1].values())


def test_a_conflict_fails_the_run_naming_the_path_and_the_nodes(app: cairn.App) -> None:
    edits = {"setup": SETUP,
             "left": {"writes": {"sub/keep.txt": "left's"}},
             "right": {"writes": {"sub/keep.txt": "right's"}}}
    handle = app.start("ws-branches", {"edits": edits, "seen": []}, run_id="c1")
    app.worker(concurrency=1).run(max_idle=0.5)
    says = r"super-step 2: workspace conflict at 'sub/keep\.txt'.*'left', 'right'"
    with pytest.raises(RunFailed, match=says):
        handle.result(timeout=10)
    assert checkpoint_roots(app, "c1") == {}  # no checkpoint of the super-step, merged or not
    assert len(app.checkpoints("c1")) == 2  # the input's and setup's


def test_objects_packed_and_unpacked_in_threads_at_once_stay_intact() -> None:
    """Parallel branches snapshot and restore in several threads at once:
    zstandard's compressor is not thread-safe, and one shared by all
    threads wrote corrupt objects (found by the PostgreSQL run above)."""
    import os
    import threading

    from cairn.workspace.objects import BLOB, object_id, pack, unpack

    failures: list[str] = []
    start = threading.Barrier(4, timeout=10)

    def work() -> None:
        start.wait()
        for _ in range(30):
            data = os.urandom(1 << 14) * 8  # compressible, distinct per call
            oid = object_id(BLOB, data)
            try:
                if unpack(oid, pack(BLOB, data)) != (BLOB, data):
                    failures.append(oid)
            except Exception as exc:
                failures.append(f"{oid}: {exc}")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
