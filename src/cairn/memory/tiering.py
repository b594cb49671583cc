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
import threading

from cairn.errors import StoreError
from cairn.store.contract import Store
from cairn.store.memrecords import ItemTierMove

log = logging.getLogger("cairn.memory")


class ItemTiering:
    """Moves item values between the tiers of ``store`` every ``interval`` seconds."""

    def __init__(self, store: Store, cold_after: float, *, interval: float = 60.0, batch: int = 1000,
                 name: str = "tiering") -> None:
        if not cold_after > 0:
            raise ValueError(f"cold_after must be a positive number of seconds, not {cold_after!r}")
        self.store = store
        self.cold_after = cold_after
        self.interval = interval
        self.batch = batch
        self.name = name
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

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

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.tier()
            except StoreError as exc:
                log.warning("%s cannot reach the store: %s", self.name, exc)
            except Exception:  # a side loop of cairn worker must not die of a bug: say so, go on
                log.exception("%s failed a pass", self.name)
            self._stopping.wait(self.interval)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=f"cairn-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


__all__ = ["ItemTiering"]
