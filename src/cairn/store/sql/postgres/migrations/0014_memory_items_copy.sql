-- A copy of memcore's memory_items and memory_outbox (issue 14's shared
-- design, fixed DDL) so that the vector index can be built and tested on its
-- own branch. The merger deletes this file: memcore's migration replaces it
-- (with the row-level security and grants that this copy leaves out).

-- Long-term memory: one row per (tenant, namespace, key); version counts puts (1, 2, ...).
CREATE TABLE memory_items (
    tenant       TEXT NOT NULL,
    namespace    TEXT NOT NULL,
    key          TEXT NOT NULL,
    value        BYTEA,
    value_ref    TEXT,
    metadata     JSONB,
    index_text   TEXT,
    version      BIGINT NOT NULL,
    created_at   DOUBLE PRECISION NOT NULL,
    updated_at   DOUBLE PRECISION NOT NULL,
    accessed_at  DOUBLE PRECISION NOT NULL,
    ttl          DOUBLE PRECISION,
    expires_at   DOUBLE PRECISION,
    run_id       TEXT,
    position     BIGINT,
    operation_id TEXT,
    actor        TEXT,
    tier         TEXT NOT NULL DEFAULT 'hot',
    PRIMARY KEY (tenant, namespace, key)
);
CREATE INDEX memory_items_expiry ON memory_items (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX memory_items_run ON memory_items (run_id) WHERE run_id IS NOT NULL;

CREATE TABLE memory_outbox (
    id            BIGSERIAL PRIMARY KEY,
    tenant        TEXT NOT NULL,
    namespace     TEXT NOT NULL,
    key           TEXT NOT NULL,
    version       BIGINT NOT NULL,
    created_at    DOUBLE PRECISION NOT NULL,
    attempts      BIGINT NOT NULL DEFAULT 0,
    claimed_by    TEXT,
    claimed_until DOUBLE PRECISION,
    last_error    TEXT,
    UNIQUE (tenant, namespace, key, version)
);
CREATE INDEX memory_outbox_ready ON memory_outbox (claimed_until, id);
