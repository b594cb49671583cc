-- LangGraph checkpoints (issue 24, cairn.langgraph.CairnSaver). A LangGraph
-- thread is not a Cairn run: its checkpoints are written by LangGraph's loop
-- in any process, so they have tables of their own, keyed by the saver's
-- tenant (another tenant's thread is simply absent). Values are content
-- addressed per thread (lg_values, digest = 64 bits of BLAKE2b of the
-- serializer's type and bytes): a channel's version (lg_blobs) and a pending
-- write (lg_writes) hold packed digests (refs, 8 bytes each), so a message
-- written by a node and then appended to the list channel is stored once,
-- and a list that grew stores only its new items (kind 'list' with a base
-- version; depth counts the bases below it). See docs/design.md
-- "LangGraph checkpointer".
CREATE TABLE lg_checkpoints (
    tenant          TEXT NOT NULL,
    thread_id       TEXT NOT NULL,
    ns              TEXT NOT NULL,
    checkpoint_id   TEXT NOT NULL,
    parent_id       TEXT,
    run_id          TEXT,
    checkpoint_kind TEXT NOT NULL,
    checkpoint      BYTEA NOT NULL,
    metadata_kind   TEXT NOT NULL,
    metadata        BYTEA NOT NULL,
    PRIMARY KEY (tenant, thread_id, ns, checkpoint_id)
);

CREATE TABLE lg_blobs (
    tenant    TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    ns        TEXT NOT NULL,
    channel   TEXT NOT NULL,
    version   TEXT NOT NULL,
    kind      TEXT NOT NULL CHECK (kind IN ('value', 'list', 'empty')),
    base      TEXT,
    depth     BIGINT NOT NULL,
    refs      BYTEA NOT NULL,
    PRIMARY KEY (tenant, thread_id, ns, channel, version)
);

CREATE TABLE lg_writes (
    tenant        TEXT NOT NULL,
    thread_id     TEXT NOT NULL,
    ns            TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    task_id       TEXT NOT NULL,
    idx           BIGINT NOT NULL,
    channel       TEXT NOT NULL,
    task_path     TEXT NOT NULL,
    kind          TEXT NOT NULL CHECK (kind IN ('value', 'list')),
    refs          BYTEA NOT NULL,
    PRIMARY KEY (tenant, thread_id, ns, checkpoint_id, task_id, idx)
);

CREATE TABLE lg_values (
    tenant    TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    digest    BIGINT NOT NULL,
    kind      TEXT NOT NULL,
    data      BYTEA NOT NULL,
    PRIMARY KEY (tenant, thread_id, digest)
);

-- Who writes a thread (fencing): the saver that took it (owner, a random id
-- per CairnSaver) and how many times it changed hands (epoch). A saver takes
-- a thread on its first write to it; a saver that held it and lost it to
-- another is refused every write after (cairn.errors.ThreadTaken), so two
-- processes driving one thread never fork its chain of checkpoints.
CREATE TABLE lg_threads (
    tenant    TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    owner     TEXT NOT NULL,
    epoch     BIGINT NOT NULL,
    PRIMARY KEY (tenant, thread_id)
);

-- Row-level security: the grant rule of the memory tables (0015).
ALTER TABLE lg_checkpoints ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON lg_checkpoints
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))))
    WITH CHECK (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))));
ALTER TABLE lg_blobs ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON lg_blobs
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))))
    WITH CHECK (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))));
ALTER TABLE lg_writes ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON lg_writes
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))))
    WITH CHECK (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))));
ALTER TABLE lg_values ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON lg_values
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))))
    WITH CHECK (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))));

ALTER TABLE lg_threads ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON lg_threads
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))))
    WITH CHECK (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))));

-- A tenant's role reads and writes its tenants' LangGraph threads (and deletes
-- them: delete_thread, prune): grant_tenant grants what tenant_privileges
-- lists (0014); the roles granted before get it here.
INSERT INTO tenant_privileges (object_name, object_kind, privileges) VALUES
    ('lg_checkpoints', 'TABLE', 'SELECT, INSERT, UPDATE, DELETE'),
    ('lg_blobs', 'TABLE', 'SELECT, INSERT, UPDATE, DELETE'),
    ('lg_writes', 'TABLE', 'SELECT, INSERT, UPDATE, DELETE'),
    ('lg_values', 'TABLE', 'SELECT, INSERT, UPDATE, DELETE'),
    ('lg_threads', 'TABLE', 'SELECT, INSERT, UPDATE, DELETE');

SELECT grant_privileges(object_name) FROM tenant_privileges WHERE object_name LIKE 'lg\_%';
