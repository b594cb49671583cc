-- Vectors of long-term memory items (issue 14): derived data, computed by
-- the embedding worker from memory_items.index_text after the item's put
-- committed (memory_outbox says what is due). One row per item: the vector
-- of `version`, made by `embedder` (vectors of different embedders are never
-- compared). `tier`: 'hot' holds `dims` float32 (little-endian, what
-- sqlite-vec's distance functions read); 'cold' holds `dims` int8, each
-- component `scale` times its int8 (a quarter of the bytes; see
-- cairn.store.vectorindex). Search scores both in the same statement.
CREATE TABLE memory_vectors (
    tenant      TEXT NOT NULL,
    namespace   TEXT NOT NULL,
    key         TEXT NOT NULL,
    version     INTEGER NOT NULL,
    embedder    TEXT NOT NULL,
    dims        INTEGER NOT NULL,
    tier        TEXT NOT NULL DEFAULT 'hot',
    embedding   BLOB NOT NULL,
    scale       REAL,
    embedded_at REAL NOT NULL,
    PRIMARY KEY (tenant, namespace, key)
);  -- a rowid table: rows of 1.5 kB overflow a WITHOUT ROWID b-tree's pages (a scan was 3x slower)
