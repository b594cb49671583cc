-- Schedules (issue 11, item 6). Declared in code; what must outlive every
-- worker is kept here, one row per (tenant, name): the definition the
-- workers last registered (so `cairn schedules` needs no application code)
-- and last_tick, the latest tick fired or passed over. A tick fires in the
-- transaction that locks the row, moves last_tick up to it and creates its
-- run (an id derived from tenant, name and tick), so it fires once however
-- many workers race for it; last_tick never goes back. Ticks are UTC epoch
-- seconds.
CREATE TABLE schedules (
    tenant      TEXT NOT NULL,
    name        TEXT NOT NULL,
    workflow    TEXT NOT NULL,
    cron        TEXT NOT NULL,
    timezone    TEXT NOT NULL,
    missed      TEXT NOT NULL,
    grace       DOUBLE PRECISION NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL,
    updated_at  DOUBLE PRECISION NOT NULL,
    last_tick   DOUBLE PRECISION,
    last_run_id TEXT,
    fired_at    DOUBLE PRECISION,
    fired       BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, name)
);

-- Row-level security: the grant rule of runs and history (migration 0006).
-- A tenant's role registers, reads and fires only its own tenants'
-- schedules; no DELETE.
ALTER TABLE schedules ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON schedules
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))))
    WITH CHECK (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))));

-- grant_tenant gives a tenant's role the privileges on schedules too; the
-- roles granted before this migration get them here.
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
    EXECUTE format('GRANT SELECT, INSERT, UPDATE ON schedules TO %I', grantee);
END
$$;

DO $$
DECLARE
    grantee NAME;
BEGIN
    EXECUTE format('ALTER FUNCTION grant_tenant(NAME, TEXT) SET search_path = %I, pg_temp', current_schema());
    FOR grantee IN SELECT DISTINCT g.role FROM tenant_grants AS g LOOP
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = grantee) THEN
            EXECUTE format('GRANT SELECT, INSERT, UPDATE ON schedules TO %I', grantee);
        END IF;
    END LOOP;
END
$$;
