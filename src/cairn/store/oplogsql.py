"""The operator log's rows in the SQL stores (``store.oplog``): appended in
the transaction of the mutation they record, read a page at a time.

Two ways in:

- ``record_operator_action(tx, action)``: for a store method that has the
  transaction at hand (a new mutation such as retention policies' set/rm
  calls it in its own ``_operate`` body).
- ``acting(action)``: a context in which the next mutation of the existing
  store methods that record (tokens, queues, schedules, keys, bundles) adds
  ``action`` inside its transaction. The façades above the store (``Tokens``,
  ``Operator``, ``Keys``, the scheduler, the bundle registry) know the actor;
  the layers in between (a ``SealedStore``, its ``DataKeys``) need not. A
  mutation that fails rolls its record back with it; one that writes nothing
  records nothing. The action is this store's and this thread's only.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

from cairn.store.auditlinks import GENESIS
from cairn.store.auditlinks import link as chain_link
from cairn.store.oplog import SYSTEM_ACTOR, OperatorAction, auth_of, chain_id, change_digest, meta
from cairn.store.sqlprimitives import SQLPrimitives

Tx = TypeVar("Tx")

PAGE = 2000

_ambient = threading.local()


class SQLOperatorLog(SQLPrimitives[Tx]):
    """Operator log rows over a dialect's primitives."""

    def record_operator_action(self, tx: Tx, action: OperatorAction, at: float | None = None) -> int:
        """Append ``action`` to its tenant's operator log inside ``tx``, the
        transaction of the mutation it records; its ``seq``."""
        change = action.canonical_change()
        self._query(tx, "oplog_lock", {"tenant": action.tenant})
        head = self._query(tx, "oplog_head", {"tenant": action.tenant})
        seq, previous = (int(head[0][0]) + 1, bytes(head[0][1])) if head else (1, GENESIS)
        when = self.clock() if at is None else float(at)
        record_digest = change_digest(change)
        record_link = chain_link(previous, meta(action.tenant, seq, when, action.kind, action.object_id,
                                                action.action, action.actor, action.auth), record_digest)
        self._query(tx, "insert_oplog", {
            "tenant": action.tenant, "seq": seq, "at": when, "kind": action.kind,
            "object_id": action.object_id, "action": action.action, "actor": action.actor,
            "auth": action.auth, "change": change, "digest": record_digest, "link": record_link})
        return seq

    @contextmanager
    def acting(self, action: OperatorAction) -> Iterator[None]:
        """Within the block, the next recording mutation of this thread adds
        ``action`` in its transaction (see the module doc)."""
        outer = getattr(_ambient, "action", None)
        _ambient.action = (self, action)
        try:
            yield
        finally:
            _ambient.action = outer

    def _log_action(self, tx: Tx, object_id: str | None = None, *, tenant: str | None = None,
                    **more: Any) -> None:
        """Record the ambient action (``acting``), if any, inside ``tx``;
        ``object_id`` (if given) names the object, ``tenant`` (if given) the
        log it goes to (an action over every tenant's objects, such as a KEK
        rewrap, records in each tenant's log what it did there), ``more`` is
        added to its change (what the transaction found)."""
        ambient: tuple[object, OperatorAction] | None = getattr(_ambient, "action", None)
        if ambient is None or ambient[0] is not self:
            return
        action = ambient[1]  # not consumed: a transaction retried after a rollback records it again
        if more or object_id is not None or tenant is not None:
            action = OperatorAction(action.tenant if tenant is None else tenant, action.kind,
                                    object_id or action.object_id, action.action, action.actor, action.auth,
                                    {**action.change, **more})
        self.record_operator_action(tx, action)

    def append_operator_action(self, action: OperatorAction) -> int:
        """Append ``action`` in a transaction of its own: for an operation
        made of many transactions (a re-encryption pass), recorded once it
        is done, with what it did; its ``seq``."""
        return self._operate(lambda tx: self.record_operator_action(tx, action))

    def operator_log(self, *, tenant: str | None = None, page: int = PAGE) -> Iterator[tuple[Any, ...]]:
        """Every operator log row (``oplog.COLUMNS``) of ``tenant`` or of
        all, in ``(tenant, seq)`` order, a page at a time."""
        after_tenant, after_seq = "", 0
        while True:
            rows = self._select("oplog_entries", {"tenant": tenant, "after_tenant": after_tenant,
                                                  "after_seq": after_seq, "page": page})
            yield from rows
            if len(rows) < page:
                return
            after_tenant, after_seq = str(rows[-1][0]), int(rows[-1][1])


    def operator_log_rows(self, *, tenant: str | None = None, kind: str | None = None,
                          since: float | None = None, after: tuple[float, str, int] | None = None,
                          newest: bool = False, page: int = PAGE) -> Iterator[tuple[Any, ...]]:
        """The operator log's rows (``oplog.COLUMNS``) as the audit log
        merges them: in ``(at, chain id, seq)`` order (reversed if
        ``newest``), past the log position ``after``, since ``since``, of
        object kind ``kind`` if given; a tenant's read a page at a time in
        the order of its index (``operator_log_at``), every tenant's (no
        tenant) merged one stream per tenant."""
        if tenant is not None:
            return self._log_records(tenant, kind, since, after, newest, page)
        tenants = [str(t) for (t,) in self._select("oplog_tenants", {})]
        return heapq.merge(*(self._log_records(t, kind, since, after, newest, page) for t in tenants),
                           key=_record_key, reverse=newest)

    def _log_records(self, tenant: str, kind: str | None, since: float | None,
                     after: tuple[float, str, int] | None, newest: bool,
                     page: int) -> Iterator[tuple[Any, ...]]:
        name = "oplog_log_newest" if newest else "oplog_log_oldest"
        at, after_seq = _past(chain_id(tenant), after, newest)
        floor = -_INF if since is None else float(since)
        if not newest:  # oldest first, the floor is the lower bound the index seeks (seq 0: below all)
            at, after_seq = max((at, after_seq), (floor, 0))
        while True:
            rows = self._select(name, {"tenant": tenant, "kind": kind, "since": floor, "at": at,
                                       "after_seq": after_seq, "page": page})
            yield from rows
            if len(rows) < page:
                return
            at, after_seq = float(rows[-1][2]), int(rows[-1][1])


_INF = float("inf")
#: above every record number
_SEQ_MAX = 1 << 62


def _record_key(row: tuple[Any, ...]) -> tuple[float, str, int]:
    """An operator log row's place in the audit log: ``(at, its chain id, seq)``."""
    return (float(row[2]), chain_id(str(row[0])), int(row[1]))


def _past(chain: str, after: tuple[float, str, int] | None, newest: bool) -> tuple[float, int]:
    """The ``(at, seq)`` keyset bound, within chain ``chain``, of the log
    position ``after``: a record at the position's time is past it by its
    seq in the position's own chain, by the chain ids' order in another's (all
    of it, or none: seq 0 is below every record, ``_SEQ_MAX`` above)."""
    if after is None:
        return (_INF if newest else -_INF), 0
    at, run_id, seq = after
    if chain == run_id:
        return at, seq
    return at, (0 if chain > run_id else _SEQ_MAX)


def record_in(store: Any, tx: Any, action: OperatorAction) -> None:
    """Append ``action`` inside ``tx`` if ``store`` keeps an operator log (a
    ``SQLOperatorLog``): for the mixins of a SQL store that come before it
    (erasure, archives), which cannot name its methods for the type checker."""
    record = getattr(store, "record_operator_action", None)
    if record is not None:
        record(tx, action)


def record_move(store: Any, tx: Any, action: str, tenant: str, run_id: str, actor: str | None,
                change: Mapping[str, Any]) -> None:
    """Record an archive move of run ``run_id`` (``archive.move``,
    ``archive.restore``) inside ``tx``, the move's own transaction: by
    ``actor``, or by the system (``SYSTEM_ACTOR``) when no operator is named."""
    who = actor or SYSTEM_ACTOR
    record_in(store, tx, OperatorAction(tenant, "archive", run_id, action, who, auth_of(who), dict(change)))


def move_change(record: Any) -> dict[str, Any]:
    """What an archive move's record says of the archive (a
    ``records.ArchiveRecord``): its object (the content address), how many
    entries it holds and the run's head link, so the chain of the operator
    log holds the archive's digest and the run's anchored head with it."""
    return {"ref": record.ref, "entries": record.entries, "last_seq": record.last_seq,
            "head": None if record.last_link is None else bytes(record.last_link).hex(),
            "stored_bytes": record.stored_bytes}
