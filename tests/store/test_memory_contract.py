"""The store contract suite run against the in-process backend."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cairn.store.memory import MemoryStore
from tests.store.contract import FakeClock, StoreContract


class TestMemoryStore(StoreContract):
    @pytest.fixture
    def clock(self) -> FakeClock:
        return FakeClock()

    @pytest.fixture
    def store(self, clock: FakeClock) -> Iterator[MemoryStore]:
        store = MemoryStore(clock=clock)
        yield store
        store.close()
