"""The cold tier of long-term item values, kept by a thread of ``cairn worker``.

With ``MemoryPolicy(cold_after=...)`` every worker runs an ``ItemTiering``
thread that calls ``Store.tier_items`` every ``interval`` seconds: values of
items untouched for ``cold_after`` go cold (compressed, out of the hot row),
cold ones touched since come back. Each pass is one store transaction and
idempotent, so any number of workers may run it at once and a killed one
leaves nothing half-moved. (The vectors' tiers are the embedding worker's,
``memory.indexer``: they need the embedder to come back.)
"""

from __future__ import annotations

import logging

from cairn.sideloop import SideLoop
from cairn.store.contract import Store
from cairn.store.memrecords import ItemTierMove

log = logging.getLogger("cairn.memory")


class ItemTiering(SideLoop):
    """Moves item values between the tiers of ``store`` every ``interval`` seconds."""

    def __init__(self, store: Store, cold_after: float, *, interval: float = 60.0, batch: int = 1000,
                 name: str = "tiering") -> None:
        if not cold_after > 0:
            raise ValueError(f"cold_after must be a positive number of seconds, not {cold_after!r}")
        super().__init__(name, log, max_wait=interval)
        self.store = store
        self.cold_after = cold_after
        self.interval = interval
        self.batch = batch

    def tier(self) -> ItemTierMove:
        """One pass, until a pass moves less than a full batch."""
        cooled = rewarmed = 0
        while True:
            moved = self.store.tier_items(self.cold_after, limit=self.batch)
            cooled, rewarmed = cooled + moved.cooled, rewarmed + moved.rewarmed
            if moved.cooled < self.batch and moved.rewarmed < self.batch:
                break
        if cooled or rewarmed:
            log.info("%s: %d item values cooled, %d back hot", self.name, cooled, rewarmed)
        return ItemTierMove(cooled, rewarmed)

    def cycle(self) -> float:
        self.tier()
        return self.interval


__all__ = ["ItemTiering"]
