"""Workspace objects of the SQL stores (migration ``workspaces``).

The rows hold what ``cairn.workspace`` packed: this module never reads an
object's bytes (the workspace layer checks each against its id on read, so
a damaged or forged row is refused there). What it guarantees is who may
write and whose rows a read sees:

* ``put_workspace_objects`` is a holder write: fenced on the run's epoch
  (``LeaseLost``, nothing stored, for a holder that lost its lease), and
  the objects take the run's tenant, read from the run row in the same
  transaction, never the caller's;
* ``workspace_objects`` reads one tenant's rows (PostgreSQL's row-level
  security hides other tenants' from a tenant's role as well).

For the collector (``cairn.api.wscollect``): ``workspace_roots`` (the roots
the journals of a tenant's existing runs record), ``workspace_candidates``
(a page of objects last stored before a time) and
``delete_workspace_objects``, which deletes an object only if it was still
last stored before that time. Storing an object that is already there
moves its ``stored_at`` to now: that is the collector's fence against a
snapshot that stores (or re-stores) an object while a collection runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from typing import TypeVar

from cairn.errors import InvalidArgument, WorkspaceError
from cairn.store.archive import RunArchive
from cairn.store.sqlprimitives import SQLPrimitives

Tx = TypeVar("Tx")
T = TypeVar("T")

_OID = re.compile(r"[0-9a-f]{64}")


def check_oids(oids: Collection[str]) -> None:
    for oid in oids:
        if not isinstance(oid, str) or _OID.fullmatch(oid) is None:
            raise InvalidArgument(f"not a workspace object id: {oid!r}")


class SQLWorkspaces(SQLPrimitives[Tx]):
    """The workspace object methods of the SQL stores over a dialect's primitives."""

    # -- dialect primitives beyond ``sqlprimitives.SQLPrimitives``'s (sqlbase.SQLStore and the
    # dialects provide them) ------------

    #: ``archivesql.SQLArchive``'s, later in the store's bases (declared, not defined, so not hidden)
    archived_runs: Callable[..., list[str]]
    run_archived: Callable[[str], RunArchive | None]

    def _held_write(self, run_id: str, epoch: int, write: Callable[[Tx, float], T]) -> T:
        raise NotImplementedError

    def _ws_insert(self, tx: Tx, tenant: str, objects: Mapping[str, bytes], now: float) -> None:
        """Insert ``objects`` for ``tenant``, keeping rows already there (one
        statement per object; PostgreSQL sends them all in one)."""
        for oid, data in objects.items():
            self._query(tx, "ws_put_object", {"tenant": tenant, "oid": oid, "data": data, "now": now})

    # -- contract ------------------------------------------------------------------------

    def put_workspace_objects(self, run_id: str, epoch: int, objects: Mapping[str, bytes]) -> None:
        check_oids(objects)
        if not objects:
            return

        def write(tx: Tx, now: float) -> None:
            ((tenant,),) = self._query(tx, "ws_run_tenant", {"run_id": run_id})
            self._ws_insert(tx, tenant, objects, now)

        self._held_write(run_id, epoch, write)

    def workspace_objects(self, tenant: str, oids: Collection[str]) -> dict[str, bytes]:
        check_oids(oids)
        if not oids:
            return {}
        rows = self._select("ws_objects", {"tenant": tenant, "oids": self._list_param(list(oids))})
        return {str(oid): bytes(data) for oid, data in rows}

    def workspace_tenants(self) -> list[str]:
        return [str(t) for (t,) in self._select("ws_tenants", {})]

    def workspace_roots(self, tenant: str) -> set[str]:
        sealed = self._select("ws_sealed_detail", {"tenant": tenant}) or [
            (run_id,) for run_id, _ in self._archived_workspace(tenant)[1][:1]]
        if sealed:
            raise WorkspaceError(f"tenant {tenant!r}'s journal details are sealed (run {sealed[0][0]}): "
                                 "the workspace collector cannot read their snapshot roots without the "
                                 "keyring, so it collects nothing")
        return self.workspace_plain_roots(tenant)

    def workspace_plain_roots(self, tenant: str) -> set[str]:
        roots = {str(r) for (r,) in self._select("ws_roots", {"tenant": tenant}) if r is not None}
        roots.update(self._archived_workspace(tenant)[0])
        check_oids(roots)
        return roots

    def workspace_sealed_entries(self, tenant: str) -> list[tuple[str, int]]:
        rows = self._select("ws_sealed_entries", {"tenant": tenant})
        return [(str(run_id), int(seq)) for run_id, seq in rows] + self._archived_workspace(tenant)[1]

    def _archived_workspace(self, tenant: str) -> tuple[set[str], list[tuple[str, int]]]:
        """The snapshot roots in the plain details of ``tenant``'s archived
        runs, and ``(run_id, seq)`` of their sealed ones: an archived run's
        snapshots stay reachable, so collection keeps their objects for a
        restore or a fork (each archive read once per collection)."""
        roots: set[str] = set()
        sealed: list[tuple[str, int]] = []
        for run_id in self.archived_runs(tenant):
            archive = self.run_archived(run_id)
            if archive is None:
                continue
            plain, seqs = archive.workspace_details()
            roots.update(plain)
            sealed.extend((run_id, seq) for seq in seqs)
        return roots, sealed

    def workspace_keys(self, tenant: str, oids: Collection[str]) -> set[str]:
        return set(oids)

    def workspace_candidates(self, tenant: str, before: float, after: str = "", limit: int = 1000
                             ) -> list[str]:
        rows = self._select("ws_candidates", {"tenant": tenant, "before": before, "after": after,
                                              "limit": max(1, int(limit))})
        return [str(oid) for (oid,) in rows]

    def delete_workspace_objects(self, tenant: str, oids: Collection[str], before: float) -> int:
        check_oids(oids)
        if not oids:
            return 0

        def body(tx: Tx) -> int:
            return self._changed(tx, "ws_delete", {"tenant": tenant, "oids": self._list_param(list(oids)),
                                                   "before": before})

        return self._operate(body)


__all__ = ["SQLWorkspaces", "check_oids"]
