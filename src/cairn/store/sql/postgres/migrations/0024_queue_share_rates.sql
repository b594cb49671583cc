-- A tenant's own rate share (issue 21): besides (or instead of) a cap on its
-- running runs, a tenant's admin caps how many of its runs of a queue are
-- claimed, a token bucket of its own (admission.QueueShare.rate), on top of
-- the installation's rates in queues. The bucket's state is kept in the
-- share's row (tokens, refilled_at; NULL: full), which every claim of the
-- tenant in the queue locks already (lane_shares), so two claims cannot
-- both spend its last token.
ALTER TABLE queue_shares
    ALTER COLUMN concurrency DROP NOT NULL,
    ADD COLUMN rate_limit BIGINT CHECK (rate_limit >= 1),
    ADD COLUMN rate_period DOUBLE PRECISION CHECK (rate_period > 0),
    ADD COLUMN rate_burst BIGINT CHECK (rate_burst >= 1),
    ADD COLUMN tokens DOUBLE PRECISION,
    ADD COLUMN refilled_at DOUBLE PRECISION,
    ADD CONSTRAINT queue_shares_whole_rate
        CHECK ((rate_limit IS NULL) = (rate_period IS NULL) AND (rate_burst IS NULL OR rate_limit IS NOT NULL)),
    ADD CONSTRAINT queue_shares_not_empty CHECK (concurrency IS NOT NULL OR rate_limit IS NOT NULL);

-- Spend the share buckets of a claim: counts[i] tokens of tenants[i]'s share
-- of queues[i], but never more than the runs of that queue and tenant the
-- caller's own transaction moved to running, and no row at all of a tenant
-- it moved none of: a tenant's role writes no share directly (the policy
-- refuses it), and through this function it can only spend its own tokens
-- for claims it made. The refill is admission.Bucket.refilled, as in
-- spend_queue_tokens; "at" is the claimer's clock, capped by the server's.
CREATE FUNCTION spend_share_tokens(queues TEXT[], tenants TEXT[], counts BIGINT[], at DOUBLE PRECISION)
RETURNS void LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
DECLARE
    stamp DOUBLE PRECISION := LEAST(at, extract(epoch FROM clock_timestamp()));
    me TEXT := (pg_current_xact_id()::text::numeric % 4294967296)::text;
BEGIN
    UPDATE queue_shares AS s SET
        tokens = CASE WHEN s.tokens IS NULL THEN COALESCE(s.rate_burst, s.rate_limit)::float8
                      WHEN stamp <= s.refilled_at THEN s.tokens
                      ELSE LEAST(COALESCE(s.rate_burst, s.rate_limit)::float8,
                                 s.tokens + (stamp - s.refilled_at) * s.rate_limit / s.rate_period) END
                 - LEAST(GREATEST(c.n, 0), m.moved),
        refilled_at = CASE WHEN s.tokens IS NULL OR stamp > s.refilled_at THEN stamp ELSE s.refilled_at END
    FROM unnest(queues, tenants, counts) AS c(queue, tenant, n)
    CROSS JOIN LATERAL (SELECT count(*) AS moved FROM runs AS r
                        WHERE r.queue = c.queue AND r.tenant = c.tenant AND r.status = 'running'
                          AND r.xmin::text = me) AS m
    WHERE s.queue = c.queue AND s.tenant = c.tenant AND s.rate_limit IS NOT NULL AND m.moved > 0;
END
$$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION spend_share_tokens(TEXT[], TEXT[], BIGINT[], DOUBLE PRECISION) '
                   'SET search_path = %I, pg_temp', current_schema());
END
$$;

-- A run that stops running frees a slot of a share with a concurrency cap
-- (a rate-only share has no slot to free: no wake-up for it).
CREATE OR REPLACE FUNCTION notify_slot_freed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM queues
               WHERE name = NEW.queue AND (concurrency IS NOT NULL OR tenant_concurrency IS NOT NULL))
       OR EXISTS (SELECT 1 FROM queue_shares
                  WHERE queue = NEW.queue AND tenant = NEW.tenant AND concurrency IS NOT NULL) THEN
        PERFORM pg_notify('cairn_runnable', TG_TABLE_SCHEMA);
    END IF;
    RETURN NULL;
END
$$;
