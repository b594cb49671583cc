"""The scorers behind ``search_memory`` agree, and ``cairn worker`` indexes.

SQLite scores in SQL with sqlite-vec; where a Python cannot load it (and on
PostgreSQL without pgvector) the client scores the same candidates with
numpy. Both are exact: on the same rows they return the same hits.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from cairn import App
from cairn.memory.embedders import HashEmbedder
from cairn.memory.indexer import Indexer
from cairn.store.namespaces import encode_namespace
from cairn.store.sqlite import SQLiteStore
from cairn.worker.worker import Worker, WorkerSettings
from tests.backends import SqliteBackend
from tests.memory.items import Items
from tests.store.contract.helpers import FakeClock
from tests.timing import SLACK

EMB = HashEmbedder(48)
NS = encode_namespace(("docs",))


def test_sqlite_vec_is_loaded_and_agrees_with_the_client_scorer(tmp_path: Path) -> None:
    clock = FakeClock()
    store = SQLiteStore(tmp_path / "cairn.db", clock=clock)
    try:
        items = Items(SqliteBackend(tmp_path))
        rng = np.random.default_rng(3)
        words = ["tea", "coffee", "bike", "cat", "dog", "rain", "sun", "book", "song", "code"]
        for i in range(200):
            text = " ".join(rng.choice(words, size=4))
            items.put("acme", NS, f"k{i:03}", text, metadata={"even": i % 2 == 0}, at=clock())
        Indexer(store, EMB).drain()
        clock.advance(10)
        store.tier_vectors(5.0, limit=100)  # half of them cold: both tiers are scored
        assert store.sqlite_vec, "sqlite-vec must load here (enable_load_extension or the auto extension)"
        for query in ("tea cat", "rain song code", "bike"):
            vec = EMB.embed([query])[0]
            for flt in (None, {"even": True}):
                in_sql = store.search_memory("acme", "", vec, 10, flt, embedder=EMB.name)
                store.sqlite_vec = False
                try:
                    in_client = store.search_memory("acme", "", vec, 10, flt, embedder=EMB.name)
                finally:
                    store.sqlite_vec = True
                assert [h.key for h in in_sql.hits] == [h.key for h in in_client.hits]
                assert [h.score for h in in_sql.hits] == pytest.approx([h.score for h in in_client.hits],
                                                                        abs=1e-5)
    finally:
        store.close()


def test_cairn_worker_runs_the_embedding_worker_when_the_app_has_an_embedder(tmp_path: Path) -> None:
    app = App(f"sqlite:///{tmp_path / 'cairn.db'}", embedder=EMB)
    items = Items(SqliteBackend(tmp_path))
    for i in range(5):
        items.put("acme", NS, f"k{i}", f"text number {i}", at=time.time())
    worker = Worker(app.runtime, WorkerSettings(concurrency=1))
    assert worker.indexer is not None
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        deadline = time.monotonic() + 30 * SLACK
        while items.outbox():  # until the worker's indexer has drained it
            assert time.monotonic() < deadline, "cairn worker never indexed the items"
            time.sleep(0.05)
    finally:
        worker.stop()
        thread.join()
    assert len(items.vectors()) == 5
    assert Worker(App(f"sqlite:///{tmp_path / 'other.db'}").runtime).indexer is None
    app.store.close()
