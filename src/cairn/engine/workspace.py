"""A run's workspace: a directory whose every change by a step or tool is
journaled with that call (``ctx.workspace``, ``op.workspace``,
``step_info().workspace``).

The protocol, around each step or tool body of a run that uses one:

* **before the body** (``enter``) the directory is made exactly the latest
  snapshot the journal records (an empty directory before the first): on a
  worker that holds a copy (even the one that just recorded it), it is
  verified by root id (a stat walk, through the stat cache) and what
  differs is restored; on a fresh worker it is restored from the store. So
  a failed attempt's or a crashed worker's half-written files, and changes
  workflow code made between calls, never reach the next body. Bodies
  running side by side in one execution share the live directory: only
  the first to enter verifies it. The exception: the tasks of a parallel
  graph super-step (``Branch``) each work in a directory of their own,
  made the super-step's starting snapshot, and their recorded trees are
  merged at its barrier (``merge_branches``, ``workspace.merge``) into the
  root its checkpoint records.
* **after the body** (``capture``) the directory is snapshotted; the objects
  the store lacks are stored by a holder write (``put_workspace_objects``,
  fenced: a worker that lost the run stores nothing and stops with
  ``LeaseLost``), then the root id goes into the detail of the call's
  journal entry (``detail["workspace"]``), which is itself a fenced append:
  the snapshot is the step's only if the step's entry commits. A crash in
  between leaves unreferenced objects, never a root without its objects.

Workflow code may hand the path around, but only step and tool bodies may
change the directory: a change made by workflow code between calls is not
a journaled effect, and the next body's ``enter`` undoes it. Transactional
steps may not use it (their files could not commit with their transaction).

A run starts using a workspace when its code first asks for it; a run whose
journal records a snapshot uses it on every worker from the first body on
(``current``).
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cairn.engine.execution import _TRANSACTING, Execution
from cairn.engine.signals import Abandon
from cairn.errors import CairnError, StoreError
from cairn.store.records import EventType
from cairn.workspace.merge import merge
from cairn.workspace.objects import TREE, encode_tree, object_id, pack
from cairn.workspace.restore import restore
from cairn.workspace.scan import TreeCache, snapshot
from cairn.workspace.trees import Objects

#: the root id of an empty directory (never stored: ``_RunSource`` knows it)
EMPTY_ROOT = object_id(TREE, encode_tree([]))
_EMPTY_STORED = pack(TREE, encode_tree([]))
#: the key of a snapshot's root id in a journal entry's detail
DETAIL_KEY = "workspace"
#: the key of a parallel branch's ``[super-step, task index]`` in its calls' details (``Branch``)
BRANCH_KEY = "workspace_branch"


class _RunSource:
    """The objects of one tenant, through the store (a failure of the store
    abandons the execution, like any of its reads)."""

    def __init__(self, execution: Execution) -> None:
        self.store = execution.store
        self.tenant = execution.run.tenant
        self.run_id = execution.run_id

    def fetch(self, oids: Collection[str]) -> dict[str, bytes]:
        wanted = [o for o in oids if o != EMPTY_ROOT]
        try:
            found = self.store.workspace_objects(self.tenant, wanted) if wanted else {}
        except StoreError as exc:
            raise Abandon(f"cannot read the workspace of run {self.run_id}: {exc}") from exc
        if len(wanted) != len(oids):
            found[EMPTY_ROOT] = _EMPTY_STORED
        return found


@dataclass(frozen=True, slots=True)
class Branch:
    """One task of a graph super-step of several (``graph.runner`` sets it
    for the task's flow): its bodies work in a directory of their own, made
    ``base`` (the super-step's starting snapshot) before its first body."""

    #: the super-step (the number of the checkpoint it starts from)
    step: int
    #: the task's index in the super-step
    index: int
    #: the task's node (for a conflict's message)
    node: str
    #: the root id of the super-step's starting snapshot
    base: str

    @property
    def key(self) -> list[int]:
        return [self.step, self.index]


#: the branch the current flow runs in (``None``: the run's own directory)
BRANCH: ContextVar[Branch | None] = ContextVar("cairn_workspace_branch", default=None)


class _Tree:
    """One directory of a run on this worker: the run's own, or a branch's."""

    def __init__(self, execution: Execution, path: Path, expected: str) -> None:
        self.execution = execution
        self.path = path
        self.cache: TreeCache = execution.runtime.workspaces.cache_for(path)
        #: the root id of the latest snapshot the journal records for this directory
        self.expected = expected
        self._lock = threading.Lock()
        #: positions whose bodies are running now
        self._bodies: set[int] = set()
        #: the objects each captured but not yet recorded snapshot stored, by position
        self._unrecorded: dict[int, tuple[str, set[str]]] = {}

    def running(self, position: int) -> bool:
        with self._lock:
            return position in self._bodies

    def enter(self, position: int) -> None:
        with self._lock:
            busy = bool(self._bodies)
            self._bodies.add(position)
            if busy:
                return
        # verified even on the worker that recorded it: workflow code (or anything else on this
        # machine) may have changed the directory since; a stat walk, files read only if changed
        try:
            self._ensure()
        except BaseException:
            self.abandon(position)
            raise

    def _ensure(self) -> None:
        want, path, cache = self.expected, self.path, self.cache
        warm = cache.root is not None and path.is_dir()
        if warm and snapshot(path, cache, None).root == want:
            return  # verified by root id: nothing read but files whose stat changed
        # warm: the scan just saw the disk, so the restore visits only directories that differ
        restore(path, want, _RunSource(self.execution), cache, trust_cache=warm)
        if want == EMPTY_ROOT:  # the source made it up: the store may not have it
            cache.known.discard(EMPTY_ROOT)

    def capture(self, position: int) -> str:
        ex = self.execution

        def sink(batch: dict[str, bytes]) -> None:
            try:
                ex.store.put_workspace_objects(ex.run_id, ex.epoch, batch)
            except StoreError as exc:
                raise Abandon(f"cannot store the workspace of run {ex.run_id}: {exc}") from exc

        try:
            self.path.mkdir(parents=True, exist_ok=True)
            scan = snapshot(self.path, self.cache, sink)
            with self._lock:
                self._unrecorded[position] = (scan.root, scan.sent)
            return scan.root
        finally:
            with self._lock:
                self._bodies.discard(position)

    def recorded(self, root: str) -> None:
        with self._lock:
            self.expected = root
            for position in [p for p, (r, _) in self._unrecorded.items() if r == root]:
                del self._unrecorded[position]

    def abandon(self, position: int) -> None:
        with self._lock:
            self._bodies.discard(position)
            unrecorded = self._unrecorded.pop(position, None)
            if unrecorded is not None:
                self.cache.revoke(unrecorded[1])


class RunWorkspace:
    """One run's workspace on this worker, for one execution: the run's
    directory, and one per task of a parallel graph super-step (``Branch``):
    each method acts on the directory of the calling flow's branch."""

    def __init__(self, execution: Execution, expected: str | None) -> None:
        self.execution = execution
        self.main = _Tree(execution, execution.runtime.workspaces.path_for(execution.run.tenant,
                                                                             execution.run_id),
                          expected or EMPTY_ROOT)
        self._lock = threading.Lock()
        #: the directories of branches, by ``Branch.key``
        self._branches: dict[tuple[int, int], _Tree] = {}

    @property
    def path(self) -> Path:
        """The calling flow's directory."""
        return self._tree().path

    @property
    def expected(self) -> str:
        """The run's latest recorded snapshot (its own directory's)."""
        return self.main.expected

    def _tree(self) -> _Tree:
        branch = BRANCH.get()
        if branch is None:
            return self.main
        key = (branch.step, branch.index)
        with self._lock:
            tree = self._branches.get(key)
            if tree is None:
                # one directory per task index, kept from super-step to super-step (a warm
                # restore touches only what differs); a sibling of the run's, never inside it
                path = self.main.path.with_name(f"{self.main.path.name}.b{branch.index}")
                start = branch_roots(self.execution, branch.step).get(branch.index, branch.base)
                tree = self._branches[key] = _Tree(self.execution, path, start)
            return tree

    def running(self, position: int) -> bool:
        return self._tree().running(position)

    def enter(self, position: int) -> None:
        """A body at ``position`` is about to run: the calling flow's
        directory is made its latest recorded snapshot, unless a sibling
        body is running in it."""
        self._tree().enter(position)

    def capture(self, position: int) -> dict[str, Any]:
        """Snapshot the calling flow's directory after the body at
        ``position`` returned; its objects stored (fenced). The detail to
        record with the call: the root id, and the branch if in one."""
        root = self._tree().capture(position)
        branch = BRANCH.get()
        return {DETAIL_KEY: root} if branch is None else {DETAIL_KEY: root, BRANCH_KEY: branch.key}

    def recorded(self, root: str) -> None:
        """The call's entry naming ``root`` committed: it is the latest snapshot."""
        self._tree().recorded(root)

    def merged(self, root: str) -> None:
        """A super-step's checkpoint recorded ``root``, its branches' merge."""
        self.main.recorded(root)

    def finished(self) -> None:
        """The run has ended (its end committed): its directories and caches go
        (every snapshot stays in the store, for ``cairn workspace`` and a retry)."""
        workspaces = self.execution.runtime.workspaces
        path = self.main.path
        workspaces.forget(path)
        if path.parent.is_dir():
            for branch in path.parent.glob(f"{path.name}.b*"):
                workspaces.forget(branch)

    def abandon(self, position: int) -> None:
        """The body at ``position`` failed (or its outcome was not recorded):
        whatever it wrote is undone by the next body's ``enter``. The objects
        its snapshot stored, if it took one, are no longer counted as stored:
        no recorded snapshot keeps them from the collector (``api.wscollect``),
        so a later snapshot that needs them stores them again."""
        self._tree().abandon(position)


def branch_roots(execution: Execution, step: int) -> dict[int, str]:
    """The latest snapshot each branch of super-step ``step`` recorded, by
    task index, from the journal's live outcomes (a branch that recorded
    none is absent: its tree is the super-step's base)."""
    found: dict[int, tuple[int, str]] = {}
    for entry in execution.journal.outcomes.values():
        detail = entry.detail
        if not detail or entry.event is not EventType.STEP_COMPLETED:
            continue
        key, root = detail.get(BRANCH_KEY), detail.get(DETAIL_KEY)
        if (isinstance(key, list) and len(key) == 2 and key[0] == step and isinstance(key[1], int)
                and isinstance(root, str)):
            seen = found.get(key[1])
            if seen is None or entry.seq > seen[0]:
                found[key[1]] = (entry.seq, root)
    return {index: root for index, (_, root) in found.items()}


def merge_branches(execution: Execution, step: int, base: str, nodes: list[str]) -> str | None:
    """The merged root of super-step ``step``'s branches (``nodes`` in task
    order), its new trees stored by a holder write (fenced); ``None`` if no
    branch recorded a snapshot. ``WorkspaceConflict`` if two changed one
    path differently: then nothing is stored."""
    roots = branch_roots(execution, step)
    if not roots:
        return None
    named = [node if nodes.count(node) == 1 else f"{node}[{i}]" for i, node in enumerate(nodes)]
    merged = merge(Objects(_RunSource(execution), base), base,
                   [(named[i], roots.get(i, base)) for i in range(len(nodes))])
    if merged.new:
        try:
            execution.store.put_workspace_objects(execution.run_id, execution.epoch, merged.new)
        except StoreError as exc:
            raise Abandon(f"cannot store the workspace of run {execution.run_id}: {exc}") from exc
    return merged.root


def latest_root(execution: Execution) -> str | None:
    """The root id of the latest snapshot among the journal's live outcomes."""
    found: tuple[int, str] | None = None
    for entry in execution.journal.outcomes.values():
        detail = entry.detail
        if detail and entry.event is EventType.STEP_COMPLETED and BRANCH_KEY not in detail:
            root = detail.get(DETAIL_KEY)
            if isinstance(root, str) and (found is None or entry.seq > found[0]):
                found = (entry.seq, root)
    return found[1] if found is not None else None


def current(execution: Execution) -> RunWorkspace | None:
    """The run's workspace if it uses one (its journal records a snapshot, or
    its code asked for it)."""
    ws: RunWorkspace | None = execution.workspace
    if ws is None and not execution.workspace_checked:
        execution.workspace_checked = True
        root = latest_root(execution)
        if root is not None:
            ws = execution.workspace = RunWorkspace(execution, root)
    return ws


def attach(execution: Execution | None, position: int | None = None) -> Path:
    """The run's workspace directory, which the run uses from now on. From
    a body (``position``): the directory is made the latest snapshot now, as
    ``enter`` would have, and the body's changes are captured after it."""
    if execution is None:
        raise CairnError("a workspace is only available inside a running workflow, step or tool")
    if _TRANSACTING.get() is execution:
        raise CairnError("a transactional step cannot use the workspace: its files cannot commit with "
                         "the database transaction (use a step or a tool)")
    with execution._lock:
        ws = current(execution)
        if ws is None:
            ws = execution.workspace = RunWorkspace(execution, None)
    if position is not None and not ws.running(position):
        ws.enter(position)
    return ws.path


__all__ = ["BRANCH", "BRANCH_KEY", "DETAIL_KEY", "EMPTY_ROOT", "Branch", "RunWorkspace", "attach",
           "branch_roots", "current", "latest_root", "merge_branches"]
