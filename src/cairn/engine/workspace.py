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
  the first to enter verifies it.
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
from pathlib import Path

from cairn.engine.execution import _TRANSACTING, Execution
from cairn.engine.signals import Abandon
from cairn.errors import CairnError, StoreError
from cairn.store.records import EventType
from cairn.workspace.objects import TREE, encode_tree, object_id, pack
from cairn.workspace.restore import restore
from cairn.workspace.scan import TreeCache, snapshot

#: the root id of an empty directory (never stored: ``_RunSource`` knows it)
EMPTY_ROOT = object_id(TREE, encode_tree([]))
_EMPTY_STORED = pack(TREE, encode_tree([]))
#: the key of a snapshot's root id in a journal entry's detail
DETAIL_KEY = "workspace"


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


class RunWorkspace:
    """One run's workspace directory on this worker, for one execution."""

    def __init__(self, execution: Execution, expected: str | None) -> None:
        workspaces = execution.runtime.workspaces
        self.execution = execution
        self.path: Path = workspaces.path_for(execution.run.tenant, execution.run_id)
        self.cache: TreeCache = workspaces.cache_for(self.path)
        #: the root id of the latest snapshot the journal records
        self.expected = expected or EMPTY_ROOT
        self._lock = threading.Lock()
        #: positions whose bodies are running now
        self._bodies: set[int] = set()
        #: the objects each captured but not yet recorded snapshot stored, by position
        self._unrecorded: dict[int, tuple[str, set[str]]] = {}

    def enter(self, position: int) -> None:
        """A body at ``position`` is about to run: the directory is made the
        latest recorded snapshot, unless a sibling body is running in it."""
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
        """Snapshot the directory after the body at ``position`` returned;
        its objects stored (fenced). The root id to record with the call."""
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
        """The call's entry naming ``root`` committed: it is the latest snapshot."""
        with self._lock:
            self.expected = root
            for position in [p for p, (r, _) in self._unrecorded.items() if r == root]:
                del self._unrecorded[position]

    def finished(self) -> None:
        """The run has ended (its end committed): its directory and cache go
        (every snapshot stays in the store, for ``cairn workspace`` and a retry)."""
        self.execution.runtime.workspaces.forget(self.path)

    def abandon(self, position: int) -> None:
        """The body at ``position`` failed (or its outcome was not recorded):
        whatever it wrote is undone by the next body's ``enter``. The objects
        its snapshot stored, if it took one, are no longer counted as stored:
        no recorded snapshot keeps them from the collector (``api.wscollect``),
        so a later snapshot that needs them stores them again."""
        with self._lock:
            self._bodies.discard(position)
            unrecorded = self._unrecorded.pop(position, None)
            if unrecorded is not None:
                self.cache.revoke(unrecorded[1])


def latest_root(execution: Execution) -> str | None:
    """The root id of the latest snapshot among the journal's live outcomes."""
    found: tuple[int, str] | None = None
    for entry in execution.journal.outcomes.values():
        detail = entry.detail
        if detail and entry.event is EventType.STEP_COMPLETED:
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
    if position is not None:
        with ws._lock:
            entered = position in ws._bodies
        if not entered:
            ws.enter(position)
    return ws.path


__all__ = ["DETAIL_KEY", "EMPTY_ROOT", "RunWorkspace", "attach", "current", "latest_root"]
