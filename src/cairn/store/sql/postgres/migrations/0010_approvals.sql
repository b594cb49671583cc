-- Approvals: a run asks people to approve, reject or edit an action
-- (ctx.request_approval, protected tools). The lease holder writes a request
-- in the same fenced transaction as the journal entry that records it (the
-- entry at request_seq carries its details); a decision updates the row once
-- (status leaves 'pending' exactly once) and delivers itself into the run's
-- mailbox (the message at decision_seq carries the comment and the edit), in
-- one transaction that holds the run row FOR UPDATE. approvers and schema
-- are JSON; expires_at NULL: no timeout. tenant is the run's, read from its
-- row by the INSERT.
CREATE TABLE approvals (
    run_id       TEXT NOT NULL,
    request_id   TEXT NOT NULL,
    tenant       TEXT NOT NULL,
    position     BIGINT NOT NULL,
    request_seq  BIGINT NOT NULL,
    action       TEXT NOT NULL,
    type_name    TEXT NOT NULL,
    schema       TEXT,
    approvers    TEXT,
    requested_at DOUBLE PRECISION NOT NULL,
    expires_at   DOUBLE PRECISION,
    status       TEXT NOT NULL DEFAULT 'pending',
    decided_by   TEXT,
    decided_at   DOUBLE PRECISION,
    comment      TEXT,
    decision_seq BIGINT,
    PRIMARY KEY (run_id, request_id)
);

CREATE INDEX approvals_pending ON approvals (tenant, requested_at) WHERE status = 'pending';

-- The tenant boundary of 0006, for approvals: a role lists, requests and
-- decides the approvals of the tenants granted to it only, and a row it
-- writes must belong to a run of its own tenant (as for history and the
-- mailbox since 0008): it cannot file a request under another tenant's run
-- stamped with its own tenant. The run look-up runs under the runs policy.
ALTER TABLE approvals ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON approvals
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))))
    WITH CHECK (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant)))
                AND EXISTS (SELECT 1 FROM runs AS r WHERE r.run_id = approvals.run_id AND r.tenant = approvals.tenant));

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
END
$$;

-- Roles granted before this migration get approvals too.
DO $$
DECLARE
    r RECORD;
BEGIN
    EXECUTE format('ALTER FUNCTION grant_tenant(NAME, TEXT) SET search_path = %I, pg_temp', current_schema());
    FOR r IN SELECT DISTINCT role FROM tenant_grants LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE ON approvals TO %I', r.role);
    END LOOP;
END
$$;
