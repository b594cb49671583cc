-- Queues with limits, and the indexes that make fair claims cheap.
--
-- A claim walks lanes: each (queue, tenant) with runs that have a
-- runnable_at, found by skipping through runs_lanes one lane at a time, then
-- takes a lane's best runs (priority, then longest runnable) from the same
-- index. runs_running counts what each lane has in flight. The old
-- runs_runnable index (runnable_at alone) served the single global ORDER BY
-- that claims used before; runs_lanes replaces it.

DROP INDEX runs_runnable;
CREATE INDEX runs_lanes ON runs (queue, tenant, priority DESC, runnable_at) WHERE runnable_at IS NOT NULL;
CREATE INDEX runs_running ON runs (queue, tenant) WHERE status = 'running';

-- Configured limits; a queue without a row is unlimited. Rates are token
-- buckets: rate_limit claims per rate_period seconds, bursts of rate_burst
-- (NULL: rate_limit).
CREATE TABLE queues (
    name                TEXT PRIMARY KEY,
    concurrency         INTEGER,
    tenant_concurrency  INTEGER,
    rate_limit          INTEGER,
    rate_period         REAL,
    rate_burst          INTEGER,
    tenant_rate_limit   INTEGER,
    tenant_rate_period  REAL,
    tenant_rate_burst   INTEGER,
    updated_at          REAL NOT NULL
) WITHOUT ROWID;

-- Token bucket states: tenant '' is the queue-wide bucket, any other value
-- that tenant's own bucket. A missing row is a full bucket.
CREATE TABLE queue_buckets (
    queue       TEXT NOT NULL,
    tenant      TEXT NOT NULL,
    tokens      REAL NOT NULL,
    refilled_at REAL NOT NULL,
    PRIMARY KEY (queue, tenant)
) WITHOUT ROWID;
