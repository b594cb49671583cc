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
    value        BYTEA,
    value_ref    TEXT,
    version      BIGINT NOT NULL,
    created_at   DOUBLE PRECISION NOT NULL,
    updated_at   DOUBLE PRECISION NOT NULL,
    position     BIGINT,
    operation_id TEXT,
    actor        TEXT,
    PRIMARY KEY (run_id, key)
);

-- Thread memory: one row per thread (its retention), and its messages in
-- order (idx 0, 1, 2, ...; a compaction replaces a prefix by one summary
-- message at the prefix's last idx, so the order stays the idx order).
CREATE TABLE memory_threads (
    tenant       TEXT NOT NULL,
    thread_id    TEXT NOT NULL,
    next_idx     BIGINT NOT NULL,
    created_at   DOUBLE PRECISION NOT NULL,
    updated_at   DOUBLE PRECISION NOT NULL,
    accessed_at  DOUBLE PRECISION NOT NULL,
    ttl          DOUBLE PRECISION,
    expires_at   DOUBLE PRECISION,
    PRIMARY KEY (tenant, thread_id)
);

CREATE INDEX memory_threads_expiry ON memory_threads (expires_at) WHERE expires_at IS NOT NULL;

CREATE TABLE memory_thread_messages (
    tenant       TEXT NOT NULL,
    thread_id    TEXT NOT NULL,
    idx          BIGINT NOT NULL,
    kind         TEXT NOT NULL,
    value        BYTEA,
    value_ref    TEXT,
    created_at   DOUBLE PRECISION NOT NULL,
    run_id       TEXT,
    position     BIGINT,
    operation_id TEXT,
    actor        TEXT,
    PRIMARY KEY (tenant, thread_id, idx)
);

CREATE INDEX memory_thread_messages_run ON memory_thread_messages (run_id) WHERE run_id IS NOT NULL;

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

-- Work for the embedding worker: one row per item version whose index text must be embedded.
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

-- A run's memory goes with the run, however it is deleted (prune_runs).
CREATE FUNCTION memory_drop_run_memory() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM memory_run WHERE run_id = OLD.run_id;
    RETURN NULL;
END
$$;
CREATE TRIGGER memory_run_of_deleted_run AFTER DELETE ON runs
    FOR EACH ROW EXECUTE FUNCTION memory_drop_run_memory();

-- An offloaded value whose row goes (deleted, or replaced by a put) is
-- queued for collection: pruning deletes the artifact once nothing
-- references it (select_gc_page counts memory rows as references). SECURITY
-- DEFINER: a tenant's role deletes its memory but may not touch artifact_gc;
-- the function only queues a ref, which collection checks again anyway.
CREATE FUNCTION memory_queue_artifact() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF OLD.value_ref IS NOT NULL AND (TG_OP = 'DELETE' OR OLD.value_ref IS DISTINCT FROM NEW.value_ref) THEN
        -- only a stored artifact: a role cannot fill the queue with made-up refs
        INSERT INTO artifact_gc (ref, queued_at)
        SELECT OLD.value_ref, extract(epoch FROM clock_timestamp())
        WHERE EXISTS (SELECT 1 FROM artifacts WHERE ref = OLD.value_ref)
        ON CONFLICT (ref) DO NOTHING;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER memory_run_gc AFTER DELETE OR UPDATE OF value_ref ON memory_run
    FOR EACH ROW EXECUTE FUNCTION memory_queue_artifact();
CREATE TRIGGER memory_thread_messages_gc AFTER DELETE OR UPDATE OF value_ref ON memory_thread_messages
    FOR EACH ROW EXECUTE FUNCTION memory_queue_artifact();
CREATE TRIGGER memory_items_gc AFTER DELETE OR UPDATE OF value_ref ON memory_items
    FOR EACH ROW EXECUTE FUNCTION memory_queue_artifact();

-- Row-level security: the grant rule of runs and history (migration 0006).
-- Run memory is per-run: its run must be of the row's tenant (as history's,
-- migration 0008). Items and thread messages name the run that wrote them:
-- such a provenance must be a run of the row's tenant too, so no role can
-- file a memory as written by another tenant's run. A tenant's role may
-- delete its own memory (forgetting is the tenant's right).
ALTER TABLE memory_run ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON memory_run
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))))
    WITH CHECK (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant)))
                AND EXISTS (SELECT 1 FROM runs AS r WHERE r.run_id = memory_run.run_id AND r.tenant = memory_run.tenant));
ALTER TABLE memory_threads ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON memory_threads
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))))
    WITH CHECK (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))));
ALTER TABLE memory_thread_messages ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON memory_thread_messages
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))))
    WITH CHECK (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant)))
                AND (memory_thread_messages.run_id IS NULL
                     OR EXISTS (SELECT 1 FROM runs AS r WHERE r.run_id = memory_thread_messages.run_id AND r.tenant = memory_thread_messages.tenant)));
ALTER TABLE memory_items ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON memory_items
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))))
    WITH CHECK (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant)))
                AND (memory_items.run_id IS NULL
                     OR EXISTS (SELECT 1 FROM runs AS r WHERE r.run_id = memory_items.run_id AND r.tenant = memory_items.tenant)));
ALTER TABLE memory_outbox ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON memory_outbox
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))))
    WITH CHECK (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))));

-- A memory's offloaded value is readable through its row, as a run's or an
-- entry's is through them.
DROP POLICY referenced ON artifacts;
CREATE POLICY referenced ON artifacts FOR SELECT
    USING (EXISTS (SELECT 1 FROM runs AS r WHERE r.input_ref = artifacts.ref)
           OR EXISTS (SELECT 1 FROM runs AS r WHERE r.result_ref = artifacts.ref)
           OR EXISTS (SELECT 1 FROM history AS h WHERE h.payload_ref = artifacts.ref)
           OR EXISTS (SELECT 1 FROM mailbox AS m WHERE m.payload_ref = artifacts.ref)
           OR EXISTS (SELECT 1 FROM memory_run AS m WHERE m.value_ref = artifacts.ref)
           OR EXISTS (SELECT 1 FROM memory_thread_messages AS m WHERE m.value_ref = artifacts.ref)
           OR EXISTS (SELECT 1 FROM memory_items AS m WHERE m.value_ref = artifacts.ref));

CREATE INDEX memory_run_ref ON memory_run (value_ref) WHERE value_ref IS NOT NULL;
CREATE INDEX memory_thread_messages_ref ON memory_thread_messages (value_ref) WHERE value_ref IS NOT NULL;
CREATE INDEX memory_items_ref ON memory_items (value_ref) WHERE value_ref IS NOT NULL;

-- A tenant's role may read and write its tenants' memory (and delete it: the
-- tiers' lifecycles are the application's to run), and take ids for outbox
-- rows: grant_tenant grants what tenant_privileges lists (0014), and the roles
-- granted before this migration get it here.
INSERT INTO tenant_privileges (object_name, object_kind, privileges) VALUES
    ('memory_run', 'TABLE', 'SELECT, INSERT, UPDATE, DELETE'),
    ('memory_threads', 'TABLE', 'SELECT, INSERT, UPDATE, DELETE'),
    ('memory_thread_messages', 'TABLE', 'SELECT, INSERT, UPDATE, DELETE'),
    ('memory_items', 'TABLE', 'SELECT, INSERT, UPDATE, DELETE'),
    ('memory_outbox', 'TABLE', 'SELECT, INSERT, UPDATE, DELETE'),
    ('memory_outbox_id_seq', 'SEQUENCE', 'USAGE');

SELECT grant_privileges(object_name) FROM tenant_privileges WHERE object_name LIKE 'memory\_%';

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION memory_queue_artifact() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION memory_drop_run_memory() SET search_path = %I, pg_temp', current_schema());
END
$$;
