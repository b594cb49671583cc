-- A tenant's own share of a shared queue (issue 21): its admin caps how many
-- of its own runs of the queue run at once, on top of (never instead of)
-- the installation's limits in queues. A lane reads only its own tenant's
-- row, so a share restricts that tenant alone.
--
-- Written by the schema's owner (the HTTP server's operator, acting for the
-- token's tenant). A tenant's role reads its own tenants' rows and locks
-- them while it claims (FOR UPDATE, as for queues: UPDATE (updated_at) is
-- granted but the policy's WITH CHECK refuses any actual update), so two
-- claims of one tenant in one queue are serialised on the share's row and
-- cannot both take its last slot.
CREATE TABLE queue_shares (
    queue       TEXT NOT NULL,
    tenant      TEXT NOT NULL CHECK (tenant <> ''),
    concurrency BIGINT NOT NULL CHECK (concurrency >= 1),
    updated_at  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (queue, tenant)
);

ALTER TABLE queue_shares ENABLE ROW LEVEL SECURITY;
CREATE POLICY read_own_shares ON queue_shares FOR SELECT
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))));
CREATE POLICY lock_own_shares ON queue_shares FOR UPDATE
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))))
    WITH CHECK (false);

INSERT INTO tenant_privileges (object_name, privileges) VALUES ('queue_shares', 'SELECT, UPDATE (updated_at)');
SELECT grant_privileges('queue_shares');

-- A run of a tenant with a share that stops running frees a slot of that
-- share: wake the workers, as for a queue with a concurrency limit (0005),
-- so a run held back by its share starts at once rather than at the next poll.
CREATE OR REPLACE FUNCTION notify_slot_freed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM queues
               WHERE name = NEW.queue AND (concurrency IS NOT NULL OR tenant_concurrency IS NOT NULL))
       OR EXISTS (SELECT 1 FROM queue_shares WHERE queue = NEW.queue AND tenant = NEW.tenant) THEN
        PERFORM pg_notify('cairn_runnable', TG_TABLE_SCHEMA);
    END IF;
    RETURN NULL;
END
$$;
