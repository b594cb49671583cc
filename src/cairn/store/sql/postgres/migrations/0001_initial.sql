-- Runs and their single ordered history, the PostgreSQL twin of the SQLite
-- schema (same columns, same meaning). Tables are created unqualified: the
-- migration runs with search_path set to the store's schema.
--
-- Types: times are Unix seconds as DOUBLE PRECISION (the injected clock's
-- floats, stored exactly); counters are BIGINT (SQLite integers are 64-bit);
-- JSON values (error, detail, budget) are TEXT written by msgspec, so they
-- read back byte-for-byte as written, exactly as on SQLite (JSONB would
-- reorder keys and refuse "\u0000").

CREATE TABLE runs (
    run_id           TEXT PRIMARY KEY,
    tenant           TEXT NOT NULL,
    workflow         TEXT NOT NULL,
    workflow_version TEXT NOT NULL,
    thread_id        TEXT,
    queue            TEXT NOT NULL DEFAULT 'default',
    priority         BIGINT NOT NULL DEFAULT 0,
    parent_run_id    TEXT,
    status           TEXT NOT NULL,
    input            BYTEA,
    input_ref        TEXT,
    result           BYTEA,
    result_ref       TEXT,
    error            TEXT,
    epoch            BIGINT NOT NULL DEFAULT 0,
    owner            TEXT,
    lease_expires_at DOUBLE PRECISION,
    wake_at          DOUBLE PRECISION,
    waiting_on       TEXT,
    -- When the run may next be claimed; NULL while it cannot be. One column
    -- for pending runs, due timers and expired leases keeps the claim query
    -- a single range scan over one small partial index.
    runnable_at      DOUBLE PRECISION,
    recoveries       BIGINT NOT NULL DEFAULT 0,
    created_at       DOUBLE PRECISION NOT NULL,
    updated_at       DOUBLE PRECISION NOT NULL
);

CREATE INDEX runs_runnable ON runs (runnable_at) WHERE runnable_at IS NOT NULL;
-- Deliberately few indexes: each one is written on every claim and finish.
CREATE INDEX runs_tenant_created ON runs (tenant, created_at);
CREATE INDEX runs_parent ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL;
CREATE INDEX runs_thread ON runs (thread_id) WHERE thread_id IS NOT NULL;

-- The journal and the event stream are one table: a step costs one row. The
-- primary key is also what makes a racing second writer of the same seq fail.
CREATE TABLE history (
    run_id      TEXT NOT NULL,
    seq         BIGINT NOT NULL,
    event       TEXT NOT NULL,
    at          DOUBLE PRECISION NOT NULL,
    epoch       BIGINT NOT NULL,
    worker      TEXT,
    position    BIGINT,
    step_kind   TEXT,
    name        TEXT,
    input_hash  TEXT,
    attempt     BIGINT,
    started_at  DOUBLE PRECISION,
    payload     BYTEA,
    payload_ref TEXT,
    detail      TEXT,
    PRIMARY KEY (run_id, seq)
);

-- Large payloads, content-addressed by SHA-256. They live in the database
-- (not on a filesystem as with SQLite) because workers may run on different
-- machines with nothing shared but this server.
CREATE TABLE artifacts (
    ref  TEXT PRIMARY KEY,
    data BYTEA NOT NULL
);
