"""Collecting workspace objects that no snapshot of an existing run needs
(``cairn workspace gc``; ``Operator.workspaces.collect``).

An object is kept while a snapshot recorded in the journal of any existing
run of its tenant reaches it (whatever that run's status: a finished run's
snapshots stay readable until retention deletes the run). A collection of
one tenant is two phases:

* **mark**: take ``before`` = the store's clock minus ``grace``, *then* read
  every recorded root (``workspace_roots``) and walk their trees and chunk
  lists (every object read is checked; a missing or damaged one aborts the
  collection, which then deletes nothing);
* **sweep**: page through the objects last stored before ``before``
  (``workspace_candidates``, by id) and delete those the mark did not reach
  (``delete_workspace_objects``), one transaction per page.

The race with a snapshot taken meanwhile is settled by the store, not by
timing: every delete is conditioned on the row still being last stored
before ``before``, and storing an object that exists moves its time to now.
A snapshot whose root is not recorded yet needs only objects that it
stored (or stored again) since it began, which the sweep cannot delete, and
objects that its run's recorded snapshots reach (a worker's cache counts an
object as stored only then: ``TreeCache.revoke`` forgets those of a snapshot
that was never recorded), which the mark reached. The one assumption: a
step records its snapshot within ``grace`` of storing its objects.

Resumable: a sweep can stop anywhere (a crash, a ``limit``) and the next
one, from the cursor it returned or from the start, finds what is left;
nothing is ever half deleted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cairn.engine.workspace import EMPTY_ROOT
from cairn.errors import InvalidArgument, WorkspaceError
from cairn.store.contract import Store
from cairn.workspace.objects import CHUNK, CHUNKS, DIR, FILE, TREE, decode_tree, split_chunks, unpack
from cairn.workspace.trees import FETCH_BATCH

#: objects stored less than this long before a collection began are never collected
GRACE_SECONDS = 3600.0
#: objects examined per sweep page (one delete transaction each)
PAGE = 1000


@dataclass(slots=True)
class Collected:
    """What one tenant's collection found and did."""

    tenant: str
    #: snapshot roots recorded in the tenant's journals
    roots: int = 0
    #: objects those snapshots reach
    reachable: int = 0
    #: objects older than the grace period looked at, and how many of them were deleted
    examined: int = 0
    deleted: int = 0
    #: where a sweep stopped early resumes (``None``: it finished)
    cursor: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {"tenant": self.tenant, "roots": self.roots, "reachable": self.reachable,
                "examined": self.examined, "deleted": self.deleted, "cursor": self.cursor}


class Collector:
    """One tenant's collection: ``mark`` then ``sweep`` (tests run a
    snapshot between the two, the race the store's fence settles)."""

    def __init__(self, store: Store, tenant: str, *, grace: float = GRACE_SECONDS) -> None:
        if not grace >= 0:
            raise InvalidArgument(f"grace must be a number of seconds >= 0, not {grace!r}")
        self.store, self.tenant, self.grace = store, tenant, grace
        self.before: float | None = None
        self.live: set[str] = set()
        self.done = Collected(tenant)

    def mark(self) -> None:
        # the time first: an object stored after it is safe whatever the roots read next say
        self.before = self.store.clock() - self.grace
        roots = self.store.workspace_roots(self.tenant)
        self.done.roots = len(roots)
        reached = self._reach(roots)
        self.done.reachable = len(reached)
        # the rows' keys: under encryption an object's row is at its keyed address, not its id
        self.live = self.store.workspace_keys(self.tenant, reached)

    def sweep(self, after: str = "", *, limit: int | None = None, dry_run: bool = False) -> Collected:
        """Delete what the mark did not reach, from id ``after`` on; stop
        after about ``limit`` examined objects (``cursor`` says where)."""
        if self.before is None:
            raise WorkspaceError("a workspace collection sweeps only after its mark")
        done, cursor = self.done, after
        while True:
            page = self.store.workspace_candidates(self.tenant, self.before, cursor, PAGE)
            if not page:
                done.cursor = None
                return done
            dead = [o for o in page if o not in self.live]
            done.examined += len(page)
            if dead and not dry_run:
                done.deleted += self.store.delete_workspace_objects(self.tenant, dead, self.before)
            elif dry_run:
                done.deleted += len(dead)
            cursor = page[-1]
            if len(page) < PAGE:
                done.cursor = None
                return done
            if limit is not None and done.examined >= limit:
                done.cursor = cursor
                return done

    def _fetch(self, oids: list[str]) -> dict[str, bytes]:
        found: dict[str, bytes] = {}
        for i in range(0, len(oids), FETCH_BATCH):
            found.update(self.store.workspace_objects(self.tenant, oids[i:i + FETCH_BATCH]))
        missing = [o for o in oids if o not in found]
        if missing:
            raise WorkspaceError(f"tenant {self.tenant!r}: workspace object {missing[0]} is recorded by a "
                                 f"snapshot but not stored ({len(missing)} missing): nothing collected")
        return found

    def _reach(self, roots: Iterable[str]) -> set[str]:
        """Every object the snapshots ``roots`` need: their trees, read level
        by level, and the blobs of their files (a large file's chunk list is
        read for its blobs)."""
        live: set[str] = set()
        # an empty root is never stored (the engine makes it up); an empty subdirectory's tree is
        level = [r for r in dict.fromkeys(roots) if r != EMPTY_ROOT]
        while level:
            level = [o for o in dict.fromkeys(level) if o not in live]
            live.update(level)
            stored = self._fetch(level)
            deeper: list[str] = []
            lists: list[str] = []
            for oid in level:
                kind, data = unpack(oid, stored[oid])
                if kind != TREE:
                    raise WorkspaceError(f"workspace object {oid} is recorded as a tree but is not one: "
                                         "nothing collected")
                for e in decode_tree(oid, data):
                    ref = str(e.ref)
                    if e.kind == DIR:
                        deeper.append(ref)
                    elif e.kind == FILE and ref not in live:
                        live.add(ref)
                        if e.size > CHUNK:  # a chunk list: its blobs too
                            lists.append(ref)
            for i in range(0, len(lists), FETCH_BATCH):
                batch = lists[i:i + FETCH_BATCH]
                for oid, raw in self._fetch(batch).items():
                    kind, data = unpack(oid, raw)
                    if kind == CHUNKS:
                        live.update(split_chunks(oid, data))
            level = deeper
        return live


def collect(store: Store, tenant: str | None = None, *, grace: float = GRACE_SECONDS,
            dry_run: bool = False) -> list[Collected]:
    """Collect the workspace objects of ``tenant`` (``None``: every tenant
    that has any), each tenant marked and swept in turn."""
    tenants = [tenant] if tenant is not None else store.workspace_tenants()
    found: list[Collected] = []
    for name in tenants:
        run = Collector(store, name, grace=grace)
        run.mark()
        found.append(run.sweep(dry_run=dry_run))
    return found


__all__ = ["GRACE_SECONDS", "Collected", "Collector", "collect"]
