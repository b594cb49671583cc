-- Queues with limits, and the indexes that make fair claims cheap (see
-- store/admission.py for the rules).
--
-- A claim walks lanes: each (queue, tenant) with runs that have a
-- runnable_at, found by a recursive skip through runs_lanes (one index seek
-- per lane), then takes each lane's best due runs from the same index.
-- runs_running counts what each lane has in flight. runs_lanes replaces the
-- old runs_runnable index, which served the single global ORDER BY that
-- claims used before.

DROP INDEX runs_runnable;
CREATE INDEX runs_lanes ON runs (queue, tenant, priority DESC, runnable_at) WHERE runnable_at IS NOT NULL;
CREATE INDEX runs_running ON runs (queue, tenant) WHERE status = 'running';

-- Configured limits; a queue without a row is unlimited. A claim that may
-- take runs of a limited queue locks its row (FOR UPDATE) before counting
-- what runs: claims of one limited queue are serialised, so no two workers
-- can both take the last slot. Rates are token buckets: rate_limit claims per
-- rate_period seconds, in bursts of up to rate_burst (NULL: rate_limit).
CREATE TABLE queues (
    name                TEXT PRIMARY KEY,
    concurrency         BIGINT,
    tenant_concurrency  BIGINT,
    rate_limit          BIGINT,
    rate_period         DOUBLE PRECISION,
    rate_burst          BIGINT,
    tenant_rate_limit   BIGINT,
    tenant_rate_period  DOUBLE PRECISION,
    tenant_rate_burst   BIGINT,
    updated_at          DOUBLE PRECISION NOT NULL
);

-- Token bucket states: tenant '' is the queue-wide bucket, any other value
-- that tenant's own bucket. A missing row is a full bucket.
CREATE TABLE queue_buckets (
    queue       TEXT NOT NULL,
    tenant      TEXT NOT NULL,
    tokens      DOUBLE PRECISION NOT NULL,
    refilled_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (queue, tenant)
);

-- How many runs of each queue are running, across every tenant. A
-- tenant-scoped role sees only its own runs (row-level security), yet a
-- queue-wide limit must count everyone's: this function runs with its
-- owner's rights and returns nothing but the totals.
CREATE FUNCTION queue_running_totals(names TEXT[]) RETURNS TABLE (queue TEXT, running BIGINT)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT r.queue, count(*) FROM runs AS r
    WHERE r.status = 'running' AND r.queue = ANY(names)
    GROUP BY r.queue
$$;

-- A run of a queue with a concurrency limit that stops running (finishes,
-- waits, is released, cancelled, killed...) frees a slot: wake the workers,
-- as for a new run, so a run held back by the limit starts at once rather
-- than at the next poll. Other queues' runs pay one lookup in this small
-- table. Notifications of one transaction are folded into one.
CREATE FUNCTION notify_slot_freed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM queues
               WHERE name = NEW.queue AND (concurrency IS NOT NULL OR tenant_concurrency IS NOT NULL)) THEN
        PERFORM pg_notify('cairn_runnable', TG_TABLE_SCHEMA);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER runs_notify_slot_freed
    AFTER UPDATE OF status ON runs
    FOR EACH ROW
    WHEN (OLD.status = 'running' AND NEW.status <> 'running')
    EXECUTE FUNCTION notify_slot_freed();
