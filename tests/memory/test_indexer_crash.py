"""The embedding worker under SIGKILL and SIGSTOP, on SQLite and PostgreSQL.

Real worker processes (``indexer_main``) drain the outbox while the test puts
new versions of the items; each round kills the worker, at a random instant
or at a named fault point (leased but not embedded, embedded but not stored,
stored but not committed, committed but not told). Whatever the kills did,
once a last worker has drained the outbox every item has exactly one vector,
of its latest version, equal to the embedding of its latest text.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from cairn.memory.embedders import HashEmbedder
from cairn.memory.indexer import Indexer
from cairn.store.contract import Store
from cairn.store.namespaces import encode_namespace
from tests import processes
from tests.backends import StoreBackend
from tests.memory.items import Items
from tests.timing import SLACK

pytestmark = pytest.mark.slow

EMB = HashEmbedder(64)
NS = encode_namespace(("crash",))
ROOT = Path(__file__).resolve().parents[2]
POINTS = ["indexer.after_claim", "indexer.after_embed", "store.store_embeddings.before_commit",
          "store.store_embeddings.after_commit", None, None]


def spawn(url: str, worker_id: str, *args: str, faults: str = "") -> subprocess.Popen[str]:
    proc = processes.spawn("tests.memory.indexer_main", [url, worker_id, *args], env={"CAIRN_FAULTS": faults},
                           stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.fixture
def store(backend: StoreBackend) -> Iterator[Store]:
    opened = backend.open_store(time.time)
    yield opened
    opened.close()


def wait_for_leases(items: Items) -> None:
    """Until every lease a killed worker left has expired (a condition, not a nap)."""
    deadline = time.monotonic() + 30 * SLACK
    while any(row[6] is not None and row[6] > time.time() for row in items.outbox()):
        assert time.monotonic() < deadline, "leases never expired"
        time.sleep(0.05)


def test_every_item_is_indexed_once_at_its_latest_version_whatever_the_kills(
    backend: StoreBackend, store: Store
) -> None:
    rng = random.Random(int(os.environ.get("CAIRN_TEST_SEED", "14")))
    items = Items(backend)
    latest: dict[str, str] = {}
    for i in range(40):
        latest[f"k{i}"] = f"item {i} first text"
        items.put("acme", NS, f"k{i}", latest[f"k{i}"], at=time.time())
    for round_ in range(8):
        point = rng.choice(POINTS)
        faults = f"{point}@{rng.randint(1, 3)}" if point else ""
        proc = spawn(backend.worker_url(f"ix{round_}"), f"ix{round_}", "--lease", "0.5", faults=faults)
        for _ in range(rng.randint(0, 6)):  # new versions while it works
            key = f"k{rng.randrange(40)}"
            latest[key] = f"item {key} text of round {round_} {rng.random()}"
            items.put("acme", NS, key, latest[key], at=time.time())
        try:
            proc.wait(timeout=rng.uniform(0.05, 0.6))  # a fault point killed it
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)  # or we do, wherever it is
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL
    wait_for_leases(items)
    Indexer(store, EMB).drain()

    assert items.outbox() == []
    rows = items.vectors()
    assert [row[2] for row in rows] == sorted(latest)  # exactly one vector per item
    versions = dict(items.execute("SELECT key, version FROM memory_items"))
    for _, _, key, version, tier, embedding in rows:
        assert (version, tier) == (versions[key], "hot")
        expected = np.asarray(EMB.embed([latest[key]])[0], dtype="<f4").tobytes()
        assert bytes(embedding) == expected, f"{key} has the vector of another text"


def test_a_frozen_worker_whose_claim_was_taken_over_stores_nothing(
    backend: StoreBackend, store: Store, tmp_path: Path
) -> None:
    items = Items(backend)
    for i in range(3):
        items.put("acme", NS, f"k{i}", f"text {i}", at=time.time())
    go = tmp_path / "go"
    frozen = spawn(backend.worker_url("frozen"), "frozen", "--once", "--lease", "0.5", "--go", str(go))
    assert frozen.stdout is not None
    try:
        assert frozen.stdout.readline().strip() == "claimed 3"
        frozen.send_signal(signal.SIGSTOP)
        wait_for_leases(items)
        for i in range(2):  # two items change meanwhile (a late store would regress them), k2 does not
            items.put("acme", NS, f"k{i}", f"new text {i}", at=time.time())
        assert Indexer(store, EMB, worker_id="live").drain() == 3
        go.touch()
        frozen.send_signal(signal.SIGCONT)
        assert frozen.stdout.readline().strip() == "stored 0"
        assert frozen.wait(timeout=30) == 0
    finally:
        if frozen.poll() is None:
            frozen.send_signal(signal.SIGCONT)
            frozen.kill()
            frozen.wait()
        frozen.stdout.close()
    texts = {"k0": "new text 0", "k1": "new text 1", "k2": "text 2"}
    for _, _, key, version, _, embedding in items.vectors():
        assert version == (1 if key == "k2" else 2)
        assert bytes(embedding) == np.asarray(EMB.embed([texts[key]])[0], dtype="<f4").tobytes()
