-- The retention controller (issue 26 part 3, cairn.store.retention): the
-- policies per data class, the controller's lease, and the record of each
-- run deleted (its audit record once its history is gone).
--
-- A policy keeps one data class of one tenant's runs (or '*': every tenant
-- without its own) of one workflow (or '*') for `keep` seconds (NULL:
-- forever); the most specific policy that matches decides. `updated_by` is
-- the actor who set it.
CREATE TABLE retention_policies (
    tenant     TEXT NOT NULL CHECK (tenant <> ''),
    workflow   TEXT NOT NULL CHECK (workflow <> ''),
    data_class TEXT NOT NULL,
    keep       DOUBLE PRECISION CHECK (keep IS NULL OR keep >= 0),
    updated_at DOUBLE PRECISION NOT NULL,
    updated_by TEXT NOT NULL,
    PRIMARY KEY (tenant, workflow, data_class)
);

-- A tenant's role reads its own tenants' policies and the installation's
-- defaults ('*'), and writes only its own tenants' (the '*' rows are the owner's).
ALTER TABLE retention_policies ENABLE ROW LEVEL SECURITY;
CREATE POLICY read_own_policies ON retention_policies FOR SELECT
    USING (tenant = '*' OR tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))));
CREATE POLICY insert_own_policies ON retention_policies FOR INSERT
    WITH CHECK (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))));
CREATE POLICY update_own_policies ON retention_policies FOR UPDATE
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))))
    WITH CHECK (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))));
CREATE POLICY delete_own_policies ON retention_policies FOR DELETE
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))));

INSERT INTO tenant_privileges (object_name, privileges) VALUES
    ('retention_policies', 'SELECT, INSERT, UPDATE, DELETE');
SELECT grant_privileges('retention_policies');

-- Who enforces the policies now: one controller at a time. Every deletion
-- checks, in its own transaction, that its holder still holds the lease at
-- its epoch (a takeover bumps the epoch), so a stale controller deletes
-- nothing. The owner's alone (the controller deletes as the owner).
CREATE TABLE retention_lease (
    name       TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,
    epoch      BIGINT NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL
);

-- A run deleted (by retention or prune), written in the transaction that
-- deletes it: its tenant, workflow, when it finished, its last entry and that
-- entry's audit link (the head an anchor may have signed), when and by whom.
-- The owner's alone.
CREATE TABLE retention_deleted (
    run_id      TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    workflow    TEXT NOT NULL,
    finished_at DOUBLE PRECISION NOT NULL,
    last_seq    BIGINT NOT NULL,
    head        BYTEA,
    deleted_at  DOUBLE PRECISION NOT NULL,
    deleted_by  TEXT NOT NULL
);

CREATE INDEX retention_deleted_finished ON retention_deleted (finished_at);
