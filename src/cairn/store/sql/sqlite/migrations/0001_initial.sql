-- Runs and their single ordered history. Every row carries the run's tenant
-- (through runs) and run id; every write by a lease holder is fenced on epoch.

CREATE TABLE runs (
    run_id           TEXT PRIMARY KEY,
    tenant           TEXT NOT NULL,
    workflow         TEXT NOT NULL,
    workflow_version TEXT NOT NULL,
    thread_id        TEXT,
    queue            TEXT NOT NULL DEFAULT 'default',
    priority         INTEGER NOT NULL DEFAULT 0,
    parent_run_id    TEXT,
    status           TEXT NOT NULL,
    input            BLOB,
    input_ref        TEXT,
    result           BLOB,
    result_ref       TEXT,
    error            TEXT,
    epoch            INTEGER NOT NULL DEFAULT 0,
    owner            TEXT,
    lease_expires_at REAL,
    wake_at          REAL,
    waiting_on       TEXT,
    -- When the run may next be claimed; NULL while it cannot be. One column
    -- for pending, due timers and expired leases keeps the claim query a
    -- single range scan over one small partial index.
    runnable_at      REAL,
    recoveries       INTEGER NOT NULL DEFAULT 0,
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL
) WITHOUT ROWID;  -- the run id B-tree is the table: one tree less to write per commit

CREATE INDEX runs_runnable ON runs (runnable_at) WHERE runnable_at IS NOT NULL;
-- Deliberately few indexes: each one is written on every claim and finish.
-- Listing by status scans within a tenant; reclaiming a worker's runs uses
-- runs_runnable (a running run is always runnable at its lease expiry).
CREATE INDEX runs_tenant_created ON runs (tenant, created_at);
CREATE INDEX runs_parent ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL;
CREATE INDEX runs_thread ON runs (thread_id) WHERE thread_id IS NOT NULL;

-- The journal and the event stream are one table: a step costs one row.
CREATE TABLE history (
    run_id      TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    event       TEXT NOT NULL,
    at          REAL NOT NULL,
    epoch       INTEGER NOT NULL,
    worker      TEXT,
    position    INTEGER,
    step_kind   TEXT,
    name        TEXT,
    input_hash  TEXT,
    attempt     INTEGER,
    started_at  REAL,
    payload     BLOB,
    payload_ref TEXT,
    detail      TEXT,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
