-- A tenant's own bucket of the installation's per-tenant rate
-- (queues.tenant_rate_*) was written by the claimer as computed: a tenant's
-- role could INSERT and UPDATE its rows of queue_buckets (the policies
-- allowed it), so with raw SQL it refilled its bucket at will and escaped
-- the installation's limit, for the installation's workers too (issue 21).
-- Now no role but the owner writes a bucket row: a claim spends a tenant's
-- bucket through spend_tenant_tokens, as it spends the queue-wide one
-- through spend_queue_tokens (0006) and a share's through spend_share_tokens
-- (0024), which charges no more than the caller's own transaction claimed.
DROP POLICY add_own_buckets ON queue_buckets;
DROP POLICY spend_own_buckets ON queue_buckets;

UPDATE tenant_privileges SET privileges = 'SELECT' WHERE object_name = 'queue_buckets';

-- Take back what grant_tenant gave the roles granted before this migration
-- (and anything else anyone but the owner holds on the table, but reading).
DO $$
DECLARE
    holder NAME;
BEGIN
    REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON queue_buckets FROM PUBLIC;
    FOR holder IN SELECT DISTINCT r.rolname
                  FROM pg_class AS c CROSS JOIN LATERAL aclexplode(c.relacl) AS a
                  JOIN pg_roles AS r ON r.oid = a.grantee
                  WHERE c.oid = 'queue_buckets'::regclass AND a.grantee <> c.relowner LOOP
        EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON queue_buckets FROM %I', holder);
    END LOOP;
END
$$;

-- Spend the per-tenant buckets of a claim: counts[i] tokens of tenants[i]'s
-- bucket of queue names[i] (a queue with a tenant rate), but never more than
-- the runs of that queue and tenant the caller's own transaction moved to
-- running (their rows' xmin is this transaction), and no row at all where it
-- moved none: through it a role can only spend, and only a tenant it claimed
-- for. Each bucket is recomputed from its current row under the row's lock
-- (ON CONFLICT DO UPDATE), not from what the caller read. The refill is
-- admission.Bucket.refilled with the queue's tenant rate; "at" is the
-- claimer's clock, capped by the server's.
CREATE FUNCTION spend_tenant_tokens(names TEXT[], tenants TEXT[], counts BIGINT[], at DOUBLE PRECISION)
RETURNS void LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
DECLARE
    stamp DOUBLE PRECISION := LEAST(at, extract(epoch FROM clock_timestamp()));
    me TEXT := (pg_current_xact_id()::text::numeric % 4294967296)::text;
    lane RECORD;
BEGIN
    FOR lane IN
        SELECT c.name, c.tenant, LEAST(GREATEST(c.n, 0), m.moved) AS spent,
               COALESCE(q.tenant_rate_burst, q.tenant_rate_limit)::float8 AS capacity,
               q.tenant_rate_limit / q.tenant_rate_period AS per_second
        FROM unnest(names, tenants, counts) AS c(name, tenant, n)
        JOIN queues AS q ON q.name = c.name AND q.tenant_rate_limit IS NOT NULL
        CROSS JOIN LATERAL (SELECT count(*) AS moved FROM runs AS r
                            WHERE r.queue = c.name AND r.tenant = c.tenant AND r.status = 'running'
                              AND r.xmin::text = me) AS m
        WHERE c.tenant <> '' AND LEAST(GREATEST(c.n, 0), m.moved) > 0
        ORDER BY c.name, c.tenant
    LOOP
        INSERT INTO queue_buckets AS b (queue, tenant, tokens, refilled_at)
        VALUES (lane.name, lane.tenant, lane.capacity - lane.spent, stamp)
        ON CONFLICT (queue, tenant) DO UPDATE SET
            tokens = CASE WHEN stamp <= b.refilled_at THEN b.tokens
                          ELSE LEAST(lane.capacity, b.tokens + (stamp - b.refilled_at) * lane.per_second) END
                     - lane.spent,
            refilled_at = GREATEST(b.refilled_at, stamp);
    END LOOP;
END
$$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION spend_tenant_tokens(TEXT[], TEXT[], BIGINT[], DOUBLE PRECISION) '
                   'SET search_path = %I, pg_temp', current_schema());
END
$$;
