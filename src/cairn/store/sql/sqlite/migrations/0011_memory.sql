-- Memory tiers (issue 14). Three tiers with their own tables and lifecycles:
-- run memory (scratch of one run, deleted with it), thread memory (ordered
-- messages shared by the runs of a thread) and long-term memory (namespaced
-- key-value items; memory_outbox holds the items whose index text the
-- embedding worker must embed). Every row carries its tenant and the
-- provenance of its last write: the run, position and operation id of the
-- step that wrote it, or the actor (an operator) who wrote it outside a run.
-- Values are codec payloads: inline bytes, or an artifact ref when large.

-- Run memory: deleted with its run (the trigger below, whatever deletes it).
CREATE TABLE memory_run (
    run_id       TEXT NOT NULL,
    key          TEXT NOT NULL,
    tenant       TEXT NOT NULL,
    value        BLOB,
    value_ref    TEXT,
    version      INTEGER NOT NULL,
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL,
    position     INTEGER,
    operation_id TEXT,
    actor        TEXT,
    PRIMARY KEY (run_id, key)
) WITHOUT ROWID;

-- Thread memory: one row per thread (its retention), and its messages in
-- order (idx 0, 1, 2, ...; a compaction replaces a prefix by one summary
-- message at the prefix's last idx, so the order stays the idx order).
CREATE TABLE memory_threads (
    tenant       TEXT NOT NULL,
    thread_id    TEXT NOT NULL,
    next_idx     INTEGER NOT NULL,
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL,
    accessed_at  REAL NOT NULL,
    ttl          REAL,
    expires_at   REAL,
    PRIMARY KEY (tenant, thread_id)
) WITHOUT ROWID;

CREATE INDEX memory_threads_expiry ON memory_threads (expires_at) WHERE expires_at IS NOT NULL;

CREATE TABLE memory_thread_messages (
    tenant       TEXT NOT NULL,
    thread_id    TEXT NOT NULL,
    idx          INTEGER NOT NULL,
    kind         TEXT NOT NULL,
    value        BLOB,
    value_ref    TEXT,
    created_at   REAL NOT NULL,
    run_id       TEXT,
    position     INTEGER,
    operation_id TEXT,
    actor        TEXT,
    PRIMARY KEY (tenant, thread_id, idx)
) WITHOUT ROWID;

CREATE INDEX memory_thread_messages_run ON memory_thread_messages (run_id) WHERE run_id IS NOT NULL;

-- Long-term memory: one row per (tenant, namespace, key); version counts puts (1, 2, ...).
CREATE TABLE memory_items (
    tenant       TEXT NOT NULL,
    namespace    TEXT NOT NULL,
    key          TEXT NOT NULL,
    value        BLOB,
    value_ref    TEXT,
    metadata     TEXT,
    index_text   TEXT,
    version      INTEGER NOT NULL,
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL,
    accessed_at  REAL NOT NULL,
    ttl          REAL,
    expires_at   REAL,
    run_id       TEXT,
    position     INTEGER,
    operation_id TEXT,
    actor        TEXT,
    tier         TEXT NOT NULL DEFAULT 'hot',
    PRIMARY KEY (tenant, namespace, key)
);

CREATE INDEX memory_items_expiry ON memory_items (expires_at) WHERE expires_at IS NOT NULL;

CREATE INDEX memory_items_run ON memory_items (run_id) WHERE run_id IS NOT NULL;

-- Work for the embedding worker: one row per item version whose index text must be embedded.
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

-- A run's memory goes with the run, however it is deleted (prune_runs).
CREATE TRIGGER memory_run_of_deleted_run AFTER DELETE ON runs
BEGIN
    DELETE FROM memory_run WHERE run_id = OLD.run_id;
END;

-- An offloaded value whose row goes (deleted, or replaced by a put) is
-- queued for collection: pruning deletes the artifact once nothing
-- references it (select_gc_page counts memory rows as references).
CREATE TRIGGER memory_run_gc AFTER DELETE ON memory_run WHEN OLD.value_ref IS NOT NULL
BEGIN
    INSERT INTO artifact_gc (ref, queued_at) VALUES (OLD.value_ref, OLD.updated_at) ON CONFLICT (ref) DO NOTHING;
END;

CREATE TRIGGER memory_run_gc_update AFTER UPDATE OF value_ref ON memory_run
WHEN OLD.value_ref IS NOT NULL AND OLD.value_ref IS NOT NEW.value_ref
BEGIN
    INSERT INTO artifact_gc (ref, queued_at) VALUES (OLD.value_ref, OLD.updated_at) ON CONFLICT (ref) DO NOTHING;
END;

CREATE TRIGGER memory_thread_messages_gc AFTER DELETE ON memory_thread_messages WHEN OLD.value_ref IS NOT NULL
BEGIN
    INSERT INTO artifact_gc (ref, queued_at) VALUES (OLD.value_ref, OLD.created_at) ON CONFLICT (ref) DO NOTHING;
END;

CREATE TRIGGER memory_thread_messages_gc_update AFTER UPDATE OF value_ref ON memory_thread_messages
WHEN OLD.value_ref IS NOT NULL AND OLD.value_ref IS NOT NEW.value_ref
BEGIN
    INSERT INTO artifact_gc (ref, queued_at) VALUES (OLD.value_ref, OLD.created_at) ON CONFLICT (ref) DO NOTHING;
END;

CREATE TRIGGER memory_items_gc AFTER DELETE ON memory_items WHEN OLD.value_ref IS NOT NULL
BEGIN
    INSERT INTO artifact_gc (ref, queued_at) VALUES (OLD.value_ref, OLD.updated_at) ON CONFLICT (ref) DO NOTHING;
END;

CREATE TRIGGER memory_items_gc_update AFTER UPDATE OF value_ref ON memory_items
WHEN OLD.value_ref IS NOT NULL AND OLD.value_ref IS NOT NEW.value_ref
BEGIN
    INSERT INTO artifact_gc (ref, queued_at) VALUES (OLD.value_ref, OLD.updated_at) ON CONFLICT (ref) DO NOTHING;
END;

-- The collection queue's reference checks (select_gc_page): one index probe each.
CREATE INDEX memory_run_ref ON memory_run (value_ref) WHERE value_ref IS NOT NULL;

CREATE INDEX memory_thread_messages_ref ON memory_thread_messages (value_ref) WHERE value_ref IS NOT NULL;

CREATE INDEX memory_items_ref ON memory_items (value_ref) WHERE value_ref IS NOT NULL;
