"""Retention in the SQL stores (issue 26 part 3): the policies, the
controller's lease and fence, and the deletions of every class but run
history (which is ``prune_runs``: the one path that deletes a run).

Every deletion here is two steps with the same rule: ``retention_due``
reads the rows a class's policies make due now (the dry run, ``cairn
retention plan``, is exactly this list), and ``retention_delete`` deletes a
batch of them in one transaction that first checks the controller's fence
(``check_fence``: ``RetentionFenced`` and nothing deleted for a stale holder) and
deletes a row only if it is still due (each statement repeats its time
condition, so a row written again since the read stays).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from cairn import faults
from cairn.errors import InvalidArgument, RetentionFenced
from cairn.faults import fault_point
from cairn.store import retention as rt
from cairn.store.memrecords import MemoryScope
from cairn.store.retention import Cutoffs, DataClass, Policy
from cairn.store.sqlprimitives import SQLPrimitives

Tx = TypeVar("Tx")

#: ``(holder, epoch)`` of the controller's lease, as every deletion is fenced on it
Fence = tuple[str, int]

#: A row a class's policies make due: the class's key columns (a run id; a
#: run and seq; a tenant, thread and index; a tenant, namespace and key).
Key = tuple[Any, ...]

#: Rows read per page while looking for due rows.
PAGE = 1000

_LOW = ""  # below every key text


@dataclass(frozen=True, slots=True)
class DeletedRun:
    """The record of a deleted run (its audit record once its history is gone)."""

    run_id: str
    tenant: str
    workflow: str
    finished_at: float
    last_seq: int
    head: bytes | None
    deleted_at: float
    deleted_by: str


class SQLRetention(SQLPrimitives[Tx]):
    """Retention over a dialect's primitives (``sqlbase.SQLStore``'s)."""

    def _delete_scope(self, tx: Tx, scope: MemoryScope) -> int:
        raise NotImplementedError

    # -- policies ---------------------------------------------------------------------------

    def retention_policies(self, tenant: str | None = None) -> list[Policy]:
        """The policies of ``tenant`` and the installation's (``*``); ``None``:
        every one this store may read (a tenant's role: its own and ``*``)."""
        return [_policy(row) for row in self._select("retention_policies", {"tenant": tenant})]

    def set_retention_policy(self, policy: Policy, actor: str) -> Policy:
        """Store ``policy`` (replacing the one of its scope) as set by
        ``actor``, if the policies after it pass ``retention.check``
        (``InvalidArgument`` and nothing stored otherwise), decided in the
        transaction that writes it."""
        def body(tx: Tx) -> Policy:
            now = self.clock()
            self._query(tx, "lock_retention_policies", {})
            current = [_policy(r) for r in self._query(tx, "retention_policies", {"tenant": None})]
            after = [p for p in current if p.scope != policy.scope] + [policy]
            rt.check(after)
            self._query(tx, "upsert_retention_policy", {
                "tenant": policy.tenant, "workflow": policy.workflow, "data_class": policy.data_class.value,
                "keep": policy.keep, "now": now, "actor": actor})
            _log(self, tx)
            return Policy(policy.tenant, policy.workflow, policy.data_class, policy.keep, now, actor)

        return self._operate(body)

    def remove_retention_policy(self, tenant: str, workflow: str, cls: DataClass) -> bool:
        """Remove the policy of that scope (its class is then kept as the
        next matching policy says, or forever); refused like a change that
        would leave audit records shorter-lived than history. False: none."""
        def body(tx: Tx) -> bool:
            self._query(tx, "lock_retention_policies", {})
            current = [_policy(r) for r in self._query(tx, "retention_policies", {"tenant": None})]
            if not any(p.scope == (tenant, workflow, cls) for p in current):
                return False
            rt.check([p for p in current if p.scope != (tenant, workflow, cls)])
            params = {"tenant": tenant, "workflow": workflow, "data_class": cls.value}
            gone = bool(self._query(tx, "delete_retention_policy", params))
            if gone:
                _log(self, tx)
            return gone

        return self._operate(body)

    # -- the controller's lease ---------------------------------------------------------------

    def take_retention_lease(self, holder: str, seconds: float, held: int | None = None) -> int | None:
        """Renew the lease ``holder`` holds at epoch ``held``, or take it if it
        is free or expired (a new epoch); its epoch, ``None``: another holder
        has it. (Not a run's epoch: this is no holder write of a run.)"""
        if not seconds > 0:
            raise InvalidArgument(f"a lease lasts a positive number of seconds, not {seconds!r}")

        def body(tx: Tx) -> int | None:
            now = self.clock()
            rows = self._query(tx, "take_retention_lease",
                               {"holder": holder, "epoch": held, "now": now, "until": now + seconds})
            return int(rows[0][0]) if rows else None

        return self._operate(body)

    def check_fence(self, tx: Tx, fence: Fence | None) -> None:
        """In a deleting transaction: ``RetentionFenced`` unless ``fence`` still holds
        the lease (``None``: the caller is not a controller, e.g. ``prune``)."""
        if fence is None:
            return
        holder, epoch = fence
        held = {"holder": holder, "epoch": epoch, "now": self.clock()}
        if not self._query(tx, "check_retention_fence", held):
            raise RetentionFenced(f"the retention controller {holder} lost its lease (epoch {epoch}): it "
                                  "deletes nothing more")

    # -- audit records of deleted runs ----------------------------------------------------------

    def deleted_runs(self, tenant: str | None = None) -> list[DeletedRun]:
        """The records of deleted runs (of ``tenant``), oldest first."""
        return [DeletedRun(str(r[0]), str(r[1]), str(r[2]), float(r[3]), int(r[4]),
                           None if r[5] is None else bytes(r[5]), float(r[6]), str(r[7]))
                for r in self._select("deleted_runs", {"tenant": tenant})]

    # -- every class but history -------------------------------------------------------------

    def retention_due(self, cutoffs: Cutoffs, limit: int | None = None) -> list[Key]:
        """The rows ``cutoffs``'s class makes due now, in key order (at most
        ``limit``): what a pass deletes (or expires)."""
        cls = cutoffs.cls
        latest = cutoffs.latest
        if latest is None or cls is DataClass.HISTORY:
            return []
        found: list[Key] = []
        after: Key = _START[cls]
        while limit is None or len(found) < limit:
            rows = self._select(_CANDIDATES[cls], {**_params(cls, after), "cutoff": latest, "page": PAGE})
            for row in rows:
                key, tenant, workflow, at = _split(cls, row)
                if cutoffs.due(tenant, workflow, at):
                    found.append(key)
            if len(rows) < PAGE:
                break
            after = _split(cls, rows[-1])[0]
        return found if limit is None else found[:limit]

    def retention_delete(self, cutoffs: Cutoffs, keys: Sequence[Key], fence: Fence | None) -> list[Key]:
        """Delete (or expire) the rows ``keys`` of ``cutoffs``'s class that
        are still due, in one transaction fenced on ``fence``; the keys that
        went."""
        cls = cutoffs.cls

        def body(tx: Tx) -> list[Key]:
            self.check_fence(tx, fence)
            now = self.clock()
            gone: list[Key] = []
            threads: set[tuple[str, str, float]] = set()
            for key in keys:
                if self._delete_one(tx, cls, cutoffs, key, now, threads):
                    gone.append(key)
            for tenant, thread_id, cut in sorted(threads):
                self._query(tx, "forget_empty_thread",
                            {"tenant": tenant, "thread_id": thread_id, "cutoff": cut})
            if faults.ARMED:
                fault_point("retention.delete.before_commit")
            return gone

        return self._operate(body)

    def _store_audit_digest(self, tx: Tx, run_id: str, seq: int) -> None:
        raise NotImplementedError  # store.auditsql.SQLAudit's

    def _delete_one(self, tx: Tx, cls: DataClass, cutoffs: Cutoffs, key: Key, now: float,
                    threads: set[tuple[str, str, float]]) -> bool:
        if cls in (DataClass.MODEL_BODIES, DataClass.ARTIFACTS):
            run_id, seq = key
            entry = {"run_id": run_id, "seq": seq}
            marker = rt.expired_marker(cls, now)
            self._store_audit_digest(tx, run_id, seq)  # the body goes: its digest must stay
            self._query(tx, "drop_spilled_body", entry)
            self._query(tx, "queue_body_artifact", {**entry, "now": now})
            return bool(self._query(tx, "expire_body", {**entry, "marker": marker}))
        if cls is DataClass.THREAD_MEMORY:
            tenant, thread_id, idx = key
            cut = cutoffs.of(tenant)
            if cut is None:
                return False
            threads.add((tenant, thread_id, cut))
            return bool(self._query(tx, "forget_message",
                                    {"tenant": tenant, "thread_id": thread_id, "idx": idx, "cutoff": cut}))
        if cls in (DataClass.KV_MEMORY, DataClass.SEMANTIC_MEMORY):
            tenant, namespace, item_key, updated_at = key
            if not cutoffs.due(tenant, rt.ANY, updated_at):
                return False
            item = {"tenant": tenant, "namespace": namespace, "key": item_key, "updated_at": updated_at}
            if not self._query(tx, "item_unchanged", item):
                return False  # written again since: not due any more
            return self._delete_scope(tx, MemoryScope(tenant, namespace, item_key, None, None)) > 0
        if cls is DataClass.AUDIT:
            run_id, finished_at = key
            return bool(self._query(tx, "forget_deleted_run", {"run_id": run_id, "finished_at": finished_at}))
        return False


def _log(store: Any, tx: Any) -> None:
    """The operator log's record of the change, if the caller is acting
    (``store.oplogsql``), in the change's transaction."""
    log = getattr(store, "_log_action", None)
    if log is not None:
        log(tx)


def _policy(row: Sequence[Any]) -> Policy:
    keep = None if row[3] is None else float(row[3])
    return Policy(str(row[0]), str(row[1]), rt.data_class(str(row[2])), keep, float(row[4]), str(row[5]))


_CANDIDATES = {
    DataClass.MODEL_BODIES: "body_candidates",
    DataClass.ARTIFACTS: "body_candidates",
    DataClass.THREAD_MEMORY: "message_candidates",
    DataClass.KV_MEMORY: "item_candidates",
    DataClass.SEMANTIC_MEMORY: "item_candidates",
    DataClass.AUDIT: "deleted_run_candidates",
    DataClass.ARCHIVES: "archive_candidates",
}

_START: dict[DataClass, Key] = {
    DataClass.MODEL_BODIES: (_LOW, 0),
    DataClass.ARTIFACTS: (_LOW, 0),
    DataClass.THREAD_MEMORY: (_LOW, _LOW, -1),
    DataClass.KV_MEMORY: (_LOW, _LOW, _LOW, 0.0),
    DataClass.SEMANTIC_MEMORY: (_LOW, _LOW, _LOW, 0.0),
    DataClass.AUDIT: (_LOW, -float("inf")),
    DataClass.ARCHIVES: (_LOW, -float("inf")),
}


def _params(cls: DataClass, after: Key) -> dict[str, Any]:
    """The keyset parameters of the page after ``after``."""
    if cls in (DataClass.MODEL_BODIES, DataClass.ARTIFACTS):
        return {"after_run": after[0], "after_seq": after[1], "cls": cls.value}
    if cls is DataClass.THREAD_MEMORY:
        return {"after_tenant": after[0], "after_thread": after[1], "after_idx": after[2]}
    if cls in (DataClass.KV_MEMORY, DataClass.SEMANTIC_MEMORY):
        return {"after_tenant": after[0], "after_namespace": after[1], "after_key": after[2],
                "semantic": cls is DataClass.SEMANTIC_MEMORY}
    return {"after_at": after[1], "after_id": after[0]}


def _split(cls: DataClass, row: Sequence[Any]) -> tuple[Key, str, str, float]:
    """A candidate row as (its key, tenant, workflow, time)."""
    if cls in (DataClass.MODEL_BODIES, DataClass.ARTIFACTS):
        return (str(row[0]), int(row[1])), str(row[2]), str(row[3]), float(row[4])
    if cls is DataClass.THREAD_MEMORY:
        return (str(row[0]), str(row[1]), int(row[2])), str(row[0]), rt.ANY, float(row[3])
    if cls in (DataClass.KV_MEMORY, DataClass.SEMANTIC_MEMORY):
        return (str(row[0]), str(row[1]), str(row[2]), float(row[3])), str(row[0]), rt.ANY, float(row[3])
    return (str(row[0]), float(row[3])), str(row[1]), str(row[2]), float(row[3])


__all__ = ["PAGE", "DeletedRun", "Fence", "Key", "SQLRetention"]
