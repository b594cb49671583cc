"""The memory tiers of the SQL stores, written once over the dialect primitives.

Three tiers, three sets of tables (migration ``memory``), one transaction
per batch of writes:

* **run memory** (``memory_run``): a run's scratch keys; the tenant is read
  from the run row by the statement, and the rows go with the run (a trigger
  on ``runs``, so pruning needs no change).
* **thread memory** (``memory_threads``, ``memory_thread_messages``):
  ordered messages; an append takes its indexes from the thread row, a
  compaction replaces a prefix by one summary message.
* **long-term memory** (``memory_items``, ``memory_outbox``): namespaced
  items; a put with index text writes an outbox row for the embedding worker
  in the same transaction, and every deletion removes the item's outbox rows
  and vectors (``_drop_vectors``) with it.

Writes made by a step commit in the transaction of that step's journal
entry (``append_memory``): ``sqlbase`` supplies ``_append_with``, a holder
write (``SQLStore._held_write``): the fenced append, then a body, in one
transaction, so a stale holder's writes are never applied and a crash
leaves the entry and its writes, or neither.
Reads compare ``expires_at`` with the store's clock: an expired row is gone
for every reader at once; ``sweep_memory`` deletes such rows later.
Offloaded values are queued for artifact collection by triggers whenever
their row goes, whoever deletes it.

Item values have a cold tier (``tier_items``, migration ``memory_cold``):
the value of an item untouched for ``cold_after`` moves, compressed
(``store.coldvalues``), from its hot row to ``memory_item_cold`` in the same
database, one transaction per pass; reads join the cold copy and restore it
(read-through: a read writes nothing, so it works on a read-only store); a
put, or a pass after the item was touched, makes it hot again. Triggers
delete the cold copy with its item, whoever deletes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from cairn import faults
from cairn.errors import InvalidArgument, PayloadError
from cairn.faults import fault_point
from cairn.store import coldvalues
from cairn.store.archive import RunArchive
from cairn.store.memrecords import (
    ItemDelete,
    ItemPut,
    ItemTierMove,
    ItemTierUsage,
    MemoryItem,
    MemoryScope,
    MemoryWrite,
    Provenance,
    RunDelete,
    RunMemory,
    RunPut,
    ThreadAppend,
    ThreadCompact,
    ThreadMessage,
)
from cairn.store.records import HistoryEvent, Payload
from cairn.store.rows import dumps, loads
from cairn.store.vectorindex import VectorIndex

Tx = TypeVar("Tx")
T = TypeVar("T")

#: How many items a listing returns at most by default.
DEFAULT_LIST_LIMIT = 100


class SQLMemory(VectorIndex[Tx], Generic[Tx]):
    """The memory methods of ``contract.Store`` over a dialect's primitives."""

    # -- dialect primitives (sqlbase.SQLStore and the dialects provide them;
    # ``_operate``, ``_query`` and the rest are declared by ``sqlprimitives.SQLPrimitives``) ----

    def _append_with(
        self, run_id: str, epoch: int, events: Sequence[HistoryEvent], body: Callable[[Tx], None]
    ) -> None:
        """Append ``events`` fenced (as ``append``) and run ``body`` in the same
        transaction, holding the fence until it commits."""
        raise NotImplementedError

    #: run ``run_id``'s archived rows, ``None`` while hot (``archivesql.SQLArchive``'s, later in the
    #: store's bases: declared, not defined, so this class does not hide it)
    run_archived: Callable[[str], RunArchive | None]

    # -- writes ---------------------------------------------------------------------

    def append_memory(
        self, run_id: str, epoch: int, events: Sequence[HistoryEvent], writes: Sequence[MemoryWrite],
        provenance: Provenance,
    ) -> None:
        if not events:
            raise ValueError("append_memory needs the entry its writes commit with")

        def body(tx: Tx) -> None:
            # Run memory and item puts read the run's tenant in their own
            # statement (the per-step path: one statement a write); the other
            # writes need it first.
            tenant = None
            if any(not isinstance(write, (RunPut, RunDelete, ItemPut)) for write in writes):
                ((tenant,),) = self._query(tx, "memory_run_tenant", {"run_id": run_id})
            self._apply_writes(tx, tenant, writes, provenance, run_id)

        self._append_with(run_id, epoch, events, body)

    def write_memory(self, tenant: str, writes: Sequence[MemoryWrite], provenance: Provenance) -> None:
        if not tenant:
            raise InvalidArgument("a memory write needs a tenant")
        self._operate(lambda tx: self._apply_writes(tx, tenant, writes, provenance, provenance.run_id))

    def _apply_writes(
        self, tx: Tx, tenant: str | None, writes: Sequence[MemoryWrite], who: Provenance, run_id: str | None
    ) -> None:
        """Apply ``writes`` of ``tenant`` (``None``: of run ``run_id``'s
        tenant, which the statements read, for run memory and item puts)."""
        now = self.clock()
        origin = {"run_id": run_id, "position": who.position, "operation_id": who.operation_id,
                  "actor": who.actor, "subject": who.subject, "now": now}
        for write in writes:
            if isinstance(write, ItemPut):
                self._put_item(tx, tenant, write, origin)
            elif isinstance(write, ItemDelete):
                assert tenant is not None  # append_memory reads it for these
                self._delete_item(tx, tenant, write.namespace, write.key)
            elif isinstance(write, RunPut):
                if run_id is None:
                    raise InvalidArgument("run memory is written by a run (no run given)")
                value, ref = _split(write.value)
                params = {**origin, "tenant": tenant or None, "key": write.key, "value": value,
                          "value_ref": ref}
                if not self._query(tx, "put_memory_run", params):
                    raise InvalidArgument(f"no run {run_id!r} of tenant {tenant!r} to write memory for")
            elif isinstance(write, RunDelete):
                if run_id is None:
                    raise InvalidArgument("run memory is written by a run (no run given)")
                self._query(tx, "delete_memory_run_key", {"run_id": run_id, "key": write.key})
            elif isinstance(write, ThreadAppend):
                assert tenant is not None
                self._append_thread(tx, tenant, write, origin)
            else:
                assert tenant is not None
                self._compact_thread(tx, tenant, write, origin)

    def _put_item(self, tx: Tx, tenant: str | None, put: ItemPut, origin: dict[str, Any]) -> None:
        now = origin["now"]
        ttl = put.ttl
        params = {**origin, "subject": put.subject or origin["subject"], "tenant": tenant,
                  "namespace": put.namespace, "key": put.key,
                  "value": put.value.data, "value_ref": put.value.ref,
                  "metadata": None if put.metadata is None else dumps(put.metadata),
                  "index_text": put.index_text, "ttl": ttl, "expires_at": None if ttl is None else now + ttl}
        if tenant is None:  # a step's put: the statement takes the run's tenant
            rows = self._query(tx, "put_memory_item_of_run", params)
            if not rows:
                raise InvalidArgument(f"no run {origin['run_id']!r} to write memory for")
            ((tenant, version),) = rows
        else:
            ((version,),) = self._query(tx, "put_memory_item", params)
        if put.index_text is None and version == 1:
            return  # a new item, not searchable: nothing to embed, no stale vector (see below)
        item = {"tenant": tenant, "namespace": put.namespace, "key": put.key}
        if put.index_text is None:
            if version != 1:  # no longer searchable: nothing to embed, no stale vector (a new
                # item has neither: deleting or sweeping an item deletes its outbox rows and vectors)
                self._query(tx, "delete_memory_outbox_of_item", item)
                self._drop_vectors(tx, tenant, put.namespace, put.key)
        else:
            self._query(tx, "insert_memory_outbox", {**item, "version": int(version), "now": now})

    def _delete_item(self, tx: Tx, tenant: str, namespace: str, key: str) -> None:
        item = {"tenant": tenant, "namespace": namespace, "key": key}
        self._query(tx, "delete_memory_item", item)
        self._query(tx, "delete_memory_outbox_of_item", item)
        self._drop_vectors(tx, tenant, namespace, key)

    def _append_thread(self, tx: Tx, tenant: str, append: ThreadAppend, origin: dict[str, Any]) -> None:
        if not append.messages:
            return
        thread = {"tenant": tenant, "thread_id": append.thread_id, "now": origin["now"]}
        self._query(tx, "drop_expired_memory_messages", thread)
        self._query(tx, "drop_expired_memory_thread", thread)
        count = len(append.messages)
        ((end,),) = self._query(tx, "reserve_memory_thread", {**thread, "count": count, "ttl": append.ttl})
        for i, message in enumerate(append.messages):
            value, ref = _split(message)
            self._query(tx, "insert_memory_message", {**origin, **thread, "idx": int(end) - count + i,
                                                      "subject": append.subject or origin["subject"],
                                                      "kind": "message", "value": value, "value_ref": ref})

    def _compact_thread(self, tx: Tx, tenant: str, compact: ThreadCompact, origin: dict[str, Any]) -> None:
        thread = {"tenant": tenant, "thread_id": compact.thread_id, "now": origin["now"]}
        rows = self._query(tx, "select_memory_thread", thread)
        end = int(rows[0][0]) if rows else 0
        if not 0 < compact.upto <= end:
            raise InvalidArgument(f"cannot compact thread {compact.thread_id!r} up to index {compact.upto}: "
                                  f"it has indexes 0..{end - 1}" if end else
                                  f"cannot compact thread {compact.thread_id!r}: it has no messages")
        self._query(tx, "compact_memory_messages", {**thread, "upto": compact.upto})
        value, ref = _split(compact.summary)
        self._query(tx, "insert_memory_message", {**origin, **thread, "idx": compact.upto - 1,
                                                  "kind": "summary", "value": value, "value_ref": ref})

    # -- reads ----------------------------------------------------------------------

    def memory_item(
        self, tenant: str, namespace: str, key: str, *, refresh: bool = False
    ) -> MemoryItem | None:
        params = {"tenant": tenant, "namespace": namespace, "key": key, "now": self.clock()}
        if refresh:
            def body(tx: Tx) -> list[tuple[Any, ...]]:
                self._query(tx, "refresh_memory_item", params)
                return self._query(tx, "select_memory_item", params)

            rows = self._operate(body)
        else:
            rows = self._select("select_memory_item", params)
        return _item(rows[0]) if rows else None

    def memory_items(
        self, tenant: str | None, prefix: str = "", *, run_id: str | None = None,
        limit: int = DEFAULT_LIST_LIMIT,
    ) -> list[MemoryItem]:
        params = {"tenant": tenant, "prefix": prefix, "run_id": run_id, "limit": limit, "now": self.clock()}
        return [_item(row) for row in self._select("list_memory_items", params)]

    def thread_messages(
        self, tenant: str, thread_id: str, *, after: int = -1, last: int | None = None,
        limit: int = 1000, refresh: bool = False,
    ) -> list[ThreadMessage]:
        params = {"tenant": tenant, "thread_id": thread_id, "now": self.clock(), "after": after,
                  "limit": limit if last is None else last}
        query = "select_memory_messages" if last is None else "select_memory_messages_last"
        if refresh:
            def body(tx: Tx) -> list[tuple[Any, ...]]:
                self._query(tx, "refresh_memory_thread", params)
                return self._query(tx, query, params)

            rows = self._operate(body)
        else:
            rows = self._select(query, params)
        messages = [_message(row) for row in rows]
        return messages[::-1] if last is not None else messages

    def memory_threads(self, tenant: str | None, *, limit: int = DEFAULT_LIST_LIMIT) -> list[dict[str, Any]]:
        rows = self._select("list_memory_threads", {"tenant": tenant, "now": self.clock(), "limit": limit})
        return [{"tenant": r[0], "thread_id": r[1], "messages_written": int(r[2]), "created_at": float(r[3]),
                 "updated_at": float(r[4]), "expires_at": None if r[5] is None else float(r[5])}
                for r in rows]

    def run_memory(
        self, run_id: str, key: str | None = None, *, tenant: str | None = None
    ) -> list[RunMemory]:
        rows = self._select("select_memory_run", {"run_id": run_id, "key": key, "tenant": tenant})
        if not rows and (archive := self.run_archived(run_id)) is not None:  # read from its archive
            rows = archive.run_memory(key, tenant)
        return [_run_memory(row) for row in rows]

    # -- deletion and retention -----------------------------------------------------

    def delete_memory(self, scope: MemoryScope) -> int:
        _check_scope(scope)

        def body(tx: Tx) -> int:
            return self._delete_scope(tx, scope)

        return self._operate(body)

    def count_subject_memory(self, tenant: str, subject: str) -> int:
        """How many rows ``delete_subject_memory`` would delete now."""
        return int(self._select("count_subject_memory", {"tenant": tenant, "subject": subject})[0][0])

    def delete_subject_memory(self, tenant: str, subject: str) -> int:
        """Delete ``tenant``'s memory items and thread messages of
        ``subject`` (erasure), with the items' outbox rows, vectors and cold
        copies; offloaded values are queued for collection. Rows deleted."""

        def body(tx: Tx) -> int:
            params = {"tenant": tenant, "subject": subject}
            n = _count(self._query(tx, "delete_memory_messages_of_subject", params))
            items = self._query(tx, "delete_memory_items_of_subject", params)
            self._query(tx, "delete_orphan_memory_outbox", {"tenant": tenant})
            for owner, namespace, key in items:
                self._drop_vectors(tx, owner, namespace, key)
            return n + len(items)

        return self._operate(body)

    def _delete_scope(self, tx: Tx, scope: MemoryScope) -> int:
        tenant = scope.tenant
        if scope.key is not None:
            assert tenant is not None
            assert scope.namespace is not None
            item = {"tenant": tenant, "namespace": scope.namespace, "key": scope.key}
            gone = self._query(tx, "delete_memory_item", item)
            self._query(tx, "delete_memory_outbox_of_item", item)
            self._drop_vectors(tx, tenant, scope.namespace, scope.key)
            return len(gone)
        if scope.namespace is not None:
            prefix = {"tenant": tenant, "prefix": scope.namespace}
            gone = self._query(tx, "delete_memory_items_prefix", prefix)
            self._query(tx, "delete_orphan_memory_outbox", {"tenant": tenant})
            for owner in {row[0] for row in gone}:
                self._drop_vectors(tx, owner, scope.namespace, None)
            return len(gone)
        if scope.thread_id is not None:
            params = {"tenant": tenant, "thread_id": scope.thread_id}
            gone = self._query(tx, "delete_memory_messages_of_thread", params)
            self._query(tx, "delete_memory_thread", params)
            return _count(gone)
        if scope.run_id is not None:
            params = {"tenant": tenant, "run_id": scope.run_id}
            n = _count(self._query(tx, "delete_memory_run_of_run", params))
            n += _count(self._query(tx, "delete_memory_messages_of_run", params))
            items = self._query(tx, "delete_memory_items_of_run", params)
            self._query(tx, "delete_orphan_memory_outbox", {"tenant": tenant})
            for owner, namespace, key in items:
                self._drop_vectors(tx, owner, namespace, key)
            return n + len(items)
        assert tenant is not None  # _check_scope: everything of one tenant
        params = {"tenant": tenant}
        n = _count(self._query(tx, "delete_memory_run_of_tenant", params))
        n += _count(self._query(tx, "delete_memory_messages_of_tenant", params))
        self._query(tx, "delete_memory_threads_of_tenant", params)
        items = self._query(tx, "delete_memory_items_prefix", {"tenant": tenant, "prefix": ""})
        self._query(tx, "delete_orphan_memory_outbox", params)
        self._drop_vectors(tx, tenant, "", None)
        return n + len(items)

    def sweep_memory(self, limit: int = 1000) -> int:
        def body(tx: Tx) -> int:
            now = self.clock()
            items = self._query(tx, "sweep_memory_items", {"now": now, "limit": limit})
            for owner, namespace, key in items:
                self._drop_vectors(tx, owner, namespace, key)
            if items:
                self._query(tx, "delete_orphan_memory_outbox", {"tenant": None})
            n = _count(self._query(tx, "sweep_memory_messages", {"now": now}))
            self._query(tx, "sweep_memory_threads", {"now": now})
            return len(items) + n

        return self._operate(body)

    # -- the cold tier of item values (migration memory_cold) -------------------------

    def tier_items(self, idle_seconds: float, *, limit: int = 1000) -> ItemTierMove:
        """Move the values of up to ``limit`` items nobody read or wrote for
        ``idle_seconds`` to the cold tier (compressed, out of the hot row),
        and bring back up to ``limit`` cold ones touched since. One
        transaction: a pass that dies leaves every item hot or cold, and a
        pass run again finds only what is left to move (each move is
        conditioned on the item's tier and version, so a put that commits
        first wins)."""
        if not idle_seconds > 0:
            raise InvalidArgument(f"idle_seconds must be positive, not {idle_seconds!r}")

        def body(tx: Tx) -> ItemTierMove:
            now = self.clock()
            cut = now - idle_seconds
            rows = self._query(tx, "items_to_cool", {"before": cut, "now": now, "limit": limit,
                                                     "min_bytes": coldvalues.MIN_COLD_BYTES})
            cooled = 0
            for tenant, namespace, key, version, value in rows:
                codec, size, data = coldvalues.freeze(bytes(value))
                item = {"tenant": tenant, "namespace": namespace, "key": key}
                if not self._query(tx, "cool_item", {**item, "version": version}):
                    continue  # put since it was selected (a PostgreSQL pass skips locked rows anyway)
                if faults.ARMED:
                    fault_point("memory.tier_items.mid_move")
                self._query(tx, "insert_item_cold", {**item, "codec": codec, "size": size, "value": data})
                cooled += 1
            warm = self._query(tx, "items_to_rewarm", {"since": cut, "limit": limit})
            rewarmed = 0
            for tenant, namespace, key, version, codec, size, data in warm:
                try:
                    value = coldvalues.thaw(codec, size, bytes(data), what=f"memory item {key!r}")
                except PayloadError:
                    continue  # a damaged copy stays as it is: its reads say so, a put replaces it
                rewarmed += 1
                self._query(tx, "rewarm_item", {"tenant": tenant, "namespace": namespace, "key": key,
                                                "version": version, "value": value})
            return ItemTierMove(cooled, rewarmed)

        return self._operate(body)

    def item_tiers(self, tenant: str | None = None) -> list[ItemTierUsage]:
        """Items and the bytes of their values per tier (of ``tenant``, or
        every tenant the store sees): the figures of ``cairn memory tiers``."""
        usage = []
        for tier, count, hot_bytes, cold_bytes, cold_raw in self._select("item_tiers", {"tenant": tenant}):
            if tier == "cold":
                usage.append(ItemTierUsage("cold", int(count), int(cold_bytes), int(cold_raw)))
            else:
                usage.append(ItemTierUsage(str(tier), int(count), int(hot_bytes), int(hot_bytes)))
        return usage


def _check_scope(scope: MemoryScope) -> None:
    chosen = [name for name in ("namespace", "thread_id", "run_id") if getattr(scope, name) is not None]
    if len(chosen) > 1:
        raise InvalidArgument(f"delete memory by one of namespace, thread or run, not {' and '.join(chosen)}")
    if scope.key is not None and (scope.namespace is None or scope.tenant is None):
        raise InvalidArgument("deleting one item needs its tenant and its exact namespace")
    if not chosen and scope.tenant is None:
        raise InvalidArgument("deleting all memory needs a tenant (one tenant at a time)")


def _count(rows: list[tuple[Any, ...]]) -> int:
    """Rows a DELETE touched; the dialects return none for a plain DELETE, so
    the counting statements end with RETURNING where the count matters."""
    return len(rows)


def _split(payload: Payload) -> tuple[bytes | None, str | None]:
    return payload.data, payload.ref


def _payload(value: Any, ref: Any) -> Payload:
    return Payload(data=None if value is None else bytes(value), ref=ref)


def _provenance(run_id: Any, position: Any, operation_id: Any, actor: Any) -> Provenance:
    return Provenance(run_id, None if position is None else int(position), operation_id, actor)


def _item(row: tuple[Any, ...]) -> MemoryItem:
    """An item of ``select_memory_item``/``list_memory_items``: a cold one's
    value is read through from its cold copy (the last three columns)."""
    metadata = row[5]
    if isinstance(metadata, (str, bytes)):
        metadata = loads(metadata)
    if row[17] == "cold":
        value = Payload(data=coldvalues.thaw(row[18], row[19], None if row[20] is None else bytes(row[20]),
                                             what=f"memory item {row[2]!r}"))
    else:
        value = _payload(row[3], row[4])
    return MemoryItem(
        tenant=row[0], namespace=row[1], key=row[2], value=value, metadata=metadata,
        index_text=row[6], version=int(row[7]), created_at=float(row[8]), updated_at=float(row[9]),
        accessed_at=float(row[10]), ttl=None if row[11] is None else float(row[11]),
        expires_at=None if row[12] is None else float(row[12]),
        provenance=_provenance(row[13], row[14], row[15], row[16]), tier=row[17])


def _message(row: tuple[Any, ...]) -> ThreadMessage:
    return ThreadMessage(tenant=row[0], thread_id=row[1], index=int(row[2]), kind=row[3],
                         value=_payload(row[4], row[5]), created_at=float(row[6]),
                         provenance=_provenance(row[7], row[8], row[9], row[10]))


def _run_memory(row: tuple[Any, ...]) -> RunMemory:
    return RunMemory(run_id=row[0], tenant=row[1], key=row[2], value=_payload(row[3], row[4]),
                     version=int(row[5]), created_at=float(row[6]), updated_at=float(row[7]),
                     provenance=_provenance(row[0], row[8], row[9], row[10]))


__all__ = ["DEFAULT_LIST_LIMIT", "SQLMemory"]
