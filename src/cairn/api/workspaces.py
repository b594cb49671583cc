"""Reading runs' workspaces: the snapshots a run recorded, their files, the
diff between two, a checkout of any one, and a git export of them all
(``cairn workspace ls|diff|restore|export``; ``Operator.workspaces``).

A snapshot is named by the journal position of the step or tool whose
entry records it (``detail["workspace"]``, ``engine.workspace``); without
one, the run's latest. Objects are read for the run's tenant only and
checked on read (``cairn.workspace.trees``), so a damaged or hostile store
row is refused before anything is written. ``restore`` writes into a
directory that is new or empty (``force`` to make a non-empty one exact,
which deletes what the snapshot does not hold).

The git export is git's model of a tree, which is narrower than a
snapshot's: one commit per snapshot, in journal order, with the entry's
time as the commit's; empty directories are not kept, modes only as
executable or not, and a ``.git`` entry of a snapshot not at all.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from cairn.api.wscollect import GRACE_SECONDS, Collected, collect
from cairn.errors import InvalidArgument, RunNotFound, WorkspaceError
from cairn.store.contract import Store
from cairn.store.records import EventType
from cairn.workspace.objects import Entry
from cairn.workspace.restore import Restored, restore
from cairn.workspace.scan import TreeCache
from cairn.workspace.trees import Change, Objects, diff, walk

#: entries that void the journal from ``detail["from_position"]`` on (engine.journal)
_CUTS = (EventType.RUN_RETRIED, EventType.RUN_REWOUND)
#: the key of a snapshot's root id in a journal entry's detail (engine.workspace.DETAIL_KEY)
_DETAIL_KEY = "workspace"
#: the key naming the graph branch (super-step, task index) a snapshot is of (engine.workspace.BRANCH_KEY)
_BRANCH_KEY = "workspace_branch"


class NoSnapshot(InvalidArgument):
    """The run has snapshots, but none at the position asked for."""


@dataclass(frozen=True, slots=True)
class SnapshotRef:
    """One recorded snapshot: the entry that records it and its root id."""

    run_id: str
    position: int
    seq: int
    kind: str
    name: str
    root: str
    at: float
    #: the parallel graph branch it is of, (super-step, task index); ``None``: the run's own
    branch: tuple[int, int] | None = None

    def as_dict(self) -> dict[str, object]:
        return {"run_id": self.run_id, "position": self.position, "seq": self.seq, "kind": self.kind,
                "name": self.name, "root": self.root, "at": self.at,
                "branch": None if self.branch is None else list(self.branch)}


class _TenantSource:
    def __init__(self, store: Store, tenant: str) -> None:
        self.store, self.tenant = store, tenant

    def fetch(self, oids: Collection[str]) -> dict[str, bytes]:
        return self.store.workspace_objects(self.tenant, oids)


class WorkspaceViews:
    """Reads of runs' workspace snapshots (through ``Operator.workspaces``)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def snapshots(self, run_id: str, *, branches: bool = False) -> list[SnapshotRef]:
        """Every snapshot of the run's own tree its live journal records,
        oldest first; with ``branches``, those of its parallel graph
        branches too (each task of a super-step works in a tree of its own,
        merged into the run's at the super-step's end)."""
        if self._store.get_run(run_id) is None:
            raise RunNotFound(run_id)
        found: dict[int, SnapshotRef] = {}
        for e in self._store.history_headers(run_id):
            if e.event is EventType.STEP_COMPLETED and e.detail and e.position is not None:
                root = e.detail.get(_DETAIL_KEY)
                branch = _branch_of(e.detail.get(_BRANCH_KEY))
                if isinstance(root, str) and (branches or branch is None):
                    # a later outcome of a position (after a rewind) replaces it
                    found[e.position] = SnapshotRef(run_id, e.position, e.seq, e.step_kind or "",
                                                    e.name or "", root, e.at, branch)
            elif e.event in _CUTS and e.detail and e.detail.get("from_position") is not None:
                cut = int(e.detail["from_position"])  # outcomes from there on are void (engine.journal)
                for position in [p for p in found if p >= cut]:
                    del found[position]
        return sorted(found.values(), key=lambda s: s.seq)

    def pick(self, run_id: str, position: int | None = None) -> SnapshotRef:
        """The snapshot recorded at ``position`` (a branch's too; ``None``:
        the latest of the run's own tree)."""
        shots = self.snapshots(run_id, branches=position is not None)
        if not shots:
            raise InvalidArgument(f"run {run_id} has recorded no workspace snapshot")
        if position is None:
            return shots[-1]
        for shot in shots:
            if shot.position == position:
                return shot
        raise NoSnapshot(f"run {run_id} recorded no workspace snapshot at position {position} (it has "
                              f"{', '.join(str(s.position) for s in shots)})")

    def collect(self, tenant: str | None = None, *, grace_seconds: float = GRACE_SECONDS,
                dry_run: bool = False) -> list[Collected]:
        """Delete the workspace objects no recorded snapshot of an existing
        run needs, stored more than ``grace_seconds`` ago (``api.wscollect``)."""
        return collect(self._store, tenant, grace=grace_seconds, dry_run=dry_run)

    def objects(self, run_id: str, root: str) -> Objects:
        return Objects(_TenantSource(self._store, self._tenant(run_id)), root)

    def files(self, run_id: str, position: int | None = None) -> tuple[SnapshotRef, list[tuple[str, Entry]]]:
        """Every entry of a snapshot, as ``(path, entry)``, depth first."""
        shot = self.pick(run_id, position)
        return shot, list(walk(self.objects(run_id, shot.root), shot.root))

    def diff(self, run_id: str, old: int | None = None, new: int | None = None
             ) -> tuple[SnapshotRef | None, SnapshotRef, list[Change]]:
        """What changed from snapshot ``old`` to ``new`` (``new`` default: the
        latest; ``old`` default: the snapshot before ``new``, none for the first)."""
        after = self.pick(run_id, new)
        if old is None:  # the one before it in its own line (a branch's: else the run's it started from)
            line = self.snapshots(run_id, branches=after.branch is not None)
            earlier = [s for s in line if s.seq < after.seq and s.branch == after.branch] \
                or [s for s in line if s.seq < after.seq and s.branch is None]
            before = earlier[-1] if earlier else None
        else:
            before = self.pick(run_id, old)
        objects = self.objects(run_id, after.root)
        return before, after, diff(objects, before.root if before else None, after.root)

    def restore(self, run_id: str, position: int | None, dest: Path, *, force: bool = False
                ) -> tuple[SnapshotRef, Restored]:
        """Write a snapshot into ``dest`` exactly (new or empty, unless ``force``)."""
        shot = self.pick(run_id, position)
        _check_destination(dest, force)
        return shot, restore(dest, shot.root, _TenantSource(self._store, self._tenant(run_id)), TreeCache())

    def export_git(self, run_id: str, dest: Path) -> list[tuple[SnapshotRef, str]]:
        """A git repository at ``dest`` (new or empty) with one commit per
        snapshot, oldest first, checked out at the latest; the commits' ids."""
        shots = self.snapshots(run_id)
        if not shots:
            raise InvalidArgument(f"run {run_id} has recorded no workspace snapshot")
        if shutil.which("git") is None:
            raise WorkspaceError("git is not installed: the export needs the git command")
        _check_destination(dest, force=False)
        dest.mkdir(parents=True, exist_ok=True)
        source = _TenantSource(self._store, self._tenant(run_id))
        cache = TreeCache()
        commits: list[tuple[SnapshotRef, str]] = []
        _git(dest, "init", "-q")
        with tempfile.TemporaryDirectory(prefix="cairn-export-") as scratch:
            tree = Path(scratch) / "tree"
            for shot in shots:
                restore(tree, shot.root, source, cache)
                where = ["--git-dir", str(dest / ".git"), "--work-tree", str(tree)]
                _git(dest, *where, "add", "-A", "--", ".")
                stamp = f"@{int(shot.at)} +0000"
                _git(dest, *where, "commit", "-q", "--allow-empty", "--no-verify", "-m",
                     f"{shot.kind} {shot.name} (run {run_id}, position {shot.position})\n\n"
                     f"cairn-workspace-root: {shot.root}", date=stamp)
                commits.append((shot, _git(dest, "rev-parse", "HEAD").strip()))
        _git(dest, "reset", "-q", "--hard")
        return commits

    def _tenant(self, run_id: str) -> str:
        record = self._store.get_run(run_id)
        if record is None:
            raise RunNotFound(run_id)
        return record.tenant


def _check_destination(dest: Path, force: bool) -> None:
    if dest.is_symlink():
        raise InvalidArgument(f"{dest} is a symlink: give the directory itself")
    if dest.exists() and not dest.is_dir():
        raise InvalidArgument(f"{dest} exists and is not a directory")
    if dest.exists() and any(dest.iterdir()) and not force:
        raise InvalidArgument(f"{dest} is not empty: a restore makes it exactly the snapshot, deleting "
                              "what the snapshot does not hold (--force to do so)")


def _git(cwd: Path, *args: str, date: str | None = None) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "cairn", "GIT_AUTHOR_EMAIL": "cairn@localhost",
           "GIT_COMMITTER_NAME": "cairn", "GIT_COMMITTER_EMAIL": "cairn@localhost",
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0"}
    if date is not None:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = date
    done = subprocess.run(["git", "-c", "core.symlinks=true", "-c", "init.defaultBranch=main", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise WorkspaceError(f"git {args[0] if args else ''} failed: {done.stderr.strip()[:500]}")
    return done.stdout


__all__ = ["NoSnapshot", "SnapshotRef", "WorkspaceViews"]


def _branch_of(found: object) -> tuple[int, int] | None:
    """A snapshot's ``workspace_branch`` detail as (super-step, task index)."""
    if isinstance(found, list) and len(found) == 2 and all(isinstance(v, int) for v in found):
        return (found[0], found[1])
    return None
