-- A copy of memcore's memory_items and memory_outbox (issue 14's shared
-- design, fixed DDL) so that the vector index can be built and tested on its
-- own branch. The merger deletes this file: memcore's migration replaces it.

-- Long-term memory: one row per (tenant, namespace, key); version counts puts (1, 2, ...).
CREATE TABLE memory_items (
    tenant       TEXT NOT NULL,
    namespace    TEXT NOT NULL,          -- encoded as above
    key          TEXT NOT NULL,
    value        BLOB,                   -- the value's codec payload bytes (NULL when offloaded)
    value_ref    TEXT,                   -- artifact ref when the value is offloaded (large, or cold)
    metadata     TEXT,                   -- JSON object for filters (NULL: none)
    index_text   TEXT,                   -- the text to embed; NULL: not searchable
    version      INTEGER NOT NULL,
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL,
    accessed_at  REAL NOT NULL,
    ttl          REAL,                   -- seconds; NULL: never expires
    expires_at   REAL,                   -- NULL: never; refreshed on read when the policy says so
    run_id       TEXT,                   -- provenance: the run, position and operation that wrote it
    position     INTEGER,
    operation_id TEXT,
    actor        TEXT,                   -- provenance when written outside a run (operator, API)
    tier         TEXT NOT NULL DEFAULT 'hot',   -- 'hot' | 'cold'
    PRIMARY KEY (tenant, namespace, key)
);
CREATE INDEX memory_items_expiry ON memory_items (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX memory_items_run ON memory_items (run_id) WHERE run_id IS NOT NULL;

-- Work for the embedding worker: one row per item version whose index text must be embedded.
-- Written in the same transaction as the item's put; deleted when the vector of that version (or
-- a newer one) is stored, or when the item is deleted.
CREATE TABLE memory_outbox (
    id            INTEGER PRIMARY KEY,
    tenant        TEXT NOT NULL,
    namespace     TEXT NOT NULL,
    key           TEXT NOT NULL,
    version       INTEGER NOT NULL,
    created_at    REAL NOT NULL,
    attempts      INTEGER NOT NULL DEFAULT 0,
    claimed_by    TEXT,
    claimed_until REAL,
    last_error    TEXT,
    UNIQUE (tenant, namespace, key, version)
);
CREATE INDEX memory_outbox_ready ON memory_outbox (claimed_until, id);
