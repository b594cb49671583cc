-- A tenant's own rate share (issue 21): besides (or instead of) a cap on its
-- running runs, a tenant's admin caps how many of its runs of a queue are
-- claimed, a token bucket of its own (admission.QueueShare.rate), on top of
-- the installation's rates in queues. The bucket's state is kept in the
-- share's row (tokens, refilled_at; NULL: full). concurrency may now be NULL
-- (a rate-only share), which SQLite cannot change in place: the table is
-- rebuilt (shares are few).
CREATE TABLE queue_shares_new (
    queue       TEXT NOT NULL,
    tenant      TEXT NOT NULL CHECK (tenant <> ''),
    concurrency INTEGER CHECK (concurrency >= 1),
    updated_at  REAL NOT NULL,
    rate_limit  INTEGER CHECK (rate_limit >= 1),
    rate_period REAL CHECK (rate_period > 0),
    rate_burst  INTEGER CHECK (rate_burst >= 1),
    tokens      REAL,
    refilled_at REAL,
    CHECK ((rate_limit IS NULL) = (rate_period IS NULL) AND (rate_burst IS NULL OR rate_limit IS NOT NULL)),
    CHECK (concurrency IS NOT NULL OR rate_limit IS NOT NULL),
    PRIMARY KEY (queue, tenant)
) WITHOUT ROWID;

INSERT INTO queue_shares_new (queue, tenant, concurrency, updated_at)
SELECT queue, tenant, concurrency, updated_at FROM queue_shares;

DROP TABLE queue_shares;
ALTER TABLE queue_shares_new RENAME TO queue_shares;
