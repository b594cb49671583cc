"""The vector index of long-term memory, on SQLite and PostgreSQL from one source.

Items and outbox rows are written straight into the tables (``items.py``:
memcore builds the real put); vectors come from the real embedding worker
(``Indexer``) with the shipped ``HashEmbedder``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from cairn.errors import InvalidArgument
from cairn.memory.embedders import HashEmbedder
from cairn.memory.indexer import Indexer, retry_delay
from cairn.models.openai import ModelUnavailable
from cairn.store.contract import Store
from cairn.store.namespaces import encode_namespace, encode_prefix
from cairn.store.sqlite import SQLiteStore
from tests.backends import SqliteBackend, StoreBackend
from tests.memory.items import Items
from tests.store.contract.helpers import FakeClock
from tests.timing import SLACK

EMB = HashEmbedder(64)
PREFS = encode_namespace(("users", "u1", "prefs"))
U10 = encode_namespace(("users", "u10", "prefs"))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(vector_backend: StoreBackend, clock: FakeClock) -> Iterator[Store]:
    opened = vector_backend.open_store(clock)
    yield opened
    opened.close()


@pytest.fixture
def items(vector_backend: StoreBackend, store: Store) -> Items:
    return Items(vector_backend)


def search(store: Store, text: str, prefix: str = "", k: int = 5, tenant: str = "acme",
           **filter: object) -> tuple[list[str], int]:
    found = store.search_memory(tenant, prefix, EMB.embed([text])[0], k, filter or None,  # type: ignore[arg-type]
                                embedder=EMB.name)
    return [hit.key for hit in found.hits], found.unindexed


def drain(store: Store) -> int:
    return Indexer(store, EMB, batch=7).drain()


def test_items_are_found_once_indexed_and_counted_until_then(store: Store, items: Items) -> None:
    items.put("acme", PREFS, "tea", "likes green tea in the morning")
    items.put("acme", PREFS, "bike", "rides a bicycle to work")
    items.put("acme", PREFS, "cat", "has a cat named Miso")
    assert search(store, "green tea") == ([], 3)  # nothing silently missing: three are unindexed
    assert drain(store) == 3
    keys, unindexed = search(store, "green tea")
    assert (keys[0], unindexed) == ("tea", 0)
    assert search(store, "a cat called Miso")[0][0] == "cat"
    assert items.outbox() == []


def test_another_tenant_and_other_namespaces_are_out_of_scope(store: Store, items: Items) -> None:
    items.put("acme", PREFS, "tea", "green tea")
    items.put("acme", U10, "tea10", "green tea")
    items.put("globex", PREFS, "theirs", "green tea")
    drain(store)
    assert sorted(search(store, "green tea")[0]) == ["tea", "tea10"]
    # u1's prefix is not a string prefix of u10's namespace: labels end with the separator
    assert search(store, "green tea", encode_prefix(("users", "u1")))[0] == ["tea"]
    assert search(store, "green tea", tenant="globex")[0] == ["theirs"]
    assert search(store, "green tea", tenant="nobody") == ([], 0)


def test_a_filter_is_applied_before_the_top_k_cut(store: Store, items: Items) -> None:
    for i in range(30):  # near the query, but of another kind
        items.put("acme", PREFS, f"near{i}", "green tea with lemon", metadata={"kind": "drink", "n": i})
    items.put("acme", PREFS, "far", "a quiet walk in the forest", metadata={"kind": "hobby", "flag": True})
    drain(store)
    # a post-filter of the best one would find nothing
    assert search(store, "green tea with lemon", k=1, kind="hobby")[0] == ["far"]
    assert search(store, "green tea", k=3, kind="drink", n=7)[0] == ["near7"]
    assert search(store, "green tea", k=3, n=7.0)[0] == ["near7"]  # JSON numbers: 7 == 7.0
    assert search(store, "walk", flag=True)[0] == ["far"]
    assert search(store, "walk", flag=1)[0] == []  # true is not 1
    assert search(store, "walk", kind="hobby", missing="x")[0] == []


def test_a_stale_vector_is_never_used_and_its_item_is_counted(store: Store, items: Items) -> None:
    items.put("acme", PREFS, "drink", "likes green tea")
    drain(store)
    items.put("acme", PREFS, "drink", "now prefers black coffee")  # version 2, embedded later
    assert search(store, "green tea") == ([], 1)
    drain(store)
    assert search(store, "black coffee") == (["drink"], 0)
    [(_, _, _, version, tier, _)] = items.vectors()
    assert (version, tier) == (2, "hot")


def test_versions_queued_together_are_embedded_once_at_the_newest(store: Store, items: Items) -> None:
    items.put("acme", PREFS, "drink", "green tea")
    items.put("acme", PREFS, "drink", "black coffee")
    claim = store.claim_embeddings("w", 10, 30.0)
    assert [(t.key, t.version, t.text, len(t.outbox_ids)) for t in claim.tasks] == [
        ("drink", 2, "black coffee", 2)]
    assert store.store_embeddings(claim.token, EMB.name, EMB.dims,
                                  [(claim.tasks[0], EMB.embed(["black coffee"])[0])]) == 1
    assert items.outbox() == []


def test_a_store_after_the_claim_was_taken_over_writes_nothing(
    store: Store, items: Items, clock: FakeClock
) -> None:
    items.put("acme", PREFS, "tea", "green tea")
    stale = store.claim_embeddings("frozen", 10, 5.0)
    assert store.claim_embeddings("other", 10, 5.0).tasks == []  # claimed: nobody else gets it
    clock.advance(6)
    fresh = store.claim_embeddings("other", 10, 5.0)
    assert [t.key for t in fresh.tasks] == ["tea"]
    wrong = [1.0] + [0.0] * (EMB.dims - 1)
    assert store.store_embeddings(stale.token, EMB.name, EMB.dims, [(stale.tasks[0], wrong)]) == 0
    store.fail_embeddings(stale.token, [(stale.tasks[0], "late", 0.0)])  # fenced too
    assert items.vectors() == []
    assert items.outbox()[0][5] is None
    good = EMB.embed(["green tea"])[0]
    assert store.store_embeddings(fresh.token, EMB.name, EMB.dims, [(fresh.tasks[0], good)]) == 1
    assert search(store, "green tea") == (["tea"], 0)


def test_a_vector_of_an_item_changed_since_the_claim_is_not_stored(store: Store, items: Items) -> None:
    items.put("acme", PREFS, "drink", "green tea")
    claim = store.claim_embeddings("w", 10, 30.0)
    items.put("acme", PREFS, "drink", "black coffee")
    assert store.store_embeddings(claim.token, EMB.name, EMB.dims,
                                  [(claim.tasks[0], EMB.embed(["green tea"])[0])]) == 0
    assert drain(store) == 1
    assert search(store, "black coffee") == (["drink"], 0)


class Picky:
    """An embedder that refuses one text (permanently) and is down for another (transiently)."""

    name, dims = EMB.name, EMB.dims

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if any("poison" in t for t in texts):
            raise ValueError("input too long")
        if any("flaky" in t for t in texts):
            raise ModelUnavailable("HTTP 503: try later")
        return EMB.embed(texts)


def test_a_failing_item_does_not_block_the_others_and_is_retried_with_backoff(
    store: Store, items: Items, clock: FakeClock
) -> None:
    for key in ("a", "b", "c"):
        items.put("acme", PREFS, key, f"text {key}")
    items.put("acme", PREFS, "bad", "poison pill")
    items.put("acme", PREFS, "down", "flaky one")
    result = Indexer(store, Picky(), batch=10).run_batch()
    assert (result.stored, result.failed) == (3, 2)
    rows = {row[2]: row for row in items.outbox()}
    assert set(rows) == {"bad", "down"}
    assert rows["bad"][4:6] == (1, "ValueError: input too long")
    assert rows["bad"][6] == pytest.approx(clock() + retry_delay(1, transient=False))
    assert rows["down"][6] == pytest.approx(clock() + retry_delay(1, transient=True))
    assert Indexer(store, Picky()).run_batch().claimed == 0  # backing off
    clock.advance(retry_delay(1, transient=True))
    assert Indexer(store, EMB).drain() == 1  # the transient one, now
    clock.advance(retry_delay(1, transient=False))
    assert Indexer(store, EMB).drain() == 1
    assert items.outbox() == []
    assert retry_delay(2, transient=True) == 2 * retry_delay(1, transient=True)


def test_an_item_without_text_or_gone_is_settled_at_the_claim(store: Store, items: Items) -> None:
    items.put("acme", PREFS, "tea", "green tea")
    drain(store)
    items.put("acme", PREFS, "tea", None)  # no longer searchable
    items.execute("INSERT INTO memory_outbox (tenant, namespace, key, version, created_at) "
                  "VALUES ('acme', %s, 'tea', 2, 0)", (PREFS,))
    claim = store.claim_embeddings("w", 10, 30.0)
    assert (claim.tasks, claim.settled) == ([], 1)
    assert items.vectors() == []
    assert items.outbox() == []


def test_cold_vectors_are_quantized_found_and_come_back_hot(
    store: Store, items: Items, clock: FakeClock
) -> None:
    texts = [f"note {i} about topic {i % 7} and word{i}" for i in range(60)]
    for i, text in enumerate(texts):
        items.put("acme", PREFS, f"k{i}", text, at=clock())
    drain(store)
    hot = {t.tier: t for t in store.vector_tiers()}["hot"]
    assert (hot.vectors, hot.bytes) == (60, 60 * EMB.dims * 4)
    queries = [f"topic {i} word{i * 3}" for i in range(7)]
    before = [search(store, q, k=10)[0] for q in queries]
    clock.advance(100)
    items.touch("acme", PREFS, "k0", clock())
    moved = store.tier_vectors(50.0)
    assert (moved.cooled, moved.rewarmed) == (59, 0)
    tiers = {t.tier: t for t in store.vector_tiers("acme")}
    assert tiers["cold"].bytes == 59 * EMB.dims  # a quarter of the float32 bytes
    after = [search(store, q, k=10)[0] for q in queries]
    kept = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(after, before, strict=True)])
    assert kept >= 0.9
    assert search(store, texts[5], k=1)[0] == ["k5"]  # a cold item is still found exactly
    items.touch("acme", PREFS, "k5", clock() + 1)
    clock.advance(1)
    assert store.tier_vectors(50.0) == type(moved)(0, 1)  # k5 goes back to the embedding worker
    assert search(store, texts[5], k=1) == (["k5"], 0)  # still found meanwhile, not "unindexed"
    assert drain(store) == 1
    assert {t.tier: t.vectors for t in store.vector_tiers()} == {"cold": 58, "hot": 2}


def test_bad_searches_are_refused_with_one_line(store: Store) -> None:
    vec = EMB.embed(["x"])[0]
    with pytest.raises(InvalidArgument, match="k must be"):
        store.search_memory("acme", "", vec, 0, embedder=EMB.name)
    with pytest.raises(InvalidArgument, match="all zeros"):
        store.search_memory("acme", "", [0.0] * EMB.dims, 3, embedder=EMB.name)
    with pytest.raises(InvalidArgument, match="non-finite"):
        store.search_memory("acme", "", [float("nan")] * EMB.dims, 3, embedder=EMB.name)
    with pytest.raises(InvalidArgument, match="only a string, number"):
        store.search_memory("acme", "", vec, 3, {"tags": ["a"]}, embedder=EMB.name)  # type: ignore[dict-item]
    with pytest.raises(InvalidArgument, match="dimensions"):
        store.store_embeddings("t", EMB.name, EMB.dims, [(None, [1.0])])  # type: ignore[list-item]


def test_drop_vectors_by_item_and_by_prefix(store: Store, items: Items) -> None:
    items.put("acme", PREFS, "a", "one")
    items.put("acme", PREFS, "b", "two")
    items.put("acme", U10, "c", "three")
    items.put("globex", PREFS, "a", "one")
    drain(store)
    operate = store._operate  # type: ignore[attr-defined]
    operate(lambda tx: store._drop_vectors(tx, "acme", PREFS, "a"))  # type: ignore[attr-defined]
    assert [r[:3] for r in items.vectors()] == [
        ("acme", PREFS, "b"), ("acme", U10, "c"), ("globex", PREFS, "a")]
    operate(lambda tx: store._drop_vectors(tx, "acme", encode_prefix(("users",)), None))  # type: ignore[attr-defined]
    assert [r[:3] for r in items.vectors()] == [("globex", PREFS, "a")]


class Broken:
    """An embedder that answers with vectors of the wrong size for one text."""

    name, dims = EMB.name, EMB.dims

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [[1.0] * 3 if "short" in t else EMB.embed([t])[0] for t in texts]


def test_a_wrong_answer_of_the_embedder_fails_its_item_only(store: Store, items: Items) -> None:
    items.put("acme", PREFS, "ok", "fine text")
    items.put("acme", PREFS, "bad", "short answer")
    result = Indexer(store, Broken()).run_batch()
    assert (result.stored, result.failed) == (1, 1)
    [row] = items.outbox()
    assert row[2] == "bad"
    assert "not 64 finite numbers" in row[5]


def test_a_search_without_an_embedder_name_compares_vectors_of_its_size(store: Store, items: Items) -> None:
    items.put("acme", PREFS, "tea", "green tea")
    drain(store)
    found = store.search_memory("acme", "", EMB.embed(["green tea"])[0], 3)
    assert [h.key for h in found.hits] == ["tea"]
    other = store.search_memory("acme", "", EMB.embed(["green tea"])[0], 3, embedder="another-model")
    assert other.hits == []


def test_the_embedding_worker_keeps_the_tiers_by_itself(store: Store, items: Items, clock: FakeClock) -> None:
    """With ``cold_after`` the indexer's own loop cools what went untouched
    and brings back what is used again: no job for anyone to remember."""
    for i in range(4):
        items.put("acme", PREFS, f"k{i}", f"note number {i} about tea", at=clock())
    assert drain(store) == 4
    clock.advance(100)
    items.touch("acme", PREFS, "k0", clock())
    indexer = Indexer(store, EMB, cold_after=50.0, tier_interval=0.0, poll_interval=0.01)

    def tiers() -> dict[str, int]:
        return {t.tier: t.vectors for t in store.vector_tiers("acme")}

    indexer.start()
    try:
        deadline = time.monotonic() + 30 * SLACK
        while tiers() != {"cold": 3, "hot": 1} and time.monotonic() < deadline:
            time.sleep(0.02)
        assert tiers() == {"cold": 3, "hot": 1}
        items.touch("acme", PREFS, "k2", clock() + 1)  # used again: re-embedded hot by the same loop
        clock.advance(1)
        while tiers() != {"cold": 2, "hot": 2} and time.monotonic() < deadline:
            time.sleep(0.02)
        assert tiers() == {"cold": 2, "hot": 2}
    finally:
        indexer.stop()
    with pytest.raises(ValueError, match="cold_after"):
        Indexer(store, EMB, cold_after=0.0)


def test_the_nearest_vectors_of_expired_or_stale_items_never_crowd_out_the_live_ones(
    store: Store, items: Items, clock: FakeClock
) -> None:
    """SQLite scores the nearest vectors before it checks their items
    (``search_nearest_vectors``) and falls back to the full join when too few
    of those are current: here every one of the nearest 70 is expired or
    stale, more than that first step takes, and the result must still be
    the live items, best first, exactly as the full join orders them."""
    for i in range(60):
        items.put("acme", PREFS, f"old{i:02}", f"green tea number {i}")
    for i in range(10):
        items.put("acme", PREFS, f"stale{i}", f"green tea again {i}")
    for i in range(8):
        items.put("acme", PREFS, f"live{i}", f"coffee and green tea {i}" if i < 3 else f"rides a bike {i}")
    drain(store)
    p = "?" if isinstance(items.backend, SqliteBackend) else "%s"
    items.execute(f"UPDATE memory_items SET expires_at = {p} WHERE key LIKE 'old%%'", (clock() - 1,))
    for i in range(10):  # a new version, not embedded yet: its vector is stale
        items.put("acme", PREFS, f"stale{i}", f"green tea again {i}, changed")
    keys, unindexed = search(store, "green tea", k=5)
    assert unindexed == 10
    assert len(keys) == 5
    assert set(keys) <= {f"live{i}" for i in range(8)}
    assert set(keys[:3]) == {"live0", "live1", "live2"}  # the nearest of the live ones first
    if isinstance(store, SQLiteStore):  # the same as the client's exact scorer over the full join
        store.sqlite_vec = False
        try:
            assert search(store, "green tea", k=5) == (keys, unindexed)
        finally:
            store.sqlite_vec = True
    with_filter, _ = search(store, "green tea", k=5, nothing="here")  # the full join alone: no match
    assert with_filter == []


def test_another_tenants_vector_for_the_same_key_never_scores_this_tenants_item(
    store: Store, items: Items
) -> None:
    """Two tenants may hold the same namespace and key. A search of acme's
    must score acme's item by acme's vector: were the tenant condition missing
    from a statement that scores vectors before joining their items, globex's
    vector (here: the query's very text) would rank acme's "doc" first."""
    items.put("acme", PREFS, "doc", "rides a bicycle to work")
    items.put("acme", PREFS, "cup", "green tea leaves in a cup")
    items.put("globex", PREFS, "doc", "green tea")
    drain(store)
    found = store.search_memory("acme", "", EMB.embed(["green tea"])[0], 2, None, embedder=EMB.name)
    assert [hit.key for hit in found.hits] == ["cup", "doc"]
    own = store.search_memory("acme", "", EMB.embed(["rides a bicycle to work"])[0], 1, None,
                              embedder=EMB.name)
    assert own.hits[0].key == "doc"
    assert own.hits[0].score == pytest.approx(1.0, abs=1e-5)  # acme's doc is scored by acme's own vector
    theirs = store.search_memory("globex", "", EMB.embed(["green tea"])[0], 5, None, embedder=EMB.name)
    assert [(hit.key, round(hit.score, 5)) for hit in theirs.hits] == [("doc", 1.0)]
