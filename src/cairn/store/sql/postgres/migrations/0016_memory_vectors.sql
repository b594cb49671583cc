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

-- pgvector where it can be had: the extension as it is (created by an
-- administrator before, in any schema, often `public`), else created here
-- (in this schema: the search_path), else none. The column's type names the
-- extension's schema, which is not on the store's search_path; the store
-- finds it from the column (query has_pgvector). No ANN index: see
-- docs/design.md ("pgvector: exact, no HNSW index"). The exact fallback reads
-- `embedding` either way.
DO $$
DECLARE
    home TEXT;
BEGIN
    BEGIN
        CREATE EXTENSION IF NOT EXISTS vector;
    EXCEPTION WHEN OTHERS THEN
        NULL;  -- not installed, or not ours to create: maybe an administrator did
    END;
    SELECT n.nspname INTO home
    FROM pg_extension AS e JOIN pg_namespace AS n ON n.oid = e.extnamespace
    WHERE e.extname = 'vector' AND has_schema_privilege(n.oid, 'USAGE');
    IF home IS NULL THEN
        RETURN;  -- no pgvector we may use: the exact fallback
    END IF;
    EXECUTE format('ALTER TABLE memory_vectors ADD COLUMN vec %I.vector', home);
    -- (how the column is stored: migration 0018)
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

-- A tenant's role stores, re-tiers and drops its tenants' vectors (its
-- embedding worker and its deletions): grant_tenant grants what
-- tenant_privileges lists (0014); the roles granted before get it here.
INSERT INTO tenant_privileges (object_name, object_kind, privileges)
VALUES ('memory_vectors', 'TABLE', 'SELECT, INSERT, UPDATE, DELETE');

SELECT grant_privileges('memory_vectors');
