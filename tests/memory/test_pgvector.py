"""The pgvector path, on a real PostgreSQL with pgvector (``tests/pgvector_cluster.py``).

``test_vector_index.py`` runs the vector index's contract on it too (its
``[pgvector]`` ids); these pin what only this path has: its scores are the
exact scorer's, its ``vec`` column follows the stored vectors through the
tiers, and the extension is found wherever it was created.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import psycopg
import pytest

from cairn.memory.embedders import HashEmbedder
from cairn.memory.indexer import Indexer
from cairn.store import postgres as postgres_module
from cairn.store.namespaces import encode_namespace
from cairn.store.postgres import PostgresStore
from tests.backends import libpq_url
from tests.memory.items import Items
from tests.pgvector_cluster import PgvectorBackend
from tests.store.contract.helpers import FakeClock

EMB = HashEmbedder(48)
NS = encode_namespace(("docs",))


class WithZero:
    """The hash embedder, but "nothing" embeds as the zero vector (no direction)."""

    name, dims = EMB.name, EMB.dims

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [[0.0] * EMB.dims if t == "nothing" else EMB.embed([t])[0] for t in texts]


@pytest.fixture
def database(pgvector_admin_url: str) -> Iterator[PgvectorBackend]:
    backend = PgvectorBackend(pgvector_admin_url, prefix="cairn_pgv")
    try:
        yield backend
    finally:
        backend.drop()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(database: PgvectorBackend, clock: FakeClock) -> Iterator[PostgresStore]:
    opened = database.open_store(clock)
    assert isinstance(opened, PostgresStore)
    yield opened
    opened.close()


def vec_column(items: Items) -> dict[str, tuple[str, np.ndarray | None, np.ndarray]]:
    """key -> (tier, the ``vec`` column's components or None, the stored embedding as floats)."""
    rows = items.execute("SELECT key, tier, vec::text, embedding, scale FROM memory_vectors ORDER BY key")
    out = {}
    for key, tier, vec, embedding, scale in rows:
        dtype = "<f4" if tier == "hot" else np.int8
        stored = np.frombuffer(bytes(embedding), dtype=dtype).astype(np.float64) * (scale or 1.0)
        out[key] = (tier, None if vec is None else np.array(vec.strip("[]").split(","), dtype=np.float64),
                    stored)
    return out


def test_pgvector_scores_what_the_exact_scorer_scores(
    store: PostgresStore, database: PgvectorBackend, clock: FakeClock
) -> None:
    items = Items(database)
    rng = np.random.default_rng(5)
    words = ["tea", "coffee", "bike", "cat", "dog", "rain", "sun", "book", "song", "code"]
    for i in range(200):
        items.put("acme", NS, f"k{i:03}", " ".join(rng.choice(words, size=4)),
                  metadata={"even": i % 2 == 0}, at=clock())
    items.put("acme", NS, "zero", "nothing", at=clock())
    Indexer(store, WithZero()).drain()
    clock.advance(10)
    store.tier_vectors(5.0, limit=80)  # both tiers, and hot rows pgvector scores
    tiers = {t.tier: t.vectors for t in store.vector_tiers()}
    assert tiers == {"cold": 80, "hot": 121}
    assert store.pgvector
    pgvector_sql = store._pgvector_sql
    for query in ("tea cat", "rain song code", "bike", "dog dog dog sun"):
        vec = EMB.embed([query])[0]
        for flt in (None, {"even": True}):
            found = store.search_memory("acme", "", vec, 201, flt, embedder=EMB.name)
            store._pgvector_sql = None  # the client's exact scorer, on the same rows
            try:
                exact = store.search_memory("acme", "", vec, 201, flt, embedder=EMB.name)
            finally:
                store._pgvector_sql = pgvector_sql
            assert len(found.hits) == (201 if flt is None else 100)
            assert [h.score for h in found.hits] == pytest.approx([h.score for h in exact.hits], abs=1e-5)
            assert [h.key for h in found.hits[:10]] == [h.key for h in exact.hits[:10]]
            assert {h.key for h in found.hits} == {h.key for h in exact.hits}
            zero = [h.score for h in found.hits if h.key == "zero"]
            assert zero == ([] if flt else [pytest.approx(0.0)])  # no direction: similarity 0, not NaN


def test_the_vec_column_follows_the_stored_vectors_through_the_tiers(
    store: PostgresStore, database: PgvectorBackend, clock: FakeClock
) -> None:
    items = Items(database)
    for i in range(5):
        items.put("acme", NS, f"k{i}", f"note {i} about tea", at=clock())
    Indexer(store, EMB).drain()
    column = vec_column(items)
    assert all(tier == "hot" and vec is not None for tier, vec, _ in column.values())
    for _, vec, stored in column.values():
        assert vec is not None
        np.testing.assert_allclose(vec, stored, rtol=1e-6)  # pgvector's copy is the stored vector
    items.put("acme", NS, "k0", "now about coffee", at=clock())  # version 2 replaces the copy too
    Indexer(store, EMB).drain()
    (_, vec0, stored0) = vec_column(items)["k0"]
    assert vec0 is not None
    np.testing.assert_allclose(vec0, np.asarray(EMB.embed(["now about coffee"])[0]), rtol=1e-6)
    np.testing.assert_allclose(vec0, stored0, rtol=1e-6)
    clock.advance(100)
    items.touch("acme", NS, "k1", clock())
    assert store.tier_vectors(50.0).cooled == 4
    column = vec_column(items)
    assert {k: (t, v is None) for k, (t, v, _) in column.items()} == {
        "k0": ("cold", True), "k1": ("hot", False), "k2": ("cold", True), "k3": ("cold", True),
        "k4": ("cold", True)}
    # a cold item is still found, by the client's scorer
    assert [h.key for h in store.search_memory("acme", "", EMB.embed(["note 3 about tea"])[0], 1,
                                               embedder=EMB.name).hits] == ["k3"]
    items.touch("acme", NS, "k3", clock() + 1)
    clock.advance(1)
    assert store.tier_vectors(50.0).rewarmed == 1
    Indexer(store, EMB).drain()
    (tier3, vec3, stored3) = vec_column(items)["k3"]
    assert tier3 == "hot"
    assert vec3 is not None
    np.testing.assert_allclose(vec3, stored3, rtol=1e-6)
    np.testing.assert_allclose(vec3, np.asarray(EMB.embed(["note 3 about tea"])[0]), rtol=1e-6)


@pytest.mark.parametrize("created_by", ["administrator", "first schema"])
def test_the_extension_is_found_where_it_was_created(database: PgvectorBackend, created_by: str) -> None:
    """pgvector created in ``public`` by an administrator before Cairn
    migrated (the usual setup), or by the migration of another schema of the
    same database (into that schema): each schema's store finds and uses it.
    Both failed to migrate once: the column's type was looked up on the
    store's search_path, which holds the store's schema only."""
    url = libpq_url(database.admin_url, database.name_in_server)
    if created_by == "administrator":
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION vector SCHEMA public")
    for schema in ("first", "second"):
        store = PostgresStore(url, schema=schema, clock=FakeClock())
        try:
            assert store.pgvector
            database.schema = schema
            items = Items(database)
            items.put("acme", NS, "tea", "green tea")
            items.put("acme", NS, "bike", "rides a bike")
            Indexer(store, EMB).drain()
            assert all(vec is not None for _, vec, _ in vec_column(items).values())
            hits = store.search_memory("acme", "", EMB.embed(["green tea"])[0], 1, embedder=EMB.name).hits
            assert [h.key for h in hits] == ["tea"]
            assert hits[0].score == pytest.approx(1.0)
        finally:
            store.close()
    with psycopg.connect(url, autocommit=True) as conn:
        homes = conn.execute("SELECT extnamespace::regnamespace::text FROM pg_extension "
                             "WHERE extname = 'vector'").fetchall()
    assert homes == [("public" if created_by == "administrator" else "first",)]


def test_a_vector_cooled_during_a_search_is_found_once(
    store: PostgresStore, database: PgvectorBackend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search is two statements here: pgvector scores the hot vectors, then
    the client scores the rest. The tiering (another worker) cooling a vector
    between the two must not make the search score it twice (hot by pgvector,
    then cold by the client) or never: both statements read one snapshot."""
    items = Items(database)
    for i in range(6):
        items.put("acme", NS, f"k{i}", f"note {i} about tea", at=clock())
    Indexer(store, EMB).drain()
    clock.advance(100)
    other = database.open_store(clock)  # another worker's store: its own connections
    assert isinstance(other, PostgresStore)
    stream = postgres_module._stream_scored
    cooled: list[int] = []

    def after_pgvector_scored(*args: object) -> object:
        if not cooled:  # between the statements, once: every vector goes cold (committed)
            cooled.append(other.tier_vectors(50.0).cooled)
        return stream(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(postgres_module, "_stream_scored", after_pgvector_scored)
    try:
        hits = store.search_memory("acme", "", EMB.embed(["note 3 about tea"])[0], 10, embedder=EMB.name).hits
    finally:
        other.close()
    assert cooled == [6]
    assert sorted(h.key for h in hits) == [f"k{i}" for i in range(6)]  # each once, none lost
    assert hits[0].key == "k3"
    monkeypatch.undo()
    again = store.search_memory("acme", "", EMB.embed(["note 3 about tea"])[0], 10, embedder=EMB.name).hits
    assert [h.key for h in again] == [h.key for h in hits]  # the cold tier's scorer ranks them alike
    assert [h.score for h in again] == pytest.approx([h.score for h in hits], abs=0.02)  # int8 vs float
