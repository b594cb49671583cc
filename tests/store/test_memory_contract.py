"""The store contract suite run against the in-process backend."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cairn.store.memory import MemoryStore
from cairn.store.records import Durability
from tests.store.contract import FakeClock, StoreContract
from tests.store.queue_contract import QueueContract


class TestMemoryStore(StoreContract, QueueContract):
    @pytest.fixture
    def clock(self) -> FakeClock:
        return FakeClock()

    @pytest.fixture
    def store(self, clock: FakeClock) -> Iterator[MemoryStore]:
        store = MemoryStore(clock=clock)
        yield store
        store.close()

    @pytest.mark.parametrize("durability", list(Durability))
    def test_durability_is_kept(self, clock: FakeClock, durability: Durability) -> None:
        """Engine code reads ``store.durability``; the memory store cannot honour
        it, but it reports what it was asked for like every backend does."""
        assert MemoryStore(clock=clock, durability=durability).durability is durability
