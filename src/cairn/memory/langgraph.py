"""LangGraph's ``BaseStore`` over Cairn's long-term memory (issue 14 item 8).

``CairnStore(store, codec, tenant=...)`` lets a LangGraph graph use Cairn's
``memory_items`` unchanged (``graph.compile(store=CairnStore(...))``): get,
put (with LangGraph's TTL in minutes, and ``refresh_ttl`` on reads), delete
(a put of ``None``), search by namespace prefix with a filter on the value's
fields, and list_namespaces with prefix/suffix conditions and ``max_depth``.
Every write is recorded with the adapter's ``actor`` as its provenance.

Search with a ``query`` is semantic: the adapter's ``embedder`` embeds it
and the store's vector index ranks the items (``Store.search_memory``); the
embedding worker of ``cairn worker`` (or ``memory.indexer``) indexes what a
put wrote, so an item put a moment ago may not be found yet (LangGraph's API
has no way to say so). The value's top-level scalar fields are the item's
metadata, so an equality filter narrows the index's scan before its top-k
cut; other filters apply to the ranked items. Without an embedder such a
search raises ``CairnError`` rather than silently returning unranked items.
Listing namespaces reads the tenant's items (no index of namespaces yet).

Requires ``langgraph`` (the ``langgraph`` extra; ``bench`` and ``dev`` have it too).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import UTC, datetime

from cairn.codec.payloads import PayloadCodec
from cairn.errors import CairnError, InvalidArgument, MissingExtra
from cairn.memory.embedders import Embedder
from cairn.store.contract import Store
from cairn.store.memrecords import ItemDelete, ItemPut, MemoryItem, Provenance
from cairn.store.namespaces import decode_namespace, encode_namespace, encode_prefix
from cairn.store.vectorindex import MAX_K

try:
    from langgraph.store.base import (
        BaseStore,
        GetOp,
        Item,
        ListNamespacesOp,
        MatchCondition,
        Op,
        PutOp,
        Result,
        SearchItem,
        SearchOp,
        TTLConfig,
    )
except ImportError as exc:
    raise MissingExtra("cairn.memory.langgraph", "langgraph") from exc

#: How many items a namespace listing or a filtered search reads at most.
SCAN_LIMIT = 10_000


class CairnStore(BaseStore):
    """A LangGraph store on one tenant's long-term memory."""

    supports_ttl: bool = True

    def __init__(self, store: Store, codec: PayloadCodec, *, tenant: str = "default",
                 actor: str = "langgraph", ttl: TTLConfig | None = None,
                 embedder: Embedder | None = None) -> None:
        if not tenant:
            raise InvalidArgument("CairnStore needs a tenant")
        self._store = store
        self.embedder = embedder
        self._codec = codec
        self.tenant = tenant
        self.actor = actor
        self.ttl_config = ttl

    # -- BaseStore ----------------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        return [self._one(op) for op in ops]

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await asyncio.to_thread(self.batch, list(ops))

    # -- one operation ------------------------------------------------------------------

    def _one(self, op: Op) -> Result:
        if isinstance(op, GetOp):
            found = self._store.memory_item(self.tenant, encode_namespace(op.namespace), op.key,
                                            refresh=op.refresh_ttl)
            return None if found is None else self._item(found)
        if isinstance(op, PutOp):
            self._put(op)
            return None
        if isinstance(op, SearchOp):
            return self._search(op)
        if isinstance(op, ListNamespacesOp):
            return self._namespaces(op)
        raise InvalidArgument(f"unknown store operation {type(op).__name__}")

    def _put(self, op: PutOp) -> None:
        namespace = encode_namespace(op.namespace)
        who = Provenance(actor=self.actor)
        if op.value is None:
            self._store.write_memory(self.tenant, [ItemDelete(namespace, op.key)], who)
            return
        payload, _ = self._codec.dump(dict(op.value))
        index_text: str | None = None
        if op.index is not False:
            fields = op.index if op.index is not None else None
            chosen = {k: v for k, v in op.value.items() if fields is None or k in fields}
            index_text = " ".join(str(v) for v in chosen.values()) or None
        ttl = None if op.ttl is None else float(op.ttl) * 60.0  # LangGraph's TTLs are minutes
        metadata = {k: v for k, v in op.value.items() if isinstance(v, (str, int, float, bool))} or None
        put = ItemPut(namespace, op.key, payload, metadata, index_text, ttl)
        self._store.write_memory(self.tenant, [put], who)

    def _search(self, op: SearchOp) -> list[SearchItem]:
        if op.query:
            return self._semantic(op, op.query)
        found = self._store.memory_items(self.tenant, encode_prefix(op.namespace_prefix), limit=SCAN_LIMIT)
        items = [self._item(i) for i in found]
        if op.filter:
            items = [i for i in items if all(i.value.get(k) == v for k, v in op.filter.items())]
        page = items[op.offset: op.offset + op.limit]
        if op.refresh_ttl:
            for item in page:
                self._store.memory_item(self.tenant, encode_namespace(item.namespace), item.key, refresh=True)
        return [SearchItem(item.namespace, item.key, item.value, item.created_at, item.updated_at)
                for item in page]

    def _semantic(self, op: SearchOp, query: str) -> list[SearchItem]:
        if self.embedder is None:
            raise CairnError("semantic search needs an embedder: CairnStore(..., embedder=...)")
        exact = {k: v for k, v in (op.filter or {}).items() if isinstance(v, (str, int, float, bool))}
        [vector] = self.embedder.embed([query])
        found = self._store.search_memory(self.tenant, encode_prefix(op.namespace_prefix), vector,
                                          min(op.offset + op.limit, MAX_K), exact or None,
                                          embedder=self.embedder.name)
        ranked: list[SearchItem] = []
        for hit in found.hits:
            item = self._store.memory_item(self.tenant, hit.namespace, hit.key, refresh=bool(op.refresh_ttl))
            if item is None:  # deleted or expired since it was ranked
                continue
            value = self._item(item)
            if op.filter and not all(value.value.get(k) == v for k, v in op.filter.items()):
                continue
            ranked.append(SearchItem(value.namespace, value.key, value.value, value.created_at,
                                     value.updated_at, score=float(hit.score)))
        return ranked[op.offset: op.offset + op.limit]

    def _namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        found = self._store.memory_items(self.tenant, "", limit=SCAN_LIMIT)
        names = sorted({decode_namespace(i.namespace) for i in found})
        if op.match_conditions:
            names = [n for n in names if all(_matches(n, c) for c in op.match_conditions)]
        if op.max_depth is not None:
            names = sorted({n[: op.max_depth] for n in names})
        return names[op.offset: op.offset + op.limit]

    def _item(self, item: MemoryItem) -> Item:
        value = self._codec.load(item.value, what=f"memory item {item.key!r}")
        return Item(value=value, key=item.key, namespace=decode_namespace(item.namespace),
                    created_at=datetime.fromtimestamp(item.created_at, UTC),
                    updated_at=datetime.fromtimestamp(item.updated_at, UTC))


def _matches(namespace: tuple[str, ...], condition: MatchCondition) -> bool:
    path = tuple(condition.path)
    if len(path) > len(namespace):
        return False
    if condition.match_type == "prefix":
        part = namespace[: len(path)]
    else:
        part = namespace[len(namespace) - len(path):]
    return all(p == "*" or p == n for p, n in zip(path, part, strict=True))


__all__ = ["CairnStore"]
