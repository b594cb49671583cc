-- Queue admission binds a tenant's own SQL role (issue 21).
--
-- Before: the limits of a queue (concurrency, tenant_concurrency, the
-- rates), a tenant's share and its rate were enforced only by the claim
-- statements the store runs. A tenant's role may UPDATE and INSERT its own
-- runs, so with SQL of its own it moved them to 'running' (or moved running
-- runs into a limited queue, or between two tenants granted to it) past
-- every limit and without a token, filling a shared queue so that no other
-- tenant's run could start. And the spending functions charged "no more
-- than the rows this transaction moved to running" by counting running rows
-- whose xmin was the transaction, again on every call: calling them twice,
-- or after touching running rows, drained the queue-wide bucket (every
-- tenant's rate) at will.
--
-- Now a run that a tenant's role moves to running is admitted when its
-- transaction commits, by the database: admit_claim, a deferred constraint
-- trigger on runs, fires for every row that enters 'running' (inserted so,
-- updated to it, or moved to another queue or tenant while running) in a
-- transaction of a role under row-level security. At commit it locks the
-- queue's row and the tenant's share (as a claim does), refuses the whole
-- transaction if the queue, the tenant or its share would run more than
-- their concurrency, and takes one token from every bucket the run is
-- subject to, refusing it when one is empty (the rule of admission.plan,
-- stamped with the row's updated_at, the claimer's clock, capped by the
-- server's). A row that left running again before the commit is no claim.
-- The store's own claims by such a role plan under the same locks first, so
-- they pass; they no longer spend themselves.
--
-- The owner (and any role exempt from row-level security) is the
-- installation: its claims are not re-checked (the triggers' WHEN is false
-- for it: nothing is queued or run for them), and it spends through
-- spend_queue_tokens, spend_tenant_tokens and spend_share_tokens, which now
-- run as their caller and charge what the owner says; called by any other
-- role they do nothing (their claims were charged as they commit).
--
-- The refusal is a serialization failure (SQLSTATE 40001): the claim was
-- planned on a state that changed before it committed (the owner's inline
-- runs start without the claim locks), and it may simply be planned again.

-- One token taken from a bucket (admission.Bucket.refilled, then minus one):
-- its state (tokens as of refilled_at; NULL tokens: a full bucket) refilled
-- to stamp; NULL when it holds less than one token then (admission.plan
-- refuses the claim). Returns ARRAY[tokens, refilled_at] to store. The
-- arithmetic is Python's, in its order (per_second is limit / period), and
-- 1e-9 absorbs a last-bit difference.
CREATE FUNCTION bucket_take(tokens DOUBLE PRECISION, refilled_at DOUBLE PRECISION, capacity DOUBLE PRECISION,
                            per_second DOUBLE PRECISION, stamp DOUBLE PRECISION)
RETURNS DOUBLE PRECISION[] LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN b.have >= 1 - 1e-9 THEN ARRAY[b.have - 1, b.at] END
    FROM (SELECT CASE WHEN tokens IS NULL OR refilled_at IS NULL THEN capacity
                      WHEN stamp <= refilled_at THEN tokens
                      ELSE LEAST(capacity, tokens + (stamp - refilled_at) * per_second) END AS have,
                 CASE WHEN tokens IS NULL OR refilled_at IS NULL OR stamp > refilled_at THEN stamp
                      ELSE refilled_at END AS at) AS b
$$;

-- Admit one run that entered 'running' in this transaction (fired at commit,
-- once per such row): see the top of this file.
CREATE FUNCTION admit_claim() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    server DOUBLE PRECISION := extract(epoch FROM clock_timestamp());
    stamp DOUBLE PRECISION;
    q queues%ROWTYPE;
    s queue_shares%ROWTYPE;
    b queue_buckets%ROWTYPE;
    counted BIGINT;
    taken DOUBLE PRECISION[];
    refused TEXT;
BEGIN
    -- The row as it is now: a run that left running (or this queue or
    -- tenant) later in the transaction claimed nothing here.
    SELECT LEAST(r.updated_at, server) INTO stamp FROM runs AS r
    WHERE r.run_id = NEW.run_id AND r.status = 'running' AND r.queue = NEW.queue AND r.tenant = NEW.tenant;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF NOT stamp > '-Infinity'::float8 THEN
        stamp := server;
    END IF;
    -- The claim's locks, in its order (queue, then share): claims of this
    -- queue and tenant are serialised, and what they committed is counted.
    SELECT * INTO q FROM queues WHERE name = NEW.queue FOR UPDATE;
    SELECT * INTO s FROM queue_shares WHERE queue = NEW.queue AND tenant = NEW.tenant FOR UPDATE;
    IF q.name IS NULL AND s.queue IS NULL THEN
        RETURN NULL;  -- an unlimited queue, no share
    END IF;
    IF q.concurrency IS NOT NULL THEN
        SELECT count(*) INTO counted FROM runs WHERE queue = NEW.queue AND status = 'running';
        IF counted > q.concurrency THEN
            refused := format('queue %s runs at most %s at once', NEW.queue, q.concurrency);
        END IF;
    END IF;
    IF refused IS NULL AND (q.tenant_concurrency IS NOT NULL OR s.concurrency IS NOT NULL) THEN
        SELECT count(*) INTO counted FROM runs
        WHERE queue = NEW.queue AND tenant = NEW.tenant AND status = 'running';
        IF counted > LEAST(q.tenant_concurrency, s.concurrency) THEN
            refused := format('queue %s runs at most %s of tenant %s at once', NEW.queue,
                              LEAST(q.tenant_concurrency, s.concurrency), NEW.tenant);
        END IF;
    END IF;
    IF refused IS NULL AND q.rate_limit IS NOT NULL THEN
        SELECT * INTO b FROM queue_buckets WHERE queue = NEW.queue AND tenant = '' FOR UPDATE;
        taken := bucket_take(b.tokens, b.refilled_at, COALESCE(q.rate_burst, q.rate_limit)::float8,
                             q.rate_limit::float8 / q.rate_period, stamp);
        IF taken IS NULL THEN
            refused := format('queue %s has no token left (its rate)', NEW.queue);
        ELSE
            INSERT INTO queue_buckets (queue, tenant, tokens, refilled_at) VALUES (NEW.queue, '', taken[1], taken[2])
            ON CONFLICT (queue, tenant) DO UPDATE SET tokens = excluded.tokens, refilled_at = excluded.refilled_at;
        END IF;
    END IF;
    IF refused IS NULL AND q.tenant_rate_limit IS NOT NULL THEN
        SELECT * INTO b FROM queue_buckets WHERE queue = NEW.queue AND tenant = NEW.tenant FOR UPDATE;
        taken := bucket_take(b.tokens, b.refilled_at, COALESCE(q.tenant_rate_burst, q.tenant_rate_limit)::float8,
                             q.tenant_rate_limit::float8 / q.tenant_rate_period, stamp);
        IF taken IS NULL THEN
            refused := format('queue %s has no token left for tenant %s (its tenant rate)', NEW.queue, NEW.tenant);
        ELSE
            INSERT INTO queue_buckets (queue, tenant, tokens, refilled_at)
            VALUES (NEW.queue, NEW.tenant, taken[1], taken[2])
            ON CONFLICT (queue, tenant) DO UPDATE SET tokens = excluded.tokens, refilled_at = excluded.refilled_at;
        END IF;
    END IF;
    IF refused IS NULL AND s.rate_limit IS NOT NULL THEN
        taken := bucket_take(s.tokens, s.refilled_at, COALESCE(s.rate_burst, s.rate_limit)::float8,
                             s.rate_limit::float8 / s.rate_period, stamp);
        IF taken IS NULL THEN
            refused := format('tenant %s has no token left in its share of queue %s', NEW.tenant, NEW.queue);
        ELSE
            UPDATE queue_shares SET tokens = taken[1], refilled_at = taken[2]
            WHERE queue = NEW.queue AND tenant = NEW.tenant;
        END IF;
    END IF;
    IF refused IS NOT NULL THEN
        RAISE EXCEPTION 'run % cannot start now: %', NEW.run_id, refused
            USING ERRCODE = 'serialization_failure',
                  HINT = 'a claim is admitted by its queue''s limits when it commits; claim again later';
    END IF;
    RETURN NULL;
END
$$;

-- Deferred: checked at commit, on the transaction's final state (a run that
-- entered running and left it again claimed nothing). The WHEN clauses are
-- evaluated at the row change, so for a role exempt from row-level security
-- (the owner) nothing is queued at all. SET CONSTRAINTS ... IMMEDIATE only
-- checks earlier, never less.
CREATE CONSTRAINT TRIGGER runs_admit_inserted
    AFTER INSERT ON runs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.status = 'running' AND row_security_active('runs'))
    EXECUTE FUNCTION admit_claim();

CREATE CONSTRAINT TRIGGER runs_admit_updated
    AFTER UPDATE OF status, queue, tenant ON runs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.status = 'running'
          AND (OLD.status <> 'running' OR OLD.queue <> NEW.queue OR OLD.tenant <> NEW.tenant)
          AND row_security_active('runs'))
    EXECUTE FUNCTION admit_claim();

-- The spending functions run as their caller now. The owner's claims spend
-- what the owner says (it writes the buckets itself, holding the queue's
-- lock, as before, without the count of its own moved rows, which a
-- transaction that touched running rows inflated); any other role's claims
-- were charged by admit_claim, so for it they do nothing.
CREATE OR REPLACE FUNCTION spend_queue_tokens(names TEXT[], counts BIGINT[], at DOUBLE PRECISION) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $$
DECLARE
    stamp DOUBLE PRECISION := LEAST(at, extract(epoch FROM clock_timestamp()));
BEGIN
    IF row_security_active('runs') THEN
        RETURN;  -- a tenant's role: admit_claim charged its claims
    END IF;
    INSERT INTO queue_buckets (queue, tenant, tokens, refilled_at)
    SELECT q.name, '',
           CASE WHEN b.queue IS NULL THEN COALESCE(q.rate_burst, q.rate_limit)::float8
                WHEN stamp <= b.refilled_at THEN b.tokens
                ELSE LEAST(COALESCE(q.rate_burst, q.rate_limit)::float8,
                           b.tokens + (stamp - b.refilled_at) * q.rate_limit / q.rate_period) END
           - GREATEST(c.n, 0),
           CASE WHEN b.queue IS NULL OR stamp > b.refilled_at THEN stamp ELSE b.refilled_at END
    FROM unnest(names, counts) AS c(name, n)
    JOIN queues AS q ON q.name = c.name AND q.rate_limit IS NOT NULL
    LEFT JOIN queue_buckets AS b ON b.queue = q.name AND b.tenant = ''
    ON CONFLICT (queue, tenant) DO UPDATE SET tokens = excluded.tokens, refilled_at = excluded.refilled_at;
END
$$;

CREATE OR REPLACE FUNCTION spend_tenant_tokens(names TEXT[], tenants TEXT[], counts BIGINT[], at DOUBLE PRECISION)
RETURNS void LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $$
DECLARE
    stamp DOUBLE PRECISION := LEAST(at, extract(epoch FROM clock_timestamp()));
    lane RECORD;
BEGIN
    IF row_security_active('runs') THEN
        RETURN;  -- a tenant's role: admit_claim charged its claims
    END IF;
    FOR lane IN
        SELECT c.name, c.tenant, c.n AS spent,
               COALESCE(q.tenant_rate_burst, q.tenant_rate_limit)::float8 AS capacity,
               q.tenant_rate_limit / q.tenant_rate_period AS per_second
        FROM unnest(names, tenants, counts) AS c(name, tenant, n)
        JOIN queues AS q ON q.name = c.name AND q.tenant_rate_limit IS NOT NULL
        WHERE c.tenant <> '' AND c.n > 0
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

CREATE OR REPLACE FUNCTION spend_share_tokens(queues TEXT[], tenants TEXT[], counts BIGINT[], at DOUBLE PRECISION)
RETURNS void LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $$
DECLARE
    stamp DOUBLE PRECISION := LEAST(at, extract(epoch FROM clock_timestamp()));
BEGIN
    IF row_security_active('runs') THEN
        RETURN;  -- a tenant's role: admit_claim charged its claims
    END IF;
    UPDATE queue_shares AS s SET
        tokens = CASE WHEN s.tokens IS NULL THEN COALESCE(s.rate_burst, s.rate_limit)::float8
                      WHEN stamp <= s.refilled_at THEN s.tokens
                      ELSE LEAST(COALESCE(s.rate_burst, s.rate_limit)::float8,
                                 s.tokens + (stamp - s.refilled_at) * s.rate_limit / s.rate_period) END
                 - c.n,
        refilled_at = CASE WHEN s.tokens IS NULL OR stamp > s.refilled_at THEN stamp ELSE s.refilled_at END
    FROM unnest(queues, tenants, counts) AS c(queue, tenant, n)
    WHERE s.queue = c.queue AND s.tenant = c.tenant AND s.rate_limit IS NOT NULL AND c.n > 0;
END
$$;

-- CREATE OR REPLACE resets a function's settings: fix every search_path again.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION admit_claim() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION bucket_take(DOUBLE PRECISION, DOUBLE PRECISION, DOUBLE PRECISION, '
                   'DOUBLE PRECISION, DOUBLE PRECISION) SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION spend_queue_tokens(TEXT[], BIGINT[], DOUBLE PRECISION) '
                   'SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION spend_tenant_tokens(TEXT[], TEXT[], BIGINT[], DOUBLE PRECISION) '
                   'SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION spend_share_tokens(TEXT[], TEXT[], BIGINT[], DOUBLE PRECISION) '
                   'SET search_path = %I, pg_temp', current_schema());
END
$$;
