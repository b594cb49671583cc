"""Semantic search over long-term memory: latency and recall, side by side.

    python -m bench.memory_search            # 10,000 items x 384 dims, in about a minute
    python -m bench.memory_search --full     # 100,000 items (the issue's size)

Every system searches the same synthetic corpus (unit vectors drawn around
``items / 50`` random centres, so neighbourhoods are meaningful) with the
same queries, and recall@10 is measured against exact search (numpy, float64)
of the same run:

* Cairn on SQLite: sqlite-vec's ``vec_distance_cosine`` in SQL, hot (float32)
  and cold (every vector quantized to int8 by ``tier_vectors``), and with a
  metadata filter (equality on one key, applied before the top-k cut).
* Cairn on PostgreSQL without pgvector (the machine's server, a private
  throwaway cluster, ``tests/pgcluster.py``, or ``$CAIRN_TEST_POSTGRES_URL``):
  the exact fallback, scored in the client over a binary stream of the rows
  in scope; hot and cold; and, as the baseline of the same run, the previous
  fallback (every row fetched at once in the text format, then scored).
* Cairn on PostgreSQL 16 with pgvector (the ``pgserver`` wheel's build, a
  second throwaway cluster, ``tests/pgvector_cluster.py``): hot vectors by
  pgvector's exact ``<=>`` in SQL, cold ones by the client.
* LangGraph's ``PostgresStore`` (``langgraph-checkpoint-postgres``) with its
  pgvector index (HNSW, cosine, its defaults) on the same pgvector cluster,
  loaded through its own ``batch`` of puts.
* LangGraph's ``InMemoryStore`` with an index (``langgraph`` is in the
  ``bench`` extra), whose embed function returns the precomputed vectors.

Items are written straight into the tables (the embedding worker is not what
is measured). Bytes per item are measured on disk, as the growth of the
store over the same store empty, divided by the items: SQLite, the database
file after ``PRAGMA wal_checkpoint(TRUNCATE)`` and ``VACUUM`` (plus its
artifact directory); PostgreSQL, the sum of ``pg_total_relation_size``
(heap, TOAST and indexes) of every table of Cairn's schema, after ``VACUUM
FULL`` (the cooling rewrites rows; SQLite's figure is after ``VACUUM`` too),
and for LangGraph's ``PostgresStore`` of every table of its schema after its
load (inserts only, nothing to vacuum; its HNSW index included).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cairn.store.contract import Store
from cairn.store.namespaces import encode_namespace
from cairn.store.sqlite import SQLiteStore

EMBEDDER = "bench-384"
NS_LABELS = ("bench", "docs")
NS = encode_namespace(NS_LABELS)
BUCKETS = 10


def corpus(n: int, dims: int, queries: int, seed: int = 14) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((max(n // 50, 1), dims)).astype(np.float32)
    noise = rng.standard_normal((n, dims)).astype(np.float32)
    items = centres[rng.integers(0, len(centres), n)] + 0.6 * noise
    items /= np.linalg.norm(items, axis=1, keepdims=True)
    probes = centres[rng.integers(0, len(centres), queries)]
    probes = probes + 0.6 * rng.standard_normal(probes.shape).astype(np.float32)
    probes /= np.linalg.norm(probes, axis=1, keepdims=True)
    return items, probes


def exact(items: np.ndarray, probes: np.ndarray, k: int, mask: np.ndarray | None = None) -> list[set[int]]:
    scores = probes.astype(np.float64) @ items.astype(np.float64).T
    if mask is not None:
        scores[:, ~mask] = -np.inf
    return [set(np.argsort(-row, kind="stable")[:k].tolist()) for row in scores]


def rows(items: np.ndarray) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    item_rows = [("acme", NS, f"k{i}", json.dumps({"bucket": i % BUCKETS}), f"text {i}", 1, 0.0, 0.0, 0.0)
                 for i in range(len(items))]
    vector_rows = [("acme", NS, f"k{i}", 1, EMBEDDER, items.shape[1], "hot", items[i].astype("<f4").tobytes(),
                    None, 0.0) for i in range(len(items))]
    return item_rows, vector_rows


_ITEMS = ("INSERT INTO memory_items (tenant, namespace, key, metadata, index_text, version, created_at, "
          "updated_at, accessed_at) VALUES ({})")
_VECTORS = ("INSERT INTO memory_vectors (tenant, namespace, key, version, embedder, dims, tier, embedding, "
            "scale, embedded_at) VALUES ({})")


def load_sqlite(path: Path, items: np.ndarray) -> tuple[SQLiteStore, int]:
    """The store with the items written in, and its on-disk bytes empty."""
    store = SQLiteStore(path, clock=lambda: 100.0)
    empty = disk_bytes(store)
    item_rows, vector_rows = rows(items)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    conn.executemany(_ITEMS.format(", ".join("?" * 9)), item_rows)
    conn.executemany(_VECTORS.format(", ".join("?" * 10)), vector_rows)
    conn.execute("COMMIT")
    conn.close()
    return store, empty


def vec_text(vector: np.ndarray) -> str:
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


def load_postgres(admin_url: str, items: np.ndarray) -> tuple[Any, int, Callable[[], None]]:
    """Cairn's store on a new database of ``admin_url``'s server, the items
    copied in (with pgvector's copy of each vector where the store has the
    column, as the embedding worker would write it); its on-disk bytes
    empty; and what drops the database."""
    import psycopg
    from psycopg import sql

    from cairn.store.postgres import PostgresStore

    name = f"cairn_bench_memory_{int(time.time())}_{len(items)}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = psycopg.conninfo.make_conninfo(admin_url, dbname=name)
    store = PostgresStore(url, clock=lambda: 100.0)
    empty = disk_bytes(store)
    item_rows, vector_rows = rows(items)
    with psycopg.connect(url) as conn:
        conn.execute("SET search_path TO cairn")
        with conn.cursor() as cur:
            with cur.copy("COPY memory_items (tenant, namespace, key, metadata, index_text, version, "
                          "created_at, updated_at, accessed_at) FROM STDIN") as copy:
                for row in item_rows:
                    copy.write_row(row)
            columns = "tenant, namespace, key, version, embedder, dims, tier, embedding, scale, embedded_at"
            with cur.copy(f"COPY memory_vectors ({columns}{', vec' if store.pgvector else ''}) "
                          "FROM STDIN") as copy:
                for i, row in enumerate(vector_rows):
                    copy.write_row((*row, vec_text(items[i])) if store.pgvector else row)
        conn.execute("ANALYZE")

    def drop() -> None:
        store.close()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    return store, empty, drop


def tree_bytes(root: Path) -> int:
    """Bytes of the files under ``root`` (0 if it does not exist)."""
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) if root.exists() else 0


def disk_bytes(store: Any) -> int:
    """What ``store`` takes on disk (the project's rule for storage figures):
    SQLite, the file after ``VACUUM`` and a truncating WAL checkpoint, plus
    the artifact directory; PostgreSQL, ``pg_total_relation_size`` (heap,
    TOAST, indexes) of every table of the store's schema, after ``VACUUM
    FULL`` so that rows the cooling rewrote count once, as SQLite's do."""
    if isinstance(store, SQLiteStore):
        lite = sqlite3.connect(store.path, isolation_level=None)
        try:
            lite.execute("VACUUM")
            lite.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        finally:
            lite.close()
        return store.path.stat().st_size + tree_bytes(store.artifact_dir)
    import psycopg

    with psycopg.connect(store._url, autocommit=True) as conn:
        conn.execute(f'VACUUM FULL {", ".join(_tables(conn, store.schema))}')
        return _relation_bytes(conn, store.schema)


def _tables(conn: Any, schema: str) -> list[str]:
    rows = conn.execute("SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname) FROM pg_class AS c "
                        "JOIN pg_namespace AS n ON n.oid = c.relnamespace "
                        "WHERE n.nspname = %s AND c.relkind = 'r'",
                        (schema,)).fetchall()
    return [str(name) for (name,) in rows]


def _relation_bytes(conn: Any, schema: str) -> int:
    """``pg_total_relation_size`` of every table of ``schema`` (TOAST and indexes included)."""
    row = conn.execute("SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class AS c "
                       "JOIN pg_namespace AS n ON n.oid = c.relnamespace "
                       "WHERE n.nspname = %s AND c.relkind = 'r'", (schema,)).fetchone()
    return int(row[0]) if row else 0


def measure(search: Callable[[np.ndarray], list[int]], probes: np.ndarray, truth: Sequence[set[int]],
            k: int) -> dict[str, float]:
    """p50/p99 latency and recall@10 (printed as soon as measured, should a long run break later)."""
    figures = _measure(search, probes, truth, k)
    print(f"  p50 {figures['p50_ms']:.1f} ms, p99 {figures['p99_ms']:.1f} ms, "
          f"recall@10 {figures['recall@10']:.3f}", flush=True)
    return figures


def _measure(search: Callable[[np.ndarray], list[int]], probes: np.ndarray, truth: Sequence[set[int]],
             k: int) -> dict[str, float]:
    search(probes[0])  # warm-up (caches, prepared statements)
    latencies, recalls = [], []
    for probe, expected in zip(probes, truth, strict=True):
        start = time.perf_counter()
        found = search(probe)
        latencies.append(time.perf_counter() - start)
        recalls.append(len(set(found[:k]) & expected) / k)
    return {"p50_ms": 1000 * float(np.percentile(latencies, 50)),
            "p99_ms": 1000 * float(np.percentile(latencies, 99)), "recall@10": float(np.mean(recalls))}


def cairn_search(
    store: Store, k: int, filter: dict[str, Any] | None = None
) -> Callable[[np.ndarray], list[int]]:
    def search(probe: np.ndarray) -> list[int]:
        found = store.search_memory("acme", "", probe.tolist(), k, filter, embedder=EMBEDDER)
        return [int(hit.key[1:]) for hit in found.hits]

    return search


def previous_fallback(store: Any, k: int) -> Callable[[np.ndarray], list[int]]:
    """The PostgreSQL fallback as it was: every row in scope fetched at once
    in the text format, then scored (the baseline of the streamed one)."""
    from cairn.store.vectorindex import encode_vector, score_candidates

    def search(probe: np.ndarray) -> list[int]:
        params = {"tenant": "acme", "prefix": "", "embedder": EMBEDDER, "dims": len(probe), "now": 100.0,
                  "filter": None, "k": k, "tier": None}
        scored = score_candidates(store._select("search_candidates", params), encode_vector(probe.tolist(),
                                  len(probe)), k)
        return [int(key[1:]) for _, key, _, _ in scored]

    return search


def run_langgraph_postgres(
    admin_url: str, items: np.ndarray, probes: np.ndarray, truth: list[set[int]], k: int, kind: str,
    load_limit: float,
) -> list[dict[str, Any]]:
    """LangGraph's PostgresStore with its pgvector index of ``kind``: ``hnsw``
    (its default) or ``flat`` (no index: pgvector's exact scan, as Cairn's).
    Loading stops after ``load_limit`` seconds; the row then says how far it
    got and has no latency figures (an index still building is not measured)."""
    import psycopg
    from langgraph.store.base import PutOp
    from langgraph.store.postgres import PostgresStore as LangGraphPostgresStore
    from psycopg import sql

    name = f"langgraph_bench_memory_{int(time.time())}_{len(items)}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = psycopg.conninfo.make_conninfo(admin_url, dbname=name)
    lookup: dict[str, list[float]] = {}

    def embed(texts: Sequence[str]) -> list[list[float]]:
        return [lookup[text] for text in texts]

    results: list[dict[str, Any]] = []
    try:
        index = {"dims": items.shape[1], "embed": embed, "fields": ["text"],
                 "ann_index_config": {"kind": kind}}
        with LangGraphPostgresStore.from_conn_string(url, index=index) as store:  # type: ignore[arg-type]
            store.setup()
            with psycopg.connect(url) as conn:
                empty = _relation_bytes(conn, "public")
            started = time.perf_counter()
            loaded = 0
            for start in range(0, len(items), 1000):
                if time.perf_counter() - started > load_limit:
                    results.append({"system": f"langgraph PostgresStore (pgvector {kind}): loaded {loaded:,} "
                                    f"of {len(items):,} in {load_limit:.0f} s, not measured",
                                    "p50_ms": None, "p99_ms": None, "recall@10": None,
                                    "bytes/item": None})
                    return results
                ops = []
                for i in range(start, min(start + 1000, len(items))):
                    lookup[f"text {i}"] = items[i].tolist()
                    ops.append(PutOp(NS_LABELS, f"k{i}", {"text": f"text {i}", "bucket": i % BUCKETS}))
                store.batch(ops)
                loaded += len(ops)
            load = time.perf_counter() - started
            queries = iter(range(len(probes) + 1))

            def search(probe: np.ndarray) -> list[int]:
                j = next(queries)
                lookup[f"query {j}"] = probe.tolist()
                return [int(hit.key[1:]) for hit in store.search(NS_LABELS, query=f"query {j}", limit=k)]

            figures = measure(search, probes, truth, k)
            with psycopg.connect(url) as conn:  # its tables (store, store_vectors, migrations) and indexes
                size = _relation_bytes(conn, "public") - empty
            results.append({"system": f"langgraph PostgresStore (pgvector {kind}; load {load:.0f} s)",
                            **figures, "bytes/item": size / len(items)})
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    return results


def run_cairn(
    label: str, store: Store, empty: int, probes: np.ndarray, truth: list[set[int]],
    truth_filtered: list[set[int]], n: int, k: int,
) -> list[dict[str, Any]]:
    """The store's rows: hot (with the previous fallback as baseline on
    PostgreSQL without pgvector), hot with a filter, cold. Bytes are
    measured on disk after each state's searches (``disk_bytes`` vacuums,
    which must not change what the searches find on disk), over ``empty``."""
    results = []
    if label.startswith("postgres (exact"):
        results.append({"system": f"cairn {label} hot, previous fallback (baseline)",
                        **measure(previous_fallback(store, k), probes, truth, k)})
    results.append({"system": f"cairn {label} hot", **measure(cairn_search(store, k), probes, truth, k)})
    results.append({"system": f"cairn {label} hot, filter bucket=3",
                    **measure(cairn_search(store, k, {"bucket": 3}), probes, truth_filtered, k)})
    hot_bytes = (disk_bytes(store) - empty) / n
    print(f"  on disk, hot: {hot_bytes:,.0f} bytes/item", flush=True)
    for row in results:
        row["bytes/item"] = hot_bytes
    # every item is idle at clock 100; small batches: each is one transaction,
    # which a loaded machine would otherwise hold past the idle-in-transaction timeout
    while store.tier_vectors(1.0, limit=2_000).cooled:
        pass
    cold = measure(cairn_search(store, k), probes, truth, k)
    cold_bytes = (disk_bytes(store) - empty) / n
    print(f"  on disk, cold: {cold_bytes:,.0f} bytes/item", flush=True)
    results.append({"system": f"cairn {label} cold (int8)", **cold, "bytes/item": cold_bytes})
    return results


def run_langgraph(items: np.ndarray, probes: np.ndarray, truth: list[set[int]], k: int) -> dict[str, Any]:
    from langgraph.store.memory import InMemoryStore

    lookup: dict[str, list[float]] = {}

    def embed(texts: Sequence[str]) -> list[list[float]]:
        return [lookup[text] for text in texts]

    store = InMemoryStore(index={"dims": items.shape[1], "embed": embed, "fields": ["text"]})
    for i, vector in enumerate(items):
        lookup[f"text {i}"] = vector.tolist()
    for i in range(len(items)):
        store.put(NS_LABELS, f"k{i}", {"text": f"text {i}", "bucket": i % BUCKETS})
    queries = iter(range(len(probes) + 1))

    def search(probe: np.ndarray) -> list[int]:
        j = next(queries)
        lookup[f"query {j}"] = probe.tolist()
        return [int(hit.key[1:]) for hit in store.search(NS_LABELS, query=f"query {j}", limit=k)]

    return {"system": "langgraph InMemoryStore (index)", **measure(search, probes, truth, k),
            "bytes/item": None}  # in process memory, not comparable


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--full", action="store_true", help="100,000 items (the issue's size)")
    parser.add_argument("--dims", type=int, default=384)
    parser.add_argument("--queries", type=int, default=30)
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--no-pgvector", action="store_true", help="leave out PostgreSQL with pgvector "
                        "(Cairn's and LangGraph's PostgresStore)")
    parser.add_argument("--no-langgraph", action="store_true")
    parser.add_argument("--no-sqlite", action="store_true")
    parser.add_argument("--langgraph-pg-index", default="flat,hnsw", metavar="KINDS",
                        help="pgvector index kinds of LangGraph's PostgresStore, comma-separated "
                        "(flat: none, an exact scan; hnsw: its default). Default: flat,hnsw")
    parser.add_argument("--load-limit", type=float, default=900.0, metavar="SECONDS",
                        help="how long LangGraph's PostgresStore may take to load (default 900)")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args(argv)
    n, k = (100_000 if args.full else args.items), 10
    items, probes = corpus(n, args.dims, args.queries)
    truth = exact(items, probes, k)
    truth_filtered = exact(items, probes, k, np.arange(n) % BUCKETS == 3)
    results: list[dict[str, Any]] = []
    kinds = [kind.strip() for kind in args.langgraph_pg_index.split(",") if kind.strip()]
    if unknown := sorted(set(kinds) - {"flat", "hnsw"}):
        parser.error(f"--langgraph-pg-index: unknown kind(s) {', '.join(unknown)} (flat, hnsw)")
    if not args.no_sqlite:
        with tempfile.TemporaryDirectory() as tmp:
            store, empty = load_sqlite(Path(tmp) / "bench.db", items)
            assert store.sqlite_vec, "sqlite-vec did not load: this would measure the client scorer"
            results += run_cairn("sqlite (sqlite-vec)", store, empty, probes, truth, truth_filtered, n, k)
            store.close()
    if not args.no_postgres:
        from tests import pgcluster

        pg, empty, drop = load_postgres(pgcluster.admin_url(), items)
        try:
            assert not pg.pgvector, "this server has pgvector: the fallback would not be measured"
            results += run_cairn("postgres (exact fallback)", pg, empty, probes, truth, truth_filtered, n, k)
        finally:
            drop()
            pgcluster.shutdown()
    if not args.no_pgvector:
        from tests import pgvector_cluster

        try:
            pg, empty, drop = load_postgres(pgvector_cluster.admin_url(), items)
            try:
                assert pg.pgvector, "pgvector is missing: this would measure the client scorer"
                results += run_cairn("postgres+pgvector", pg, empty, probes, truth, truth_filtered, n, k)
            finally:
                drop()
            if not args.no_langgraph:
                for kind in kinds:
                    results += run_langgraph_postgres(pgvector_cluster.admin_url(), items, probes, truth, k,
                                                      kind, args.load_limit)
        finally:
            pgvector_cluster.shutdown()
    if not args.no_langgraph:
        results.append(run_langgraph(items, probes, truth, k))
    print(f"\n{n:,} items x {args.dims} dims, {args.queries} queries, k={k}\n")
    print(f"{'system':52} {'p50 ms':>9} {'p99 ms':>9} {'recall@10':>10} {'bytes/item':>11}")
    def cell(value: float | None, spec: str, width: int) -> str:
        return f"{'-' if value is None else format(value, spec):>{width}}"

    for r in results:
        print(f"{r['system']:52} {cell(r['p50_ms'], '.1f', 9)} {cell(r['p99_ms'], '.1f', 9)} "
              f"{cell(r['recall@10'], '.3f', 10)} {cell(r['bytes/item'], '.0f', 11)}")
    if args.json:
        args.json.write_text(json.dumps({"items": n, "dims": args.dims, "results": results}, indent=2))


if __name__ == "__main__":
    main()
