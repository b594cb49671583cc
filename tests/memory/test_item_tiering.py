"""The thread of ``cairn worker`` that keeps the cold tier of item values
(``memory.tiering``), on a real SQLite store: its passes drain whatever is
idle in batches, and its loop does so by itself until stopped."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from cairn.memory.tiering import ItemTiering
from cairn.store.memrecords import ItemPut, ItemTierMove, Provenance
from cairn.store.namespaces import encode_namespace
from cairn.store.records import Payload
from cairn.store.sqlite import SQLiteStore
from tests.timing import SLACK

NS = encode_namespace(("notes",))


def _fill(store: SQLiteStore, n: int) -> None:
    values = [Payload(data=json.dumps({"i": i, "text": "x " * 50}).encode()) for i in range(n)]
    puts = [ItemPut(NS, f"k{i}", v) for i, v in enumerate(values)]
    store.write_memory("t1", puts, Provenance(actor="test"))


def test_a_pass_moves_every_idle_value_in_batches(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "t.db")
    try:
        _fill(store, 25)
        time.sleep(0.02)
        assert ItemTiering(store, 0.01, batch=10).tier() == ItemTierMove(25, 0)  # 10 + 10 + 5
        assert {u.tier: u.items for u in store.item_tiers()} == {"cold": 25}
    finally:
        store.close()


def test_the_loop_cools_by_itself_until_stopped(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "t.db")
    tiering = ItemTiering(store, 0.01, interval=0.01)
    try:
        _fill(store, 3)
        tiering.start()
        deadline = time.monotonic() + 10 * SLACK
        while {u.tier: u.items for u in store.item_tiers()} != {"cold": 3}:
            assert time.monotonic() < deadline, "the loop never cooled the idle values"
            time.sleep(0.01)
    finally:
        tiering.stop()
        store.close()


def test_cold_after_must_be_positive(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "t.db")
    try:
        with pytest.raises(ValueError, match="cold_after"):
            ItemTiering(store, 0)
    finally:
        store.close()
