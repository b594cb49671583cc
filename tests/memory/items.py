"""Rows of memory_items and memory_outbox written straight into the database.

memcore builds the real write path (an item's put and its outbox row in the
step's transaction) on its own branch; the vector index only reads those
tables, so its tests write the rows the way that path will: the item at its
new version and one outbox row for that version, in one transaction.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from typing import Any

from tests.backends import PostgresBackend, SqliteBackend, StoreBackend

_UPSERT = ("INSERT INTO memory_items (tenant, namespace, key, value, metadata, index_text, version, "
           "created_at, updated_at, accessed_at) VALUES ({p}, {p}, {p}, NULL, {p}, {p}, 1, {p}, {p}, {p}) "
           "ON CONFLICT (tenant, namespace, key) DO UPDATE SET metadata = excluded.metadata, "
           "index_text = excluded.index_text, version = memory_items.version + 1, "
           "updated_at = excluded.updated_at, accessed_at = excluded.accessed_at "
           "RETURNING version")
_OUTBOX = ("INSERT INTO memory_outbox (tenant, namespace, key, version, created_at) "
           "VALUES ({p}, {p}, {p}, {p}, {p})")


class Items:
    """Writes items and outbox rows on ``backend``'s database (as the owner)."""

    def __init__(self, backend: StoreBackend) -> None:
        self.backend = backend

    def execute(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        if isinstance(self.backend, SqliteBackend):
            conn = sqlite3.connect(self.backend.path, isolation_level=None, timeout=30)
            try:
                return conn.execute(query.replace("%s", "?"), params).fetchall()
            finally:
                conn.close()
        assert isinstance(self.backend, PostgresBackend)
        with self.backend.connect() as pg:
            cur = pg.execute(query, params)
            return cur.fetchall() if cur.description is not None else []

    def put(self, tenant: str, namespace: str, key: str, text: str | None, *,
            metadata: Mapping[str, Any] | None = None, at: float = 1_000_000.0) -> int:
        """Put an item (a new version) and, if it has text, its outbox row; its version."""
        meta = None if metadata is None else json.dumps(metadata)
        sqlite = isinstance(self.backend, SqliteBackend)
        p = "?" if sqlite else "%s"
        if sqlite:
            conn = sqlite3.connect(self.backend.path, isolation_level=None, timeout=30)
            try:
                conn.execute("BEGIN IMMEDIATE")
                ((version,),) = conn.execute(_UPSERT.format(p=p), (tenant, namespace, key, meta, text, at, at,
                                                                  at)).fetchall()
                if text is not None:
                    conn.execute(_OUTBOX.format(p=p), (tenant, namespace, key, version, at))
                conn.execute("COMMIT")
            finally:
                conn.close()
            return int(version)
        assert isinstance(self.backend, PostgresBackend)
        with self.backend.connect() as pg, pg.transaction():
            ((version,),) = pg.execute(_UPSERT.format(p=p), (tenant, namespace, key, meta, text, at, at,
                                                             at)).fetchall()
            if text is not None:
                pg.execute(_OUTBOX.format(p=p), (tenant, namespace, key, version, at))
        return int(version)

    def touch(self, tenant: str, namespace: str, key: str, at: float) -> None:
        self.execute("UPDATE memory_items SET accessed_at = %s "
                     "WHERE tenant = %s AND namespace = %s AND key = %s", (at, tenant, namespace, key))

    def outbox(self) -> list[tuple[Any, ...]]:
        return self.execute("SELECT tenant, namespace, key, version, attempts, last_error, claimed_until "
                            "FROM memory_outbox ORDER BY id")

    def vectors(self) -> list[tuple[Any, ...]]:
        return self.execute("SELECT tenant, namespace, key, version, tier, embedding FROM memory_vectors "
                            "ORDER BY tenant, namespace, key")
