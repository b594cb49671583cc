"""The vector index of long-term memory, written once over the SQL dialects.

Vectors are *derived* data: an item's put commits the item and an outbox row
(``memory_outbox``) in the step's transaction; the embedding worker
(``cairn.memory.indexer``) later claims outbox rows, embeds the items' index
texts and stores their vectors here. So an embedding (slow, failing, paid)
never sits in a step's commit, and nothing can drift: a vector is stored
only for the item version it was computed from, and search uses a vector
only while its item is still at that version.

The rules, each in one place below:

* **Claims are leases, stores are fenced.** ``claim_embeddings`` takes ready
  outbox rows under a fresh token until ``now + lease``. ``store_embeddings``
  writes a vector only while every outbox row it answers is still claimed by
  that token (PostgreSQL holds the rows ``FOR UPDATE`` for the check): a
  worker frozen past its lease whose rows another worker re-claimed stores
  nothing. A store deletes the item's outbox rows up to the version stored.
* **Versions only go forward.** The upsert keeps a stored vector of a newer
  version; one row per item (its primary key), so an item is indexed once.
* **Search is exact and pre-filtered.** The tenant, the namespace prefix, the
  embedder, the item's current version, expiry and the metadata filter are
  all conditions of the scan, and the top ``k`` are cut after them: a filter
  never loses recall to a post-filter. SQLite scores with sqlite-vec's
  ``vec_distance_cosine`` in SQL (measured at 100k x 384: 137 ms brute force
  on the table against 113 ms for a ``vec0`` KNN, which is brute force too
  but cannot pre-filter on JSON metadata); PostgreSQL with pgvector's
  ``<=>`` where migration 0016 found the extension (exact: no ANN index,
  see docs/design.md), else the client scores the rows in scope with numpy
  (``ExactScorer``: exact, a chunk of rows at a time, and it moves
  ``4 * dims`` bytes per item in scope per search). A search reports
  ``unindexed``, the items in scope whose newest version has no vector yet.
* **Hot and cold.** ``tier_vectors`` quantizes the vectors of items nobody
  touched for a while to int8 with a per-vector scale (a quarter of the
  bytes; cosine is scale-free, so the scale only matters to a reader that
  wants the components back), and sends cold vectors of items touched again
  to the embedding worker, which stores them hot (float32) again.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from cairn.errors import InvalidArgument
from cairn.faults import fault_point
from cairn.store.sqlprimitives import SQLPrimitives

Tx = TypeVar("Tx")

#: the most hits one search returns
MAX_K = 1000
#: a stored error is cut to this many characters
_MAX_ERROR = 500

Scalar = str | int | float | bool | None
#: ``(namespace, key, version, cosine distance)`` of one scored vector
Scored = tuple[str, str, int, float]


@dataclass(frozen=True, slots=True)
class MemoryHit:
    namespace: str  # encoded (cairn.store.namespaces)
    key: str
    score: float  # cosine similarity, 1 = same direction
    version: int  # the item version the vector was made from (always the item's current one)


@dataclass(frozen=True, slots=True)
class MemorySearch:
    hits: list[MemoryHit]
    #: items in scope whose newest version has no vector yet (pending in the outbox)
    unindexed: int


@dataclass(frozen=True, slots=True)
class EmbeddingTask:
    """One item to embed: its text at ``version`` (read at the claim), and
    the outbox rows the vector will answer."""

    tenant: str
    namespace: str
    key: str
    version: int
    text: str
    outbox_ids: tuple[int, ...]
    #: claims of these rows so far, this one included (crashes count too)
    attempts: int


@dataclass(frozen=True, slots=True)
class EmbeddingClaim:
    token: str
    tasks: list[EmbeddingTask]
    #: outbox rows settled at the claim with nothing to embed (item gone or no index text)
    settled: int = 0


@dataclass(frozen=True, slots=True)
class TierUsage:
    tier: str  # 'hot' | 'cold'
    vectors: int
    bytes: int  # of the vectors themselves (the rows carry keys and metadata besides)


@dataclass(frozen=True, slots=True)
class TierMove:
    cooled: int
    rewarmed: int  # queued for re-embedding


def encode_vector(vector: Sequence[float], dims: int) -> bytes:
    """``dims`` finite floats as little-endian float32 (what sqlite-vec reads)."""
    import numpy as np  # here and below, not at the top: ``import cairn`` need not pay 0.1 s for it
    array = np.asarray(vector, dtype="<f4")
    if array.shape != (dims,):
        raise InvalidArgument(f"a vector of {len(vector)} dimensions where {dims} are expected")
    if not np.isfinite(array).all():
        raise InvalidArgument("a vector with a non-finite component")
    return array.tobytes()


def quantize(embedding: bytes) -> tuple[bytes, float]:
    """A float32 vector as int8 components and the scale that maps them back."""
    import numpy as np
    array = np.frombuffer(embedding, dtype="<f4")
    top = float(np.abs(array).max()) if array.size else 0.0
    scale = top / 127.0 if top > 0 else 1.0
    return np.clip(np.rint(array / scale), -127, 127).astype(np.int8).tobytes(), scale


def encode_filter(filter: Mapping[str, Scalar] | None) -> str | None:
    """A metadata filter as JSON text: equality on each key, scalar values only."""
    if not filter:
        return None
    for key, value in filter.items():
        if not isinstance(key, str) or not key:
            raise InvalidArgument(f"metadata filter key {key!r} must be a non-empty string")
        if value is not None and not isinstance(value, str | int | float | bool):
            raise InvalidArgument(f"metadata filter on {key!r}: only a string, number, boolean or null "
                                  f"can be matched, not {type(value).__name__}")
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidArgument(f"metadata filter on {key!r}: {value!r} is not a JSON number")
    return json.dumps(dict(filter), sort_keys=True)


class VectorIndex(SQLPrimitives[Tx]):
    """The vector methods of the store contract over a dialect's primitives
    (mixed into ``sqlbase.SQLStore``; the dialect may score in SQL)."""

    def _scored_in_sql(self, params: dict[str, Any], query: bytes) -> list[Scored] | None:
        """``(namespace, key, version, distance)`` of the best ``params['k']``
        vectors in scope, scored by the database; ``None`` where it cannot
        (the client scores them: ``score_candidates``)."""
        return None

    def _upsert_vector(self, tx: Tx, params: dict[str, Any]) -> None:
        """Store one item's vector, hot (``upsert_vector``); a dialect with its
        own copy of hot vectors writes that copy in the same statement
        (pgvector's column: one row version written, not two)."""
        self._query(tx, "upsert_vector", params)

    def _cool_vector(self, tx: Tx, params: dict[str, Any]) -> None:
        """Turn one hot vector cold (``cool_vector``); a dialect with its own
        copy of hot vectors drops that copy in the same statement (pgvector's
        column: one row version written, not two)."""
        self._query(tx, "cool_vector", params)

    # -- search -------------------------------------------------------------------------

    def search_memory(
        self, tenant: str, namespace_prefix: str, vector: Sequence[float], k: int,
        filter: Mapping[str, Scalar] | None = None, *, embedder: str | None = None,
    ) -> MemorySearch:
        """The ``k`` items of ``tenant`` under ``namespace_prefix`` (encoded;
        "" for all) whose vectors by ``embedder`` are nearest ``vector`` by
        cosine, best first (ties by namespace and key), among those whose
        metadata matches ``filter``; and how many items in scope are not
        indexed yet. Pass the embedder's name: ``None`` compares with the
        vectors of every embedder of the same dimension, which is only right
        where a deployment has only ever used one."""
        if not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise InvalidArgument(f"k must be an integer from 1 to {MAX_K}, not {k!r}")
        import numpy as np

        query = encode_vector(vector, len(vector))
        if not np.any(np.frombuffer(query, dtype="<f4")):
            raise InvalidArgument("the query vector is all zeros: it has no direction to compare")
        params: dict[str, Any] = {
            "tenant": tenant, "prefix": namespace_prefix, "embedder": embedder, "dims": len(vector),
            "now": self.clock(), "filter": encode_filter(filter), "k": k, "tier": None}
        scored = self._scored_in_sql(params, query)
        if scored is None:
            scored = score_candidates(self._select("search_candidates", params), query, k)
        hits = [MemoryHit(ns, key, 1.0 - distance, version) for ns, key, version, distance in scored]
        ((unindexed,),) = self._select("count_unindexed", {"tenant": tenant, "prefix": namespace_prefix})
        return MemorySearch(hits, int(unindexed))

    # -- the embedding worker's side ----------------------------------------------------

    def claim_embeddings(self, worker: str, limit: int, lease_seconds: float) -> EmbeddingClaim:
        """Claim up to ``limit`` ready outbox rows for ``lease_seconds``, one
        task per item (several versions pending: the newest text, once)."""
        token = f"{worker}:{uuid.uuid4().hex[:12]}"

        def body(tx: Tx) -> EmbeddingClaim:
            now = self.clock()
            rows = self._query(tx, "claim_outbox", {"token": token, "now": now, "until": now + lease_seconds,
                                                    "limit": limit})
            grouped: dict[tuple[str, str, str], list[tuple[int, int]]] = {}
            for outbox_id, tenant, namespace, key, _version, attempts in rows:
                grouped.setdefault((tenant, namespace, key), []).append((int(outbox_id), int(attempts)))
            tasks, settled = [], 0
            for (tenant, namespace, key), claimed in sorted(grouped.items()):
                item = {"tenant": tenant, "namespace": namespace, "key": key}
                found = self._query(tx, "outbox_item", item)
                if not found or found[0][1] is None:  # gone, or not searchable any more
                    for outbox_id, _ in claimed:
                        self._query(tx, "delete_outbox_row", {"id": outbox_id})
                    self._query(tx, "delete_vector", item)
                    settled += len(claimed)
                    continue
                version, text = found[0]
                tasks.append(EmbeddingTask(tenant, namespace, key, int(version), str(text),
                                           tuple(i for i, _ in claimed), max(a for _, a in claimed)))
            return EmbeddingClaim(token, tasks, settled)

        return self._operate(body)

    def store_embeddings(
        self, token: str, embedder: str, dims: int, results: Sequence[tuple[EmbeddingTask, Sequence[float]]]
    ) -> int:
        """Store each task's vector, fenced by the claim ``token``; how many
        were stored (a task whose rows were re-claimed, or whose item moved
        on since the claim, stores nothing)."""
        encoded = [(task, encode_vector(vector, dims)) for task, vector in results]

        def body(tx: Tx) -> int:
            now, stored = self.clock(), 0
            for task, embedding in encoded:
                held = [self._query(tx, "outbox_claimed", {"id": i, "token": token}) for i in task.outbox_ids]
                if not all(held):
                    continue  # the fence: the claim lapsed and someone else holds these rows
                item = {"tenant": task.tenant, "namespace": task.namespace, "key": task.key}
                found = self._query(tx, "outbox_item", item)
                if not found or int(found[0][0]) != task.version:
                    continue  # changed since the claim: its newer version has an outbox row of its own
                self._upsert_vector(tx, {**item, "version": task.version, "embedder": embedder, "dims": dims,
                                         "embedding": embedding, "now": now})
                self._query(tx, "delete_outbox_upto", {**item, "version": task.version})
                stored += 1
            fault_point("store.store_embeddings.before_commit")
            return stored

        if not encoded:
            return 0
        stored = self._operate(body)
        fault_point("store.store_embeddings.after_commit")
        return stored

    def fail_embeddings(self, token: str, failures: Sequence[tuple[EmbeddingTask, str, float]]) -> None:
        """Give the rows of failed tasks back, each ready again ``delay``
        seconds from now, with its error recorded (fenced like a store)."""

        def body(tx: Tx) -> None:
            now = self.clock()
            for task, error, delay in failures:
                for outbox_id in task.outbox_ids:
                    self._query(tx, "fail_outbox", {"id": outbox_id, "token": token, "retry_at": now + delay,
                                                    "error": error[:_MAX_ERROR]})

        if failures:
            self._operate(body)

    def _drop_vectors(self, tx: Tx, tenant: str, namespace: str, key: str | None) -> None:
        """Delete, inside the caller's transaction, the vector of item
        ``(namespace, key)`` or (``key`` None) every vector of ``tenant``
        under the namespace prefix ``namespace``: for memory deletions."""
        self._query(tx, "drop_vectors", {"tenant": tenant, "namespace": namespace, "key": key})

    # -- tiers --------------------------------------------------------------------------

    def tier_vectors(self, idle_seconds: float, *, limit: int = 1000) -> TierMove:
        """Quantize up to ``limit`` hot vectors of items not accessed for
        ``idle_seconds``; queue cold vectors of items accessed since for
        re-embedding (they come back hot)."""
        if not idle_seconds > 0:
            raise InvalidArgument(f"idle_seconds must be positive, not {idle_seconds!r}")

        def body(tx: Tx) -> TierMove:
            now = self.clock()
            cut = now - idle_seconds
            rows = self._query(tx, "vectors_to_cool", {"before": cut, "limit": limit})
            for tenant, namespace, key, version, embedding in rows:
                small, scale = quantize(bytes(embedding))
                self._cool_vector(tx, {"tenant": tenant, "namespace": namespace, "key": key,
                                       "version": version, "embedding": small, "scale": scale})
            rewarmed = self._query(tx, "rewarm_vectors", {"since": cut, "now": now})
            return TierMove(len(rows), len(rewarmed))

        return self._operate(body)

    def vector_tiers(self, tenant: str | None = None) -> list[TierUsage]:
        """Vectors and their bytes per tier (of one tenant, or every tenant the store sees)."""
        return [TierUsage(str(tier), int(count), int(size))
                for tier, count, size in self._select("vector_tiers", {"tenant": tenant})]


class ExactScorer:
    """The exact search in the client, fed candidate rows ``(namespace, key,
    version, tier, scale, embedding)`` a chunk at a time: it keeps only the
    best ``k`` so far (and whatever ties the ``k``-th), so a scope of any
    size is scored in the memory of one chunk. Cold (int8) rows are compared
    with the query quantized the same way, which is what sqlite-vec computes
    for them in SQL: both scorers agree."""

    def __init__(self, query: bytes, k: int) -> None:
        import numpy as np

        self.k = k
        hot = np.frombuffer(query, dtype="<f4").astype(np.float32)
        cold = np.frombuffer(quantize(query)[0], dtype=np.int8).astype(np.float32)
        self._queries: dict[str, tuple[Any, float, np.dtype[Any]]] = {
            "hot": (hot, float(np.linalg.norm(hot)), np.dtype("<f4")),
            "cold": (cold, float(np.linalg.norm(cold)), np.dtype(np.int8))}
        self._best: list[Scored] = []

    def add(self, rows: Sequence[tuple[Any, ...]]) -> None:
        import numpy as np

        if not rows:
            return
        distance = np.empty(len(rows), dtype=np.float64)
        tiers = np.array([row[3] for row in rows])
        for tier, (q, q_norm, dtype) in self._queries.items():
            indexes = np.flatnonzero(tiers == tier).tolist()
            if not indexes:
                continue
            matrix = np.frombuffer(b"".join([rows[i][5] for i in indexes]), dtype=dtype)
            matrix = matrix.reshape(len(indexes), -1).astype(np.float32)  # float32: 4 bytes per component
            norms = np.linalg.norm(matrix, axis=1) * q_norm
            norms[norms == 0] = 1.0  # no direction: similarity 0
            distance[indexes] = 1.0 - (matrix @ q) / norms
        if len(rows) > self.k:  # the chunk's best k, and every row tied with its k-th
            cut = np.partition(distance, self.k - 1)[self.k - 1]
            keep: list[int] = np.flatnonzero(distance <= cut).tolist()
        else:
            keep = list(range(len(rows)))
        self._best.extend((rows[i][0], rows[i][1], int(rows[i][2]), float(distance[i])) for i in keep)
        self._best.sort(key=lambda hit: (hit[3], hit[0], hit[1]))
        del self._best[self.k:]

    def result(self) -> list[Scored]:
        """The best ``k`` of every row added, best first (ties by namespace and key)."""
        return list(self._best)


def score_candidates(rows: Sequence[tuple[Any, ...]], query: bytes, k: int) -> list[Scored]:
    """The exact search in the client over rows fetched at once (``ExactScorer``)."""
    scorer = ExactScorer(query, k)
    scorer.add(rows)
    return scorer.result()
