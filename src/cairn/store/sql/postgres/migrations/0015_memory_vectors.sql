-- Vectors of long-term memory items (issue 14): derived data, computed by
-- the embedding worker from memory_items.index_text after the item's put
-- committed (memory_outbox says what is due). One row per item: the vector
-- of `version`, made by `embedder` (vectors of different embedders are never
-- compared). `tier`: 'hot' holds `dims` float32 (little-endian); 'cold'
-- holds `dims` int8, each component `scale` times its int8 (a quarter of the
-- bytes; see cairn.store.vectorindex). Without pgvector the store scores
-- them exactly in the client; `vec` (pgvector's type, hot rows only) exists
-- only where the extension could be created when this migration ran.
CREATE TABLE memory_vectors (
    tenant      TEXT NOT NULL,
    namespace   TEXT NOT NULL,
    key         TEXT NOT NULL,
    version     BIGINT NOT NULL,
    embedder    TEXT NOT NULL,
    dims        BIGINT NOT NULL,
    tier        TEXT NOT NULL DEFAULT 'hot',
    embedding   BYTEA NOT NULL,
    scale       DOUBLE PRECISION,
    embedded_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (tenant, namespace, key)
);

-- pgvector where it can be had (untested on machines without it): the
-- exact fallback reads `embedding` either way.
DO $$
BEGIN
    BEGIN
        CREATE EXTENSION IF NOT EXISTS vector;
    EXCEPTION WHEN OTHERS THEN
        RETURN;  -- not installed, or not ours to create: the exact fallback
    END;
    ALTER TABLE memory_vectors ADD COLUMN vec vector;
END
$$;

-- Row-level security: the grant rule of runs and history (migration 0006).
-- A tenant's role reads, stores, re-tiers and drops only its own tenants'
-- vectors (its embedding worker and its deletions).
ALTER TABLE memory_vectors ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON memory_vectors
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))))
    WITH CHECK (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))));

-- grant_tenant gives a tenant's role the privileges on memory_vectors too;
-- the roles granted before this migration get them here. (memory_items and
-- memory_outbox are memcore's: its migration grants them.)
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
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON memory_vectors TO %I', grantee);
END
$$;

DO $$
DECLARE
    grantee NAME;
BEGIN
    EXECUTE format('ALTER FUNCTION grant_tenant(NAME, TEXT) SET search_path = %I, pg_temp', current_schema());
    FOR grantee IN SELECT DISTINCT g.role FROM tenant_grants AS g LOOP
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = grantee) THEN
            EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON memory_vectors TO %I', grantee);
        END IF;
    END LOOP;
END
$$;
