-- Tenancy becomes a boundary bound to database roles, not a setting the
-- client chooses (issue 9, item 1).
--
-- Before: a role saw the rows whose tenant equalled its session setting
-- cairn.tenant, so a role meant for tenant A that ran SET cairn.tenant = 'B'
-- saw and changed B's runs; artifacts, queues and token buckets had no
-- row-level security at all.
--
-- Now:
--
-- 1. tenant_grants(role, tenant), written only by the owner of the schema
--    (the role that migrates it), says which tenants each role may act for.
--    A role other than the owner sees a row of runs or history only if the
--    row's tenant is granted to current_user AND the session setting
--    cairn.tenant is unset (or '') or equals that tenant: the setting can
--    narrow what a role sees, never widen it. A role reads only its own
--    grants. The owner stays exempt (FORCE is not set): it is the operator.
--
-- 2. Every table is under row-level security:
--    * runs, history: the grant rule above (reads, writes, locks);
--    * artifacts: content-addressed bytes shared by every tenant (identical
--      bytes are one row), readable only through a reference the reader
--      owns: a run (input_ref, result_ref) or history entry (payload_ref) it
--      may see, itself under the grant rule. Only the owner writes the table
--      directly; every other role stores bytes through store_artifact, which
--      computes the reference from the bytes itself, so no role can file
--      bytes under a reference they do not hash to, or rewrite stored bytes;
--    * artifact_gc: the owner's (no policy: invisible to everyone else);
--    * queues: readable by every role; a role locks a queue's row while it
--      claims (FOR UPDATE needs an UPDATE privilege, hence UPDATE
--      (updated_at)) but an actual UPDATE fails the policy's WITH CHECK;
--      INSERT and DELETE are not granted. Limits are operator state;
--    * queue_buckets: the queue-wide bucket (tenant '') is read by everyone
--      and written only through spend_queue_tokens, which charges at most as
--      many tokens as the caller's own transaction moved runs of that queue
--      to running; a role reads and writes the per-tenant buckets of the
--      tenants granted to it only;
--    * schema_migrations: read-only for everyone but the owner;
--    * tenant_grants: each role reads its own rows.
--
-- 3. grant_tenant(role, tenant) (run by the owner) records a grant and gives
--    the role exactly the privileges a tenant-scoped store needs;
--    revoke_tenant(role, tenant) removes a grant. See cairn.store.postgres.

CREATE TABLE tenant_grants (
    role   NAME NOT NULL,
    tenant TEXT NOT NULL CHECK (tenant <> ''),
    PRIMARY KEY (role, tenant)
);

ALTER TABLE tenant_grants ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_grants ON tenant_grants FOR SELECT USING (role = current_user);

-- The tenant rule is written out in each policy rather than called as a
-- function: an uncorrelated ARRAY(SELECT ...) is evaluated once per query
-- (an init plan) and tenant = ANY(...) can use the indexes, where a function
-- call would run the lookup for every row.
DROP POLICY tenant_isolation ON runs;
DROP POLICY tenant_isolation ON history;
CREATE POLICY tenant_isolation ON runs
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))))
    WITH CHECK (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))));
CREATE POLICY tenant_isolation ON history
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))))
    WITH CHECK (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))));

ALTER TABLE artifacts ENABLE ROW LEVEL SECURITY;
-- The subqueries run as the reader, under the policies of runs and history.
CREATE POLICY referenced ON artifacts FOR SELECT
    USING (EXISTS (SELECT 1 FROM runs AS r WHERE r.input_ref = artifacts.ref)
           OR EXISTS (SELECT 1 FROM runs AS r WHERE r.result_ref = artifacts.ref)
           OR EXISTS (SELECT 1 FROM history AS h WHERE h.payload_ref = artifacts.ref));

ALTER TABLE artifact_gc ENABLE ROW LEVEL SECURITY;

ALTER TABLE queues ENABLE ROW LEVEL SECURITY;
CREATE POLICY read_limits ON queues FOR SELECT USING (true);
CREATE POLICY lock_limits ON queues FOR UPDATE USING (true) WITH CHECK (false);

ALTER TABLE queue_buckets ENABLE ROW LEVEL SECURITY;
CREATE POLICY read_buckets ON queue_buckets FOR SELECT
    USING (tenant = '' OR tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))));
CREATE POLICY add_own_buckets ON queue_buckets FOR INSERT
    WITH CHECK (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))));
CREATE POLICY spend_own_buckets ON queue_buckets FOR UPDATE
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))))
    WITH CHECK (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))));

ALTER TABLE schema_migrations ENABLE ROW LEVEL SECURITY;
CREATE POLICY read_versions ON schema_migrations FOR SELECT USING (true);

-- Store bytes; return their reference (the SHA-256 of the bytes, computed
-- here). New bytes are queued for collection, as put_artifact does. "at" is
-- the writer's clock, capped by the server's: a stamp in the future would
-- keep the bytes from ever being collected.
CREATE FUNCTION store_artifact(content BYTEA, at DOUBLE PRECISION) RETURNS TEXT
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
DECLARE
    key TEXT := encode(sha256(content), 'hex');
    stamp DOUBLE PRECISION := LEAST(at, extract(epoch FROM clock_timestamp()));
BEGIN
    INSERT INTO artifact_gc (ref, queued_at) VALUES (key, stamp) ON CONFLICT (ref) DO NOTHING;
    INSERT INTO artifacts (ref, data, touched_at) VALUES (key, content, stamp)
    ON CONFLICT (ref) DO UPDATE SET touched_at = GREATEST(artifacts.touched_at, excluded.touched_at);
    RETURN key;
END
$$;

-- Spend the queue-wide token buckets of a claim: counts[i] tokens of queue
-- names[i], but never more than the runs of that queue the caller's own
-- transaction has moved to running (their rows' xmin is this transaction), so
-- no role can drain a bucket it did not claim from. The refill is
-- admission.Bucket.refilled: capacity rate_burst (else rate_limit), rate_limit
-- per rate_period seconds, nothing for a clock that went back. "at" is the
-- claimer's clock, capped by the server's.
CREATE FUNCTION spend_queue_tokens(names TEXT[], counts BIGINT[], at DOUBLE PRECISION) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
DECLARE
    stamp DOUBLE PRECISION := LEAST(at, extract(epoch FROM clock_timestamp()));
    me TEXT := (pg_current_xact_id()::text::numeric % 4294967296)::text;
BEGIN
    INSERT INTO queue_buckets (queue, tenant, tokens, refilled_at)
    SELECT q.name, '',
           CASE WHEN b.queue IS NULL THEN COALESCE(q.rate_burst, q.rate_limit)::float8
                WHEN stamp <= b.refilled_at THEN b.tokens
                ELSE LEAST(COALESCE(q.rate_burst, q.rate_limit)::float8,
                           b.tokens + (stamp - b.refilled_at) * q.rate_limit / q.rate_period) END
           - LEAST(GREATEST(c.n, 0), (SELECT count(*) FROM runs AS r
                                      WHERE r.queue = q.name AND r.status = 'running' AND r.xmin::text = me)),
           CASE WHEN b.queue IS NULL OR stamp > b.refilled_at THEN stamp ELSE b.refilled_at END
    FROM unnest(names, counts) AS c(name, n)
    JOIN queues AS q ON q.name = c.name AND q.rate_limit IS NOT NULL
    LEFT JOIN queue_buckets AS b ON b.queue = q.name AND b.tenant = ''
    ON CONFLICT (queue, tenant) DO UPDATE SET tokens = excluded.tokens, refilled_at = excluded.refilled_at;
END
$$;

-- The owner's helpers (EXECUTE is revoked from everyone else).
CREATE FUNCTION grant_tenant(grantee NAME, tenant_name TEXT) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_grants (role, tenant) VALUES (grantee, tenant_name) ON CONFLICT DO NOTHING;
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', current_schema(), grantee);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE ON runs TO %I', grantee);
    EXECUTE format('GRANT SELECT, INSERT ON history TO %I', grantee);
    EXECUTE format('GRANT SELECT ON artifacts, schema_migrations, tenant_grants TO %I', grantee);
    EXECUTE format('GRANT SELECT, UPDATE (updated_at) ON queues TO %I', grantee);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE ON queue_buckets TO %I', grantee);
END
$$;

CREATE FUNCTION revoke_tenant(grantee NAME, tenant_name TEXT) RETURNS void
LANGUAGE sql AS $$
    DELETE FROM tenant_grants WHERE role = grantee AND tenant = tenant_name
$$;

REVOKE EXECUTE ON FUNCTION grant_tenant(NAME, TEXT), revoke_tenant(NAME, TEXT) FROM PUBLIC;

-- Functions run with a fixed search_path: the store's schema, then pg_temp
-- (last, so a caller's temporary table cannot stand in for one of ours).
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION queue_running_totals(TEXT[]) SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION store_artifact(BYTEA, DOUBLE PRECISION) SET search_path = %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION spend_queue_tokens(TEXT[], BIGINT[], DOUBLE PRECISION) '
                   'SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION grant_tenant(NAME, TEXT) SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION revoke_tenant(NAME, TEXT) SET search_path = %I, pg_temp', current_schema());
END
$$;
