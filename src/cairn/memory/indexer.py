"""The embedding worker: drains ``memory_outbox`` into ``memory_vectors``.

It runs as a thread of ``cairn worker`` when the app has an embedder
(``App(embedder=...)``), and standalone (``Indexer.run``, or ``run_batch`` for
tests). Every pass claims a batch of outbox rows under a lease, embeds the
items' texts, and stores the vectors fenced by the claim (see
``store.vectorindex``): any number of indexers may run at once, a killed one
leaves leases that simply expire, and one frozen past its lease stores
nothing once another has re-claimed its rows.

Failures: the batch is embedded in one call; if that call fails, each item
is embedded alone, so one text the embedder refuses (too long, say) does not
hold back the others. A failed item goes back with its error recorded and a
back-off that doubles with its attempts (``retry_delay``): a transient
error (``ModelUnavailable``) is retried soon, a permanent one rarely, since
only a new put of the item (a new outbox row) is likely to change it.

Tiers: with ``cold_after`` (``MemoryPolicy(cold_after=...)``) the loop also
moves the vectors of items untouched that long to the cold tier, and queues
cold ones whose items were used since for re-embedding, every
``tier_interval`` seconds (``Store.tier_vectors``): the hot/cold split is
kept by the same thread that keeps the index, not by a job to remember.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from cairn.faults import fault_point
from cairn.memory.embedders import Embedder
from cairn.models.errors import ModelUnavailable
from cairn.sideloop import SideLoop
from cairn.store.contract import Store
from cairn.store.vectorindex import EmbeddingTask, TierMove

log = logging.getLogger("cairn.memory")

#: the longest back-off of a failing item, transient and permanent
MAX_TRANSIENT_DELAY = 300.0
MAX_PERMANENT_DELAY = 3600.0


def retry_delay(attempts: int, *, transient: bool) -> float:
    """Seconds before a failed item is tried again: 1, 2, 4, ... (x 30 for a permanent error)."""
    base = 2.0 ** min(max(attempts - 1, 0), 20)
    return min(base, MAX_TRANSIENT_DELAY) if transient else min(30.0 * base, MAX_PERMANENT_DELAY)


@dataclass(frozen=True, slots=True)
class BatchResult:
    claimed: int
    stored: int
    failed: int


class Indexer(SideLoop):
    """Embeds what ``store``'s outbox holds with ``embedder``; as a side loop
    of ``cairn worker``, drains the outbox, then polls it every ``poll_interval``
    seconds, and with ``cold_after`` re-tiers vectors every ``tier_interval``."""

    def __init__(self, store: Store, embedder: Embedder, *, worker_id: str = "indexer", batch: int = 64,
                 lease_seconds: float = 60.0, poll_interval: float = 1.0, cold_after: float | None = None,
                 tier_interval: float = 60.0) -> None:
        if batch < 1:
            raise ValueError(f"batch must be at least 1, not {batch}")
        if cold_after is not None and not cold_after > 0:
            raise ValueError(f"cold_after must be a positive number of seconds, not {cold_after!r}")
        #: seconds an item goes untouched before its vector turns cold (``None``: never)
        self.cold_after = cold_after
        self.tier_interval = tier_interval
        self._tiered_at = -math.inf
        self.store = store
        self.embedder = embedder
        self.worker_id = worker_id
        self.batch = batch
        self.lease_seconds = lease_seconds
        self.poll_interval = poll_interval
        super().__init__(f"indexer-{worker_id}", log, max_wait=poll_interval)

    def run_batch(self) -> BatchResult:
        """Claim, embed and store one batch."""
        claim = self.store.claim_embeddings(self.worker_id, self.batch, self.lease_seconds)
        if not claim.tasks:
            return BatchResult(claim.settled, 0, 0)
        fault_point("indexer.after_claim")
        done, failures = self._embed(claim.tasks)
        fault_point("indexer.after_embed")
        stored = self.store.store_embeddings(claim.token, self.embedder.name, self.embedder.dims, done)
        self.store.fail_embeddings(claim.token, failures)
        return BatchResult(len(claim.tasks) + claim.settled, stored, len(failures))

    def _embed(
        self, tasks: Sequence[EmbeddingTask]
    ) -> tuple[list[tuple[EmbeddingTask, list[float]]], list[tuple[EmbeddingTask, str, float]]]:
        try:
            return list(zip(tasks, self._vectors([t.text for t in tasks]), strict=True)), []
        except Exception as exc:
            if len(tasks) == 1:
                return [], [_failure(tasks[0], exc)]
        done, failures = [], []
        for task in tasks:  # one by one: find the items that fail
            try:
                done.append((task, self._vectors([task.text])[0]))
            except Exception as exc:
                failures.append(_failure(task, exc))
        return done, failures

    def _vectors(self, texts: list[str]) -> list[list[float]]:
        """The embedder's vectors, checked: a wrong answer fails its items, not the batch's store."""
        vectors = self.embedder.embed(texts)
        if len(vectors) != len(texts):
            raise ValueError(f"{self.embedder.name} returned {len(vectors)} vectors for {len(texts)} texts")
        for vector in vectors:
            if len(vector) != self.embedder.dims or not all(math.isfinite(x) for x in vector):
                raise ValueError(f"{self.embedder.name} returned a vector that is not {self.embedder.dims} "
                                 f"finite numbers")
        return vectors

    def drain(self) -> int:
        """Run batches until a claim finds nothing ready; the vectors stored."""
        stored = 0
        while True:
            result = self.run_batch()
            stored += result.stored
            if result.claimed == 0:
                return stored

    # -- as a thread of cairn worker --------------------------------------------------------

    def tier(self) -> TierMove | None:
        """Move vectors between the tiers now (``None`` without ``cold_after``)."""
        if self.cold_after is None:
            return None
        self._tiered_at = time.monotonic()
        moved = self.store.tier_vectors(self.cold_after)
        if moved.cooled or moved.rewarmed:
            log.info("indexer %s: %d vectors cooled, %d queued to come back hot", self.worker_id,
                     moved.cooled, moved.rewarmed)
        return moved

    def cycle(self) -> float:
        if self.cold_after is not None and time.monotonic() - self._tiered_at >= self.tier_interval:
            self.tier()
        return 0.0 if self.run_batch().claimed else self.poll_interval


def _failure(task: EmbeddingTask, exc: Exception) -> tuple[EmbeddingTask, str, float]:
    transient = isinstance(exc, ModelUnavailable)
    return task, f"{type(exc).__name__}: {exc}", retry_delay(task.attempts, transient=transient)
