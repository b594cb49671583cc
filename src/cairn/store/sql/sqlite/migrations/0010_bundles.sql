-- Bundles: what decides a run's behaviour (its workflow's name, version and
-- code hash, the prompts, model settings and tools it uses), stored once per
-- content hash. bundle_id is derived from content (cairn.engine.bundles),
-- and every reader checks it, so a row is either what its id says or is
-- refused as damaged. Application definitions, not tenant data: one row
-- serves every tenant. served_at: when a worker serving it last said so.
CREATE TABLE bundles (
    bundle_id  TEXT PRIMARY KEY,
    workflow   TEXT NOT NULL,
    version    TEXT NOT NULL,
    code       TEXT NOT NULL,
    content    BLOB NOT NULL,
    created_at REAL NOT NULL,
    served_at  REAL
) WITHOUT ROWID;

-- The bundle a run executes on, recorded when it is created; NULL for runs
-- older than bundles (any worker with their workflow serves them). Claims
-- filter on it; no index: it is a residual filter of the lane scan.
ALTER TABLE runs ADD COLUMN bundle TEXT;
