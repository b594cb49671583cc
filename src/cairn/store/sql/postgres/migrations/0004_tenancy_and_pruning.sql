-- Tenancy: every history row carries its run's tenant, and row-level security
-- can confine a database role to one tenant. Plus what pruning needs.
--
-- 1. history.tenant is filled in by the store from the run row inside the
--    very INSERT that writes the entry (callers never pass it), so an entry
--    cannot claim a tenant its run does not have. Existing rows are
--    backfilled here. Workers of an older Cairn (which do not write the
--    column) must be stopped before this migration runs.
--
-- 2. Row-level security on runs and history. The table owner (the role that
--    ran these migrations: Cairn's own deployments) is not subject to it
--    (FORCE is deliberately not set) and sees every tenant. Any other role sees
--    and writes only the rows whose tenant equals its session setting
--    cairn.tenant; with the setting absent it sees nothing. A tenant-scoped
--    deployment, run once per tenant by the owner or a superuser:
--
--      CREATE ROLE acme_agent LOGIN PASSWORD '...';
--      GRANT USAGE ON SCHEMA cairn TO acme_agent;
--      GRANT SELECT, INSERT, UPDATE ON cairn.runs, cairn.history TO acme_agent;
--      GRANT SELECT, INSERT, UPDATE ON cairn.artifacts TO acme_agent;
--      GRANT SELECT ON cairn.schema_migrations TO acme_agent;
--
--    and the role's sessions run SET cairn.tenant = 'acme', which
--    PostgresStore(url, tenant="acme") does on every pooled connection.
--    No DELETE grant: pruning is the owner's job (it needs to see every
--    tenant's references before deleting a shared artifact).
--
--    The setting is chosen by the client. This confines a deployment to its
--    tenant against mistakes (a wrong run id, a bug in a filter), not against
--    code that runs arbitrary SQL as the role: such code could SET the
--    setting itself. Give hostile code no database role at all.
--
-- 3. Artifacts keep no tenant: they are content-addressed and shared, so
--    identical bytes stored by two tenants are one row. Reading one needs its
--    SHA-256 reference (the content itself, or a reference from a row the
--    reader may see); a role can at most learn whether given bytes exist.

ALTER TABLE history ADD COLUMN tenant TEXT;
UPDATE history AS h SET tenant = r.tenant FROM runs AS r WHERE r.run_id = h.run_id;
-- Runs are never deleted before this migration, so every entry has its run;
-- '' would mark one that somehow had none (no tenant setting matches it).
UPDATE history SET tenant = '' WHERE tenant IS NULL;
ALTER TABLE history ALTER COLUMN tenant SET NOT NULL;

ALTER TABLE runs ENABLE ROW LEVEL SECURITY;
ALTER TABLE history ENABLE ROW LEVEL SECURITY;

-- FOR ALL: USING filters what a scoped role reads, updates and locks; WITH
-- CHECK refuses rows it inserts or updates for another tenant.
CREATE POLICY tenant_isolation ON runs
    USING (tenant = current_setting('cairn.tenant', true))
    WITH CHECK (tenant = current_setting('cairn.tenant', true));
CREATE POLICY tenant_isolation ON history
    USING (tenant = current_setting('cairn.tenant', true))
    WITH CHECK (tenant = current_setting('cairn.tenant', true));

-- Pruning (PostgresStore.prune_runs). Finished runs by age: a partial index,
-- so only the end of a run writes it (claims, renewals and steps never do).
-- Queries repeat its predicate so the planner can prove they may use it.
CREATE INDEX runs_finished ON runs (updated_at)
    WHERE status IN ('completed', 'failed', 'cancelled', 'quarantined', 'killed', 'halted');

-- "Does any row still reference this artifact?" Only rows with a reference
-- (payloads above the inline limit) are in these indexes.
CREATE INDEX runs_input_ref ON runs (input_ref) WHERE input_ref IS NOT NULL;
CREATE INDEX runs_result_ref ON runs (result_ref) WHERE result_ref IS NOT NULL;
CREATE INDEX history_payload_ref ON history (payload_ref) WHERE payload_ref IS NOT NULL;

-- When an artifact was last stored (the store's clock; put_artifact refreshes
-- it even when the bytes exist already). Pruning never deletes one stored
-- since its cutoff: its writer may be about to reference it. 0 for artifacts
-- stored before this migration: their time is unknown.
ALTER TABLE artifacts ADD COLUMN touched_at DOUBLE PRECISION NOT NULL DEFAULT 0;

-- Artifacts referenced by pruned runs, waiting to be collected (see
-- prune_runs). Kept in the database so a crash loses no candidate.
CREATE TABLE artifact_gc (
    ref       TEXT PRIMARY KEY,
    queued_at DOUBLE PRECISION NOT NULL
);
