-- The tenant rule in one place. Until now every tenant policy wrote out
--     tenant = ANY (ARRAY(SELECT g.tenant FROM tenant_grants AS g WHERE ...))
-- in USING and in WITH CHECK, about twenty times; each copy was one to get
-- wrong. The rule is now the function cairn_tenants(), and every policy calls
-- it as tenant = ANY ((SELECT cairn_tenants())::TEXT[]): the scalar subquery
-- keeps it an init plan, run once per query, and tenant = ANY ($n) still an
-- index condition (tests/store/test_pg_tenant_rule.py checks the plans);
-- called bare, it would be a filter run per row. (The cast is needed:
-- ANY ((SELECT ...)) would be ANY over the subquery's rows.)
--
-- SECURITY INVOKER: it reads tenant_grants as the caller (own_grants). Its
-- search_path is pinned because a function's body is resolved when it runs:
-- under the caller's search_path, a table (or temporary table) of the
-- caller's named tenant_grants would grant it any tenant. PARALLEL SAFE as
-- the written-out rule was: it only reads, and workers share the setting.
-- EXECUTE stays granted to PUBLIC: it returns what the caller may read anyway.
--
-- Every policy that wrote the rule out is dropped and created again, so a
-- migrated database has exactly the policies of a fresh install (schema.sql).
CREATE FUNCTION cairn_tenants() RETURNS TEXT[]
LANGUAGE sql STABLE PARALLEL SAFE SECURITY INVOKER AS $$
    SELECT ARRAY(SELECT g.tenant FROM tenant_grants AS g
                 WHERE g.role = current_user
                   AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))
$$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION cairn_tenants() SET search_path = %I, pg_temp', current_schema());
END
$$;

-- The policies of the tables a tenant's role may read but not write at will.
DROP POLICY IF EXISTS read_buckets ON queue_buckets;
CREATE POLICY read_buckets ON queue_buckets FOR SELECT
    USING (tenant = '' OR tenant = ANY ((SELECT cairn_tenants())::TEXT[]));

DROP POLICY IF EXISTS read_own_shares ON queue_shares;
DROP POLICY IF EXISTS lock_own_shares ON queue_shares;
CREATE POLICY read_own_shares ON queue_shares FOR SELECT
    USING (tenant = ANY ((SELECT cairn_tenants())::TEXT[]));
CREATE POLICY lock_own_shares ON queue_shares FOR UPDATE
    USING (tenant = ANY ((SELECT cairn_tenants())::TEXT[]))
    WITH CHECK (false);

DROP POLICY IF EXISTS read_own_policies ON retention_policies;
DROP POLICY IF EXISTS insert_own_policies ON retention_policies;
DROP POLICY IF EXISTS update_own_policies ON retention_policies;
DROP POLICY IF EXISTS delete_own_policies ON retention_policies;
CREATE POLICY read_own_policies ON retention_policies FOR SELECT
    USING (tenant = '*' OR tenant = ANY ((SELECT cairn_tenants())::TEXT[]));
CREATE POLICY insert_own_policies ON retention_policies FOR INSERT
    WITH CHECK (tenant = ANY ((SELECT cairn_tenants())::TEXT[]));
CREATE POLICY update_own_policies ON retention_policies FOR UPDATE
    USING (tenant = ANY ((SELECT cairn_tenants())::TEXT[]))
    WITH CHECK (tenant = ANY ((SELECT cairn_tenants())::TEXT[]));
CREATE POLICY delete_own_policies ON retention_policies FOR DELETE
    USING (tenant = ANY ((SELECT cairn_tenants())::TEXT[]));

-- The tenant boundary of every tenant table, one loop (as in schema.sql).
DO $$
DECLARE
    rule CONSTANT TEXT := 'tenant = ANY ((SELECT cairn_tenants())::TEXT[])';
    of_run CONSTANT TEXT := 'EXISTS (SELECT 1 FROM runs AS r WHERE r.run_id = %1$I.run_id AND r.tenant = %1$I.tenant)';
    tbl TEXT;
BEGIN
    -- rows of a tenant
    FOREACH tbl IN ARRAY ARRAY['runs', 'api_tokens', 'schedules', 'memory_threads', 'memory_outbox', 'memory_vectors',
                               'memory_item_cold', 'lg_checkpoints', 'lg_blobs', 'lg_writes', 'lg_values',
                               'lg_threads', 'data_keys', 'workspace_objects', 'operator_log'] LOOP
        EXECUTE format('DROP POLICY IF EXISTS tenant_isolation ON %I', tbl);
        EXECUTE format('CREATE POLICY tenant_isolation ON %I USING (%s) WITH CHECK (%s)', tbl, rule, rule);
    END LOOP;
    -- rows of a run: written only for a run of the same tenant
    FOREACH tbl IN ARRAY ARRAY['history', 'mailbox', 'approvals', 'memory_run', 'run_archives', 'run_archive_refs'] LOOP
        EXECUTE format('DROP POLICY IF EXISTS tenant_isolation ON %I', tbl);
        EXECUTE format('CREATE POLICY tenant_isolation ON %I USING (%s) WITH CHECK (%s AND %s)',
                       tbl, rule, rule, format(of_run, tbl));
    END LOOP;
    -- rows that may belong to a run: then written only for a run of the same tenant
    FOREACH tbl IN ARRAY ARRAY['memory_thread_messages', 'memory_items'] LOOP
        EXECUTE format('DROP POLICY IF EXISTS tenant_isolation ON %I', tbl);
        EXECUTE format('CREATE POLICY tenant_isolation ON %1$I USING (%2$s) '
                       'WITH CHECK (%2$s AND (%1$I.run_id IS NULL OR %3$s))', tbl, rule, format(of_run, tbl));
    END LOOP;
END
$$;
