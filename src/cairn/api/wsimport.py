"""Starting a run from a git repository's tree (``App.start(...,
workspace_from=path, workspace_ref=ref)``).

The tree of ``ref`` in the repository at a local path becomes the run's
first snapshot, recorded before its first step: files with their
executable bit (git keeps no other mode: ``0o755`` or ``0o644``), symlinks
as symlinks, submodules as empty directories, and never a ``.git`` entry.
It is read with the ``git`` command (``ls-tree`` and ``cat-file``: no
checkout, no hooks, the repository's own configuration and filters not
applied) into a private temporary directory, which is snapshotted there.

Everything that can fail on the input (not a repository, an unknown ref,
an entry git should never have held) fails before the run exists: nothing
is stored. Then the run is created already held by this process
(``create_claimed_run``), the tree's objects stored by that holder write
(fenced, for the run's tenant), the root recorded as a ``step.completed``
entry at position ``IMPORT_POSITION`` (before every step's, so no call of
the workflow meets it, an operator retry or rewind never voids it, and a
worker's ``engine.workspace.latest_root`` finds it like any snapshot), and
the run given back to the workers. A failure after the run is created
cancels it.

A crash of this process between creating the run and recording the root
leaves a run with the importer's claim and no import entry
(``engine.wsimported``): the worker that recovers it (after the import's
lease, at least ``IMPORT_LEASE_SECONDS``) fails it with a message saying
why instead of running it on an empty directory, and starting it again
under the same id is refused with that message (a new id imports
cleanly). The objects already stored are unreferenced: the collector takes
them. The tree is read and snapshotted before the run is created, so the
lease covers only database writes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from cairn import faults
from cairn.engine.workspace import DETAIL_KEY
from cairn.engine.wsimported import IMPORT_NAME, IMPORT_POSITION, unfinished_import
from cairn.errors import InvalidArgument
from cairn.faults import fault_point
from cairn.store.contract import Store
from cairn.store.records import EventType, HistoryEvent, NewRun
from cairn.workspace.objects import MAX_NAME
from cairn.workspace.scan import TreeCache, snapshot

#: the least lease the importer holds the new run with: storing a large tree's objects must not
#: outlast it (a worker would take the run over before its starting workspace is recorded)
IMPORT_LEASE_SECONDS = 600.0
#: objects stored per holder write
_BATCH = 256
_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0",
        "GIT_OPTIONAL_LOCKS": "0"}


class GitImportError(InvalidArgument):
    """A repository, ref or tree that cannot become a run's starting workspace."""


class _GitFailed(Exception):
    """A git command failed; ``why``: the last line it wrote to stderr."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def _git(repo: Path, *args: str, data: bytes | None = None) -> bytes:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], input=data, capture_output=True,
                              env={**os.environ, **_ENV}, check=False)
    except FileNotFoundError:
        raise GitImportError("cannot import a git repository: the git command is not installed") from None
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        raise _GitFailed(lines[-1] if lines else f"git {args[0]} exited with {done.returncode}")
    return done.stdout


def resolve(path: str | os.PathLike[str], ref: str) -> tuple[Path, str]:
    """The repository at ``path`` (its top, or a bare repository itself,
    never a directory inside one) and the commit id ``ref`` names in it."""
    repo = Path(path).expanduser().absolute()
    if not repo.is_dir():
        raise GitImportError(f"cannot import {repo}: not a directory")
    try:
        said = _git(repo, "rev-parse", "--is-bare-repository", "--absolute-git-dir").decode()
        bare, git_dir = [*said.split("\n"), "", ""][:2]
        top = git_dir if bare == "true" else _git(repo, "rev-parse", "--show-toplevel").decode().strip()
    except _GitFailed as exc:
        raise GitImportError(f"cannot import {repo}: not a git repository ({exc.why})") from None
    if Path(top).resolve() != repo.resolve():
        raise GitImportError(f"cannot import {repo}: not the top of a git repository (it is inside {top})")
    if not ref or ref.startswith("-") or "\0" in ref:
        raise GitImportError(f"cannot import {repo}: {ref!r} is not a ref")
    try:
        commit = _git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}")
    except _GitFailed:
        raise GitImportError(f"cannot import {repo}: unknown ref {ref!r}") from None
    return repo, commit.decode().strip()


def _entries(repo: Path, commit: str) -> list[tuple[str, str, str, bytes]]:
    """``(mode, type, object id, path)`` of every entry of the commit's tree, parents first."""
    try:
        out = _git(repo, "ls-tree", "-r", "-t", "-z", "--full-tree", commit)
    except _GitFailed as exc:
        raise GitImportError(f"cannot import {repo}: git ls-tree failed ({exc.why})") from None
    found: list[tuple[str, str, str, bytes]] = []
    for record in out.split(b"\0"):
        if not record:
            continue
        head, _, name = record.partition(b"\t")
        mode, kind, oid = head.decode().split(" ")
        parts = name.split(b"/")
        if any(not p or p in (b".", b"..") or len(p) > MAX_NAME or p.lower() == b".git" for p in parts):
            raise GitImportError(f"cannot import {repo} at {commit[:12]}: the tree holds an entry that "
                                 f"cannot be a file of a workspace: {name!r}")
        found.append((mode, kind, oid, name))
    return found


def _blobs(repo: Path, oids: list[str]) -> dict[str, bytes]:
    """The content of each blob (one ``git cat-file --batch``)."""
    if not oids:
        return {}
    try:
        out = _git(repo, "cat-file", "--batch", data="".join(f"{o}\n" for o in oids).encode())
    except _GitFailed as exc:
        raise GitImportError(f"cannot import {repo}: git cat-file failed ({exc.why})") from None
    found: dict[str, bytes] = {}
    at = 0
    for oid in oids:
        end = out.index(b"\n", at)
        head = out[at:end].decode().split(" ")
        if len(head) != 3 or head[1] != "blob":
            raise GitImportError(f"cannot import {repo}: git cannot read blob {oid} ({' '.join(head[1:])})")
        size = head[2]
        start = end + 1
        found[oid] = out[start:start + int(size)]
        at = start + int(size) + 1
    return found


def materialize(repo: Path, commit: str, dest: Path) -> None:
    """Write the commit's tree into the empty directory ``dest``."""
    entries = _entries(repo, commit)
    blobs = _blobs(repo, list(dict.fromkeys(o for m, k, o, _ in entries if k == "blob")))
    root = os.fsencode(dest)
    for mode, kind, oid, name in entries:
        target = root + b"/" + name
        if kind == "tree" or kind == "commit":  # a submodule: an empty directory, as a checkout leaves it
            os.mkdir(target, 0o755)
            os.chmod(target, 0o755)
        elif mode == "120000":
            os.symlink(blobs[oid], target)
        else:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                view = memoryview(blobs[oid])
                while view:
                    view = view[os.write(fd, view):]
                os.fchmod(fd, 0o755 if mode == "100755" else 0o644)
            finally:
                os.close(fd)
    os.chmod(dest, 0o755)


def tree_of(path: str | os.PathLike[str], ref: str) -> tuple[str, str, dict[str, bytes]]:
    """``(commit, root id, objects)`` of the tree ``ref`` names in repository ``path``."""
    repo, commit = resolve(path, ref)
    objects: dict[str, bytes] = {}
    scratch = Path(tempfile.mkdtemp(prefix="cairn-import-"))
    try:
        tree = scratch / "tree"
        tree.mkdir()
        materialize(repo, commit, tree)
        root = snapshot(tree, TreeCache(), objects.update).root
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return commit, root, objects


def start_from_git(store: Store, new: NewRun, path: str | os.PathLike[str], ref: str, lease_seconds: float,
                   clock: Callable[[], float] = time.time) -> bool:
    """Create ``new`` with the tree of ``ref`` as its starting workspace;
    ``False`` (nothing imported) if a run with its id exists."""
    commit, root, objects = tree_of(path, ref)  # every input error is raised here, before anything is stored
    if store.get_run(new.run_id) is not None:
        if unfinished_import(store.history_headers(new.run_id)):
            raise GitImportError(f"run {new.run_id} exists, but its starting workspace was never recorded "
                                 "(an earlier import stopped before it finished): a worker fails it rather "
                                 "than run it without its tree; import again under a new run id")
        return False
    claim = store.create_claimed_run(new, IMPORT_NAME, max(lease_seconds, IMPORT_LEASE_SECONDS))
    if claim is None:
        if store.get_run(new.run_id) is None:
            return False  # pragma: no cover - raced by another start of the same id, then deleted
        store.cancel_run(new.run_id, "its starting workspace could not be imported: its queue did not "
                                     "admit it at once")
        raise GitImportError(f"run {new.run_id}: its queue does not admit it now, so its git workspace "
                             "cannot be imported; cancelled")
    epoch, seq = claim.run.epoch, claim.next_seq
    try:
        batch: dict[str, bytes] = {}
        for oid, data in objects.items():
            batch[oid] = data
            if len(batch) >= _BATCH:
                store.put_workspace_objects(new.run_id, epoch, batch)
                batch = {}
        store.put_workspace_objects(new.run_id, epoch, batch)
        if faults.ARMED:
            fault_point("workspace.import.after_objects")
        now = clock()
        store.append(new.run_id, epoch, [HistoryEvent(
            run_id=new.run_id, seq=seq, event=EventType.STEP_COMPLETED, at=now, epoch=epoch,
            worker=IMPORT_NAME, position=IMPORT_POSITION, step_kind="step", name=IMPORT_NAME, attempt=1,
            started_at=now,
            detail={DETAIL_KEY: root, "git": {"commit": commit, "ref": ref}})])
        store.release_run(new.run_id, epoch, HistoryEvent(
            run_id=new.run_id, seq=seq + 1, event=EventType.RUN_RELEASED, at=clock(), epoch=epoch,
            worker=IMPORT_NAME, detail={"reason": "starting workspace imported"}))
    except BaseException:
        store.cancel_run(new.run_id, "its starting workspace could not be imported")
        raise
    return True


__all__ = ["IMPORT_NAME", "IMPORT_POSITION", "GitImportError", "materialize", "resolve", "start_from_git",
           "tree_of"]
