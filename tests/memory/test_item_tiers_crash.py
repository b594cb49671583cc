"""A tiering pass of item values killed mid-move (SIGKILL), on SQLite and PostgreSQL.

The pass moves every value in one transaction: killed between clearing an
item's hot value and writing its cold copy, it leaves every item hot with
its value and no cold copy (never lost, never both); the next pass moves
them all, and every value reads back as written.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cairn.store.contract import Store
from cairn.store.memrecords import ItemPut, Provenance
from cairn.store.namespaces import encode_namespace
from cairn.store.records import Payload
from tests.backends import StoreBackend

pytestmark = pytest.mark.slow

NS = encode_namespace(("crash", "tiers"))
ROOT = Path(__file__).resolve().parents[2]


def value(i: int) -> Payload:
    return Payload(data=json.dumps({"i": i, "text": "a value worth compressing; " * 10}).encode())


@pytest.fixture
def store(backend: StoreBackend) -> Iterator[Store]:
    opened = backend.open_store(time.time)
    yield opened
    opened.close()


def tier_in_a_process(url: str, faults: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tests.memory.tier_main", url, "1e-6"], cwd=ROOT,
                          env={**os.environ, "CAIRN_FAULTS": faults}, capture_output=True, text=True,
                          timeout=60)


def test_a_pass_killed_mid_move_leaves_every_item_hot_or_cold(store: Store, backend: StoreBackend) -> None:
    store.write_memory("t1", [ItemPut(NS, f"k{i}", value(i)) for i in range(6)], Provenance(actor="test"))
    time.sleep(0.01)  # idle past the pass's microsecond
    killed = tier_in_a_process(backend.url, "memory.tier_items.mid_move@4")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    items = store.memory_items("t1")
    assert [(i.key, i.tier, i.value) for i in items] == [(f"k{i}", "hot", value(i)) for i in range(6)]
    assert store._select("select_all_item_cold", {}) == []  # type: ignore[attr-defined]
    done = tier_in_a_process(backend.url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["cooled", "6"]
    items = store.memory_items("t1")
    assert [(i.key, i.tier, i.value) for i in items] == [(f"k{i}", "cold", value(i)) for i in range(6)]
    assert len(store._select("select_all_item_cold", {})) == 6  # type: ignore[attr-defined]
