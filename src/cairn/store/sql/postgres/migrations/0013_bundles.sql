-- Bundles: what decides a run's behaviour (its workflow's name, version and
-- code hash, the prompts, model settings and tools it uses), stored once per
-- content hash. Application definitions, not tenant data: one row serves
-- every tenant, and every role may read and add them. The CHECK makes the
-- id the hash of the content (cairn.engine.bundles.bundle_id), so no role
-- can store a bundle under an id that is not its content's, nor columns
-- that are not what its content says: what a run pinned is what it replays
-- with (readers check both again). served_at: when a worker serving it last said so
-- (the only column a role may change).
CREATE TABLE bundles (
    bundle_id  TEXT PRIMARY KEY,
    workflow   TEXT NOT NULL,
    version    TEXT NOT NULL,
    code       TEXT NOT NULL,
    content    BYTEA NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    served_at  DOUBLE PRECISION,
    CONSTRAINT bundles_content_hash CHECK (bundle_id = 'b' || substr(encode(sha256(content), 'hex'), 1, 24)),
    CONSTRAINT bundles_content_columns CHECK (
        workflow = convert_from(content, 'UTF8')::jsonb ->> 'workflow'
        AND version = convert_from(content, 'UTF8')::jsonb ->> 'version'
        AND code = convert_from(content, 'UTF8')::jsonb ->> 'code')
);

ALTER TABLE bundles ENABLE ROW LEVEL SECURITY;
CREATE POLICY read_bundles ON bundles FOR SELECT USING (true);
CREATE POLICY add_bundles ON bundles FOR INSERT WITH CHECK (true);
CREATE POLICY serve_bundles ON bundles FOR UPDATE USING (true) WITH CHECK (true);
-- Every role that may use the schema (granted a tenant: USAGE) may read,
-- add and mark bundles served; none may change what a bundle holds.
GRANT SELECT, INSERT, UPDATE (served_at) ON bundles TO PUBLIC;

-- The bundle a run executes on, recorded when it is created; NULL for runs
-- older than bundles (any worker with their workflow serves them).
ALTER TABLE runs ADD COLUMN bundle TEXT;
