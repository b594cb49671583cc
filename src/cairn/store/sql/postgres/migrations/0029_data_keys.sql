-- Encryption at rest (issue 25, cairn.store.sealed): each tenant's data keys,
-- one per key version, wrapped by a key-encryption key (KEK) that is never
-- stored here (cairn.security.keyring). The newest version seals new writes;
-- older ones stay to open what they sealed until a re-encryption moves it.
-- Deleting a tenant's rows here makes its sealed data unreadable
-- (crypto-shredding, issue 26).
CREATE TABLE data_keys (
    tenant     TEXT NOT NULL,
    version    BIGINT NOT NULL,
    kek_id     TEXT NOT NULL,
    wrapped    BYTEA NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (tenant, version)
);

-- Row-level security: the grant rule of the memory tables (0015).
ALTER TABLE data_keys ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON data_keys
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))))
    WITH CHECK (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))));

-- A tenant's role reads its data keys (to open its values) and adds the first
-- one (its first sealed write); rotation (UPDATE) is the owner's.
INSERT INTO tenant_privileges (object_name, object_kind, privileges) VALUES
    ('data_keys', 'TABLE', 'SELECT, INSERT');

SELECT grant_privileges(object_name) FROM tenant_privileges WHERE object_name = 'data_keys';
