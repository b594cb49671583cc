-- Bearer tokens of the HTTP API (cairn serve): each bound to one tenant and
-- one role. Only the SHA-256 of the secret is stored; a token is looked up by
-- its public id and its digest compared in constant time. revoked_at set:
-- refused from then on (kept, so `cairn tokens list` can show who had what).
CREATE TABLE api_tokens (
    token_id    TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    role        TEXT NOT NULL,
    name        TEXT NOT NULL,
    digest      TEXT NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL,
    created_by  TEXT,
    revoked_at  DOUBLE PRECISION
);

CREATE INDEX api_tokens_tenant ON api_tokens (tenant, created_at);

-- A tenant's run changes in the order they happened: the cursor of the
-- tenant-wide event stream and of the dashboard's live runs list.
CREATE INDEX runs_tenant_updated ON runs (tenant, updated_at, run_id COLLATE "C");

-- The tenant boundary of 0006, for tokens: a tenant's role reads, mints and
-- revokes the tokens of its granted tenants only (the server that checks
-- tokens of every tenant connects as the owner).
ALTER TABLE api_tokens ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON api_tokens
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))))
    WITH CHECK (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))));

CREATE OR REPLACE FUNCTION grant_tenant(grantee NAME, tenant_name TEXT) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_grants (role, tenant) VALUES (grantee, tenant_name) ON CONFLICT DO NOTHING;
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', current_schema(), grantee);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE ON runs TO %I', grantee);
    EXECUTE format('GRANT SELECT, INSERT ON history TO %I', grantee);
    EXECUTE format('GRANT SELECT ON artifacts, schema_migrations, tenant_grants TO %I', grantee);
    EXECUTE format('GRANT SELECT, UPDATE (updated_at) ON queues TO %I', grantee);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE ON queue_buckets TO %I', grantee);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE ON mailbox TO %I', grantee);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE ON approvals TO %I', grantee);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE ON api_tokens TO %I', grantee);
END
$$;

-- Roles granted before this migration get the tokens table too.
DO $$
DECLARE
    r RECORD;
BEGIN
    EXECUTE format('ALTER FUNCTION grant_tenant(NAME, TEXT) SET search_path = %I, pg_temp', current_schema());
    FOR r IN SELECT DISTINCT role FROM tenant_grants LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE ON api_tokens TO %I', r.role);
    END LOOP;
END
$$;
