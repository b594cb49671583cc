-- Runs that wait for something other than a timer or a child: a signal, an
-- approval. waiting_for names it (a wait key such as 'signal:NAME'); a
-- delivery for that key makes the run runnable in the same transaction (and
-- runs_notify_runnable wakes the workers).
ALTER TABLE runs ADD COLUMN waiting_for TEXT;

-- A run's mailbox: what was delivered to it, in order of arrival (seq), each
-- message consumed at most once, by the journal entry at taken_position.
-- dedupe makes a delivery idempotent (a run that signals another sends its
-- operation id, so a replayed or re-executed send delivers nothing twice).
-- tenant is the receiving run's, read from its row by the INSERT.
CREATE TABLE mailbox (
    run_id         TEXT NOT NULL,
    seq            BIGINT NOT NULL,
    tenant         TEXT NOT NULL,
    key            TEXT NOT NULL,
    payload        BYTEA,
    payload_ref    TEXT,
    sender         TEXT,
    dedupe         TEXT,
    sent_at        DOUBLE PRECISION NOT NULL,
    taken_at       DOUBLE PRECISION,
    taken_position BIGINT,
    PRIMARY KEY (run_id, seq)
);

CREATE UNIQUE INDEX mailbox_dedupe ON mailbox (run_id, dedupe) WHERE dedupe IS NOT NULL;
CREATE INDEX mailbox_waiting ON mailbox (run_id, key, seq) WHERE taken_at IS NULL;
CREATE INDEX mailbox_payload_ref ON mailbox (payload_ref) WHERE payload_ref IS NOT NULL;

-- The tenant boundary of 0006, for the mailbox: a role reads, delivers to and
-- consumes from the mailboxes of the tenants granted to it only.
--
-- And a row written by a tenant's role must belong to a run of its own
-- tenant, for history as for the mailbox: 0006 checked only the row's own
-- tenant column, so a role could file a row under another tenant's run id
-- stamped with its own tenant (a forged journal entry, or a forged signal,
-- that an exempt worker would read). The run look-up runs under the runs
-- policy: another tenant's run is invisible, so the check fails.
ALTER TABLE mailbox ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON mailbox
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))))
    WITH CHECK (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant)))
                AND EXISTS (SELECT 1 FROM runs AS r WHERE r.run_id = mailbox.run_id AND r.tenant = mailbox.tenant));

DROP POLICY tenant_isolation ON history;
CREATE POLICY tenant_isolation ON history
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))))
    WITH CHECK (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant)))
                AND EXISTS (SELECT 1 FROM runs AS r WHERE r.run_id = history.run_id AND r.tenant = history.tenant));

-- A message's offloaded payload is readable through the message, as a run's
-- or an entry's is through them.
DROP POLICY referenced ON artifacts;
CREATE POLICY referenced ON artifacts FOR SELECT
    USING (EXISTS (SELECT 1 FROM runs AS r WHERE r.input_ref = artifacts.ref)
           OR EXISTS (SELECT 1 FROM runs AS r WHERE r.result_ref = artifacts.ref)
           OR EXISTS (SELECT 1 FROM history AS h WHERE h.payload_ref = artifacts.ref)
           OR EXISTS (SELECT 1 FROM mailbox AS m WHERE m.payload_ref = artifacts.ref));

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
END
$$;

-- Roles granted before this migration get the mailbox too.
DO $$
DECLARE
    r RECORD;
BEGIN
    EXECUTE format('ALTER FUNCTION grant_tenant(NAME, TEXT) SET search_path = %I, pg_temp', current_schema());
    FOR r IN SELECT DISTINCT role FROM tenant_grants LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE ON mailbox TO %I', r.role);
    END LOOP;
END
$$;
