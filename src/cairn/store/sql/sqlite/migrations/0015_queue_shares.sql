-- A tenant's own share of a shared queue (issue 21): its admin caps how many
-- of its own runs of the queue run at once, on top of (never instead of)
-- the installation's limits in queues. A lane reads only its own tenant's
-- row, so a share restricts that tenant alone.
CREATE TABLE queue_shares (
    queue       TEXT NOT NULL,
    tenant      TEXT NOT NULL CHECK (tenant <> ''),
    concurrency INTEGER NOT NULL CHECK (concurrency >= 1),
    updated_at  REAL NOT NULL,
    PRIMARY KEY (queue, tenant)
) WITHOUT ROWID;
