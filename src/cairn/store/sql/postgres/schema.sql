-- The PostgreSQL schema, whole: what migrations/0001..0006 produce, in one file.
--
-- This file is the reference to read; the migrations remain what the store
-- runs (an existing database needs their steps, not this end state).
-- tests/store/test_schema.py applies all migrations to one database and this
-- file to another and requires identical schemas (pg_dump --schema-only of
-- both), so a migration added without updating this file fails the build
-- (and so does an edit here that no migration makes).
--
-- Objects are created unqualified: like the migrations, this runs with
-- search_path set to the store's schema (default cairn; ?schema=... in the
-- URL). schema_migrations is created by the store itself
-- (PostgresStore._migrate) before the first migration.
--
-- Types: times are Unix seconds as DOUBLE PRECISION (the injected clock's
-- floats, stored exactly); counters are BIGINT (SQLite integers are 64-bit);
-- JSON values (error, detail, budget) are TEXT written by msgspec, so they
-- read back byte-for-byte as written, exactly as on SQLite (JSONB would
-- reorder keys and refuse "\u0000").

CREATE TABLE schema_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at DOUBLE PRECISION NOT NULL
);

CREATE TABLE runs (
    run_id           TEXT PRIMARY KEY,
    tenant           TEXT NOT NULL,
    workflow         TEXT NOT NULL,
    workflow_version TEXT NOT NULL,
    thread_id        TEXT,
    queue            TEXT NOT NULL DEFAULT 'default',
    priority         BIGINT NOT NULL DEFAULT 0,
    parent_run_id    TEXT,
    status           TEXT NOT NULL,
    input            BYTEA,
    input_ref        TEXT,
    result           BYTEA,
    result_ref       TEXT,
    error            TEXT,
    epoch            BIGINT NOT NULL DEFAULT 0,
    owner            TEXT,
    lease_expires_at DOUBLE PRECISION,
    wake_at          DOUBLE PRECISION,
    waiting_on       TEXT,
    -- When the run may next be claimed; NULL while it cannot be.
    runnable_at      DOUBLE PRECISION,
    recoveries       BIGINT NOT NULL DEFAULT 0,
    created_at       DOUBLE PRECISION NOT NULL,
    updated_at       DOUBLE PRECISION NOT NULL,
    -- Per-run budget limits as JSON text; usage is derived from the journal. (0002)
    budget           TEXT,
    -- What a suspended run waits for besides a timer or a child (a wait key
    -- such as 'signal:NAME'); a delivery for it wakes the run. (0008)
    waiting_for      TEXT,
    -- The bundle the run executes on (cairn.engine.bundles); NULL for runs
    -- older than bundles. Claims filter on it. (0009; assigned 0012 at merge)
    bundle           TEXT,
    -- The role and token the run was started with; never changed, and a
    -- tenant's role cannot record 'installation' (0033, cairn.engine.access).
    started_role     TEXT,
    started_token    TEXT,
    -- Whose data the run holds (erasure by subject); never changed (0037).
    subject          TEXT,
    CONSTRAINT runs_started_role CHECK (started_role IN ('viewer', 'operator', 'admin', 'installation'))
);

-- Deliberately few indexes: each one is written on every claim and finish.
CREATE INDEX runs_tenant_created ON runs (tenant, created_at);
CREATE INDEX runs_parent ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL;
CREATE INDEX runs_thread ON runs (thread_id) WHERE thread_id IS NOT NULL;
-- Claims walk lanes: each (queue, tenant) with runnable runs, found by a
-- recursive skip (one index seek per lane), then each lane's best due runs.
-- runs_running counts what each lane has in flight. (0005)
CREATE INDEX runs_lanes ON runs (queue, tenant, priority DESC, runnable_at) WHERE runnable_at IS NOT NULL;
CREATE INDEX runs_running ON runs (queue, tenant) WHERE status = 'running';
-- Pruning: finished runs by age; queries repeat the predicate. (0004)
CREATE INDEX runs_finished ON runs (updated_at)
    WHERE status IN ('completed', 'failed', 'cancelled', 'quarantined', 'killed', 'halted');
-- "Does any row still reference this artifact?" (0004)
CREATE INDEX runs_input_ref ON runs (input_ref) WHERE input_ref IS NOT NULL;
CREATE INDEX runs_result_ref ON runs (result_ref) WHERE result_ref IS NOT NULL;

-- The journal and the event stream are one table: a step costs one row. The
-- primary key is also what makes a racing second writer of the same seq
-- fail. tenant is filled in by the store from the run row inside the INSERT
-- that writes the entry (callers never pass it). (tenant: 0004)
CREATE TABLE history (
    run_id      TEXT NOT NULL,
    seq         BIGINT NOT NULL,
    event       TEXT NOT NULL,
    at          DOUBLE PRECISION NOT NULL,
    epoch       BIGINT NOT NULL,
    worker      TEXT,
    position    BIGINT,
    step_kind   TEXT,
    name        TEXT,
    input_hash  TEXT,
    attempt     BIGINT,
    started_at  DOUBLE PRECISION,
    payload     BYTEA,
    payload_ref TEXT,
    detail      TEXT,
    tenant      TEXT NOT NULL,
    digest      BYTEA,
    link        BYTEA DEFAULT '\x'::bytea,
    PRIMARY KEY (run_id, seq)
);

CREATE INDEX history_payload_ref ON history (payload_ref) WHERE payload_ref IS NOT NULL;
CREATE INDEX history_events ON history (run_id, name, seq) WHERE step_kind = 'event';
-- The audit chain (0031; cairn/store/auditlinks.py): entries not linked yet
-- (only inside a transaction in progress: the store links them before commit).
CREATE INDEX history_unlinked ON history (run_id, seq) WHERE link = '\x'::bytea;

-- Large payloads, content-addressed by SHA-256, in the database because
-- workers may share nothing but this server. touched_at: when last stored
-- (pruning never deletes one stored since its cutoff). (touched_at: 0004)
CREATE TABLE artifacts (
    ref        TEXT PRIMARY KEY,
    data       BYTEA NOT NULL,
    touched_at DOUBLE PRECISION NOT NULL DEFAULT 0
);

-- Artifacts referenced by pruned runs, waiting to be collected. (0004)
CREATE TABLE artifact_gc (
    ref       TEXT PRIMARY KEY,
    queued_at DOUBLE PRECISION NOT NULL
);

-- Queues with limits; a queue without a row is unlimited. Rates are token
-- buckets: rate_limit claims per rate_period seconds, bursts of rate_burst
-- (NULL: rate_limit). (0005)
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
-- that tenant's own bucket. A missing row is a full bucket. (0005) Only
-- the owner writes rows (0025): its claims spend through spend_queue_tokens
-- and spend_tenant_tokens, a tenant's role's are charged by admit_claim as
-- they commit (0027).
CREATE TABLE queue_buckets (
    queue       TEXT NOT NULL,
    tenant      TEXT NOT NULL,
    tokens      DOUBLE PRECISION NOT NULL,
    refilled_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (queue, tenant)
);

-- How many runs of each queue are running, across every tenant: a queue-wide
-- limit must count everyone's runs, yet a tenant-scoped role sees only its
-- own. Runs with its owner's rights and returns nothing but totals. (0005)
CREATE FUNCTION queue_running_totals(names TEXT[]) RETURNS TABLE (queue TEXT, running BIGINT)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT r.queue, count(*) FROM runs AS r
    WHERE r.status = 'running' AND r.queue = ANY(names)
    GROUP BY r.queue
$$;

-- LISTEN/NOTIFY: wake workers at once when a run may have become claimable
-- (polling stays as the safety net: a lost notification costs latency, never
-- a stuck run). Payload: the schema's name. (0003)
CREATE FUNCTION notify_runnable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('cairn_runnable', TG_TABLE_SCHEMA);
    RETURN NULL;
END
$$;

CREATE TRIGGER runs_notify_runnable
    AFTER INSERT OR UPDATE OF runnable_at, status ON runs
    FOR EACH ROW
    WHEN (NEW.runnable_at IS NOT NULL AND NEW.status <> 'running')
    EXECUTE FUNCTION notify_runnable();

-- A run of a queue with a concurrency limit, or of a tenant with a share of
-- the queue, that stops running frees a slot: wake the workers, as for a new
-- run. (0005, 0023)
CREATE FUNCTION notify_slot_freed() RETURNS trigger LANGUAGE plpgsql AS $$
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

CREATE TRIGGER runs_notify_slot_freed
    AFTER UPDATE OF status ON runs
    FOR EACH ROW
    WHEN (OLD.status = 'running' AND NEW.status <> 'running')
    EXECUTE FUNCTION notify_slot_freed();

-- History timestamps are monotonic per run: an entry's at is never earlier
-- than the run's last entry's, whichever clock its writer read. (0007)
CREATE FUNCTION history_monotonic_at() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.at := GREATEST(NEW.at, COALESCE(
        (SELECT h.at FROM history AS h WHERE h.run_id = NEW.run_id ORDER BY h.seq DESC LIMIT 1), NEW.at));
    RETURN NEW;
END
$$;

CREATE TRIGGER history_monotonic_at
    BEFORE INSERT ON history
    FOR EACH ROW
    EXECUTE FUNCTION history_monotonic_at();

-- Tenancy (0004, 0006): row-level security on every table, bound to roles.
-- The table owner (the role that ran the migrations) is not subject to it
-- (FORCE is deliberately not set). Any other role sees and writes rows of
-- runs and history only for the tenants tenant_grants grants it, narrowed
-- (never widened) by its session setting cairn.tenant; artifacts only through
-- a reference it may see; queue limits read-only; the token buckets not at
-- all: its claims are admitted and charged by admit_claim (0025, 0027). See
-- migrations/0006_tenant_boundary.sql.

CREATE TABLE tenant_grants (
    role   NAME NOT NULL,
    tenant TEXT NOT NULL CHECK (tenant <> ''),
    PRIMARY KEY (role, tenant)
);

ALTER TABLE tenant_grants ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_grants ON tenant_grants FOR SELECT USING (role = current_user);

-- The tenant rule, in one place (0044): the tenants tenant_grants grants the
-- calling role, narrowed (never widened) by its setting cairn.tenant. Every
-- tenant policy calls it as tenant = ANY ((SELECT cairn_tenants())::TEXT[]):
-- the scalar subquery is an init plan, run once per query, and tenant =
-- ANY ($n) can be an index condition; called bare, it would be a filter run
-- per row. (The cast is needed: ANY ((SELECT ...)) would be ANY over the
-- subquery's rows, comparing a tenant with an array.)
-- SECURITY INVOKER: it reads tenant_grants as the caller (own_grants). Its
-- search_path is pinned (below) because a function's body is resolved when it
-- runs: under the caller's search_path, a table (or temporary table) of the
-- caller's named tenant_grants would grant it any tenant. PARALLEL SAFE as
-- the written-out rule was: it only reads, and workers share the setting.
-- EXECUTE stays granted to PUBLIC: it returns what the caller may read anyway.
CREATE FUNCTION cairn_tenants() RETURNS TEXT[]
LANGUAGE sql STABLE PARALLEL SAFE SECURITY INVOKER AS $$
    SELECT ARRAY(SELECT g.tenant FROM tenant_grants AS g
                 WHERE g.role = current_user
                   AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))
$$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION cairn_tenants() SET search_path = %I, pg_temp', current_schema());
END
$$;

ALTER TABLE runs ENABLE ROW LEVEL SECURITY;
ALTER TABLE history ENABLE ROW LEVEL SECURITY;
-- Their policies (tenant_isolation), and those of every tenant table, are
-- created by one loop at the end of this file (0044).

-- A run's mailbox (0008): what was delivered to it (signals, decisions), in
-- order of arrival, each message consumed at most once by the journal entry
-- at taken_position; dedupe makes a delivery idempotent. Tenant-scoped
-- like runs and history.
CREATE TABLE mailbox (
    run_id         TEXT NOT NULL,
    seq            BIGINT NOT NULL,
    tenant         TEXT NOT NULL,
    key            TEXT NOT NULL,
    payload        BYTEA,
    payload_ref    TEXT,
    sender         TEXT,
    dedupe         TEXT,
    sent_at        DOUBLE PRECISION NOT NULL,
    taken_at       DOUBLE PRECISION,
    taken_position BIGINT,
    PRIMARY KEY (run_id, seq)
);

CREATE UNIQUE INDEX mailbox_dedupe ON mailbox (run_id, dedupe) WHERE dedupe IS NOT NULL;
CREATE INDEX mailbox_waiting ON mailbox (run_id, key, seq) WHERE taken_at IS NULL;
CREATE INDEX mailbox_payload_ref ON mailbox (payload_ref) WHERE payload_ref IS NOT NULL;

-- The tenant boundary of 0006, for the mailbox: a role reads, delivers to and
-- consumes from the mailboxes of the tenants granted to it only; a row it
-- writes must belong to a run of its own tenant (as for history, since 0008).
ALTER TABLE mailbox ENABLE ROW LEVEL SECURITY;

ALTER TABLE artifacts ENABLE ROW LEVEL SECURITY;
-- Its policy (referenced) is at the end, after the memory tables it names.

ALTER TABLE artifact_gc ENABLE ROW LEVEL SECURITY;

ALTER TABLE queues ENABLE ROW LEVEL SECURITY;
CREATE POLICY read_limits ON queues FOR SELECT USING (true);
CREATE POLICY lock_limits ON queues FOR UPDATE USING (true) WITH CHECK (false);

ALTER TABLE queue_buckets ENABLE ROW LEVEL SECURITY;
CREATE POLICY read_buckets ON queue_buckets FOR SELECT
    USING (tenant = '' OR tenant = ANY ((SELECT cairn_tenants())::TEXT[]));

ALTER TABLE schema_migrations ENABLE ROW LEVEL SECURITY;
CREATE POLICY read_versions ON schema_migrations FOR SELECT USING (true);

-- Store bytes; return their reference (the SHA-256 of the bytes, computed
-- here). New bytes are queued for collection, as put_artifact does. "at" is
-- the writer's clock, capped by the server's: a stamp in the future would
-- keep the bytes from ever being collected.
CREATE FUNCTION store_artifact(content BYTEA, at DOUBLE PRECISION) RETURNS TEXT
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
DECLARE
    key TEXT := encode(sha256(content), 'hex');
    stamp DOUBLE PRECISION := LEAST(at, extract(epoch FROM clock_timestamp()));
BEGIN
    INSERT INTO artifact_gc (ref, queued_at) VALUES (key, stamp) ON CONFLICT (ref) DO NOTHING;
    INSERT INTO artifacts (ref, data, touched_at) VALUES (key, content, stamp)
    ON CONFLICT (ref) DO UPDATE SET touched_at = GREATEST(artifacts.touched_at, excluded.touched_at);
    RETURN key;
END
$$;

-- Spend the queue-wide token buckets of the owner's claims (0006; 0027: run as
-- the caller, and a no-op for any role under row-level security, whose
-- claims admit_claim charges as they commit): counts[i] tokens of queue
-- names[i]. The refill is admission.Bucket.refilled: capacity rate_burst
-- (else rate_limit), rate_limit per rate_period seconds, nothing for a
-- clock that went back. "at" is the claimer's clock, capped by the server's.
CREATE FUNCTION spend_queue_tokens(names TEXT[], counts BIGINT[], at DOUBLE PRECISION) RETURNS void
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

-- Spend the per-tenant buckets of the owner's claims (0025; 0027 as
-- spend_queue_tokens): counts[i] tokens of tenants[i]'s bucket of queue
-- names[i] (a queue with a tenant rate), each recomputed from its current
-- row under the row's lock (ON CONFLICT DO UPDATE).
CREATE FUNCTION spend_tenant_tokens(names TEXT[], tenants TEXT[], counts BIGINT[], at DOUBLE PRECISION)
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

-- The owner's helpers (EXECUTE is revoked from everyone else).
-- Bearer tokens of the HTTP API (cairn serve): each bound to one tenant and
-- one role. Only the SHA-256 of the secret is stored; a token is looked up by
-- its public id and its digest compared in constant time. revoked_at set:
-- refused from then on (kept, so `cairn tokens list` can show who had what).
CREATE TABLE api_tokens (
    token_id    TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    role        TEXT NOT NULL,
    name        TEXT NOT NULL,
    digest      TEXT NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL,
    created_by  TEXT,
    revoked_at  DOUBLE PRECISION
);

CREATE INDEX api_tokens_tenant ON api_tokens (tenant, created_at);

-- A tenant's run changes in the order they happened: the cursor of the
-- tenant-wide event stream and of the dashboard's live runs list.
CREATE INDEX runs_tenant_updated ON runs (tenant, updated_at, run_id COLLATE "C");

-- The tenant boundary of 0006, for tokens: a tenant's role reads, mints and
-- revokes the tokens of its granted tenants only (the server that checks
-- tokens of every tenant connects as the owner).
ALTER TABLE api_tokens ENABLE ROW LEVEL SECURITY;

-- ...and never writes an installation token (0035): `installation` is the
-- installation's operator, above a tenant's admin; the owner still mints them.
CREATE POLICY tenant_token_not_installation ON api_tokens AS RESTRICTIVE FOR INSERT
    WITH CHECK (role <> 'installation');
CREATE POLICY tenant_token_stays_below_installation ON api_tokens AS RESTRICTIVE FOR UPDATE
    USING (true)
    WITH CHECK (role <> 'installation');

-- Bundles (0013):
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

-- The privileges grant_tenant gives a tenant's role, as data (0014): one
-- row per table or sequence; a migration that adds a table adds its row and
-- calls grant_privileges(name) for the roles granted before it. Only the
-- schema's owner may change it: the privileges text is SQL grant_tenant runs.
CREATE TABLE tenant_privileges (
    object_name TEXT PRIMARY KEY,
    object_kind TEXT NOT NULL DEFAULT 'TABLE',
    privileges  TEXT NOT NULL,
    CONSTRAINT tenant_privileges_kind CHECK (object_kind IN ('TABLE', 'SEQUENCE'))
);

INSERT INTO tenant_privileges (object_name, privileges) VALUES
    ('runs', 'SELECT, INSERT, UPDATE'),
    ('history', 'SELECT, INSERT, UPDATE (digest, link)'),
    ('artifacts', 'SELECT'),
    ('schema_migrations', 'SELECT'),
    ('tenant_grants', 'SELECT'),
    ('queues', 'SELECT, UPDATE (updated_at)'),
    ('queue_buckets', 'SELECT'),  -- (0025; was SELECT, INSERT, UPDATE)
    ('mailbox', 'SELECT, INSERT, UPDATE'),
    ('approvals', 'SELECT, INSERT, UPDATE'),
    ('api_tokens', 'SELECT, INSERT, UPDATE'),
    ('schedules', 'SELECT, INSERT, UPDATE');

-- the memory tiers (0015)
INSERT INTO tenant_privileges (object_name, object_kind, privileges) VALUES
    ('memory_run', 'TABLE', 'SELECT, INSERT, UPDATE, DELETE'),
    ('memory_threads', 'TABLE', 'SELECT, INSERT, UPDATE, DELETE'),
    ('memory_thread_messages', 'TABLE', 'SELECT, INSERT, UPDATE, DELETE'),
    ('memory_items', 'TABLE', 'SELECT, INSERT, UPDATE, DELETE'),
    ('memory_outbox', 'TABLE', 'SELECT, INSERT, UPDATE, DELETE'),
    ('memory_outbox_id_seq', 'SEQUENCE', 'USAGE');

-- the vectors of long-term memory (0016)
INSERT INTO tenant_privileges (object_name, object_kind, privileges)
VALUES ('memory_vectors', 'TABLE', 'SELECT, INSERT, UPDATE, DELETE');

-- the cold tier of item values (0017)
INSERT INTO tenant_privileges (object_name, object_kind, privileges)
VALUES ('memory_item_cold', 'TABLE', 'SELECT, INSERT, UPDATE, DELETE');

-- the LangGraph checkpoint tables (0026)
INSERT INTO tenant_privileges (object_name, object_kind, privileges) VALUES
    ('lg_checkpoints', 'TABLE', 'SELECT, INSERT, UPDATE, DELETE'),
    ('lg_blobs', 'TABLE', 'SELECT, INSERT, UPDATE, DELETE'),
    ('lg_writes', 'TABLE', 'SELECT, INSERT, UPDATE, DELETE'),
    ('lg_values', 'TABLE', 'SELECT, INSERT, UPDATE, DELETE'),
    ('lg_threads', 'TABLE', 'SELECT, INSERT, UPDATE, DELETE');

-- the data keys of encryption at rest (0029)
INSERT INTO tenant_privileges (object_name, object_kind, privileges) VALUES
    ('data_keys', 'TABLE', 'SELECT, INSERT');
-- the workspace objects (0030; UPDATE since 0034: storing one again moves its stored_at)
INSERT INTO tenant_privileges (object_name, object_kind, privileges)
VALUES ('workspace_objects', 'TABLE', 'SELECT, INSERT, UPDATE, DELETE');
-- archived runs (0038)
INSERT INTO tenant_privileges (object_name, object_kind, privileges) VALUES
    ('run_archives', 'TABLE', 'SELECT'),
    ('run_archive_refs', 'TABLE', 'SELECT');

CREATE FUNCTION grant_privileges(name TEXT) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    grantee NAME;
    item tenant_privileges%ROWTYPE;
BEGIN
    SELECT * INTO STRICT item FROM tenant_privileges AS p WHERE p.object_name = name;
    FOR grantee IN SELECT DISTINCT g.role FROM tenant_grants AS g LOOP
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = grantee) THEN
            EXECUTE format('GRANT %s ON %s %I TO %I', item.privileges, item.object_kind, item.object_name,
                           grantee);
        END IF;
    END LOOP;
END
$$;

CREATE FUNCTION grant_tenant(grantee NAME, tenant_name TEXT) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    item tenant_privileges%ROWTYPE;
BEGIN
    INSERT INTO tenant_grants (role, tenant) VALUES (grantee, tenant_name) ON CONFLICT DO NOTHING;
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', current_schema(), grantee);
    FOR item IN SELECT * FROM tenant_privileges ORDER BY object_name LOOP
        EXECUTE format('GRANT %s ON %s %I TO %I', item.privileges, item.object_kind, item.object_name,
                       grantee);
    END LOOP;
END
$$;

CREATE FUNCTION revoke_tenant(grantee NAME, tenant_name TEXT) RETURNS void
LANGUAGE sql AS $$
    DELETE FROM tenant_grants WHERE role = grantee AND tenant = tenant_name
$$;

REVOKE EXECUTE ON FUNCTION grant_tenant(NAME, TEXT), revoke_tenant(NAME, TEXT), grant_privileges(TEXT)
    FROM PUBLIC;

-- Functions run with a fixed search_path: the store's schema, then pg_temp
-- (last, so a caller's temporary table cannot stand in for one of ours).
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION queue_running_totals(TEXT[]) SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION store_artifact(BYTEA, DOUBLE PRECISION) SET search_path = %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION spend_queue_tokens(TEXT[], BIGINT[], DOUBLE PRECISION) '
                   'SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION spend_tenant_tokens(TEXT[], TEXT[], BIGINT[], DOUBLE PRECISION) '
                   'SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION grant_tenant(NAME, TEXT) SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION grant_privileges(TEXT) SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION revoke_tenant(NAME, TEXT) SET search_path = %I, pg_temp', current_schema());
END
$$;

-- Approvals (0010): requests a run made for people to approve, reject or
-- edit; written by the lease holder with the journal entry that records the
-- request (request_seq: its details), decided once (decision_seq: the
-- mailbox message that delivered the decision to the run); under the
-- tenant boundary of 0006 like the mailbox.
CREATE TABLE approvals (
    run_id       TEXT NOT NULL,
    request_id   TEXT NOT NULL,
    tenant       TEXT NOT NULL,
    position     BIGINT NOT NULL,
    request_seq  BIGINT NOT NULL,
    action       TEXT NOT NULL,
    type_name    TEXT NOT NULL,
    schema       TEXT,
    approvers    TEXT,
    requested_at DOUBLE PRECISION NOT NULL,
    expires_at   DOUBLE PRECISION,
    status       TEXT NOT NULL DEFAULT 'pending',
    decided_by   TEXT,
    decided_at   DOUBLE PRECISION,
    comment      TEXT,
    decision_seq BIGINT,
    PRIMARY KEY (run_id, request_id)
);

CREATE INDEX approvals_pending ON approvals (tenant, requested_at) WHERE status = 'pending';

ALTER TABLE approvals ENABLE ROW LEVEL SECURITY;

-- Schedules: the definition the workers last registered, and the latest tick
-- fired or passed over (UTC epoch seconds; NULL: none yet). A tick fires in
-- the transaction that locks the row, moves last_tick up to it and creates
-- its run. Under the grant rule of runs and history; grant_tenant grants it.
CREATE TABLE schedules (
    tenant      TEXT NOT NULL,
    name        TEXT NOT NULL,
    workflow    TEXT NOT NULL,
    cron        TEXT NOT NULL,
    timezone    TEXT NOT NULL,
    missed      TEXT NOT NULL,
    grace       DOUBLE PRECISION NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL,
    updated_at  DOUBLE PRECISION NOT NULL,
    last_tick   DOUBLE PRECISION,
    last_run_id TEXT,
    fired_at    DOUBLE PRECISION,
    fired       BIGINT NOT NULL DEFAULT 0,
    -- The role its ticks' runs are started with, as registered (0039; shown:
    -- the run takes it from the declaration in code).
    started_role TEXT,
    PRIMARY KEY (tenant, name),
    CONSTRAINT schedules_started_role CHECK (started_role IN ('viewer', 'operator', 'admin', 'installation'))
);

ALTER TABLE schedules ENABLE ROW LEVEL SECURITY;

-- Memory tiers (issue 14). Three tiers with their own tables and lifecycles:
-- run memory (scratch of one run, deleted with it), thread memory (ordered
-- messages shared by the runs of a thread) and long-term memory (namespaced
-- key-value items; memory_outbox holds the items whose index text the
-- embedding worker must embed). Every row carries its tenant and the
-- provenance of its last write: the run, position and operation id of the
-- step that wrote it, or the actor (an operator) who wrote it outside a run.
-- Values are codec payloads: inline bytes, or an artifact ref when large.

-- Run memory: deleted with its run (the trigger below, whatever deletes it).
CREATE TABLE memory_run (
    run_id       TEXT NOT NULL,
    key          TEXT NOT NULL,
    tenant       TEXT NOT NULL,
    value        BYTEA,
    value_ref    TEXT,
    version      BIGINT NOT NULL,
    created_at   DOUBLE PRECISION NOT NULL,
    updated_at   DOUBLE PRECISION NOT NULL,
    position     BIGINT,
    operation_id TEXT,
    actor        TEXT,
    PRIMARY KEY (run_id, key)
);

-- Thread memory: one row per thread (its retention), and its messages in
-- order (idx 0, 1, 2, ...; a compaction replaces a prefix by one summary
-- message at the prefix's last idx, so the order stays the idx order).
CREATE TABLE memory_threads (
    tenant       TEXT NOT NULL,
    thread_id    TEXT NOT NULL,
    next_idx     BIGINT NOT NULL,
    created_at   DOUBLE PRECISION NOT NULL,
    updated_at   DOUBLE PRECISION NOT NULL,
    accessed_at  DOUBLE PRECISION NOT NULL,
    ttl          DOUBLE PRECISION,
    expires_at   DOUBLE PRECISION,
    PRIMARY KEY (tenant, thread_id)
);

CREATE INDEX memory_threads_expiry ON memory_threads (expires_at) WHERE expires_at IS NOT NULL;

CREATE TABLE memory_thread_messages (
    tenant       TEXT NOT NULL,
    thread_id    TEXT NOT NULL,
    idx          BIGINT NOT NULL,
    kind         TEXT NOT NULL,
    value        BYTEA,
    value_ref    TEXT,
    created_at   DOUBLE PRECISION NOT NULL,
    run_id       TEXT,
    position     BIGINT,
    operation_id TEXT,
    actor        TEXT,
    subject      TEXT,
    PRIMARY KEY (tenant, thread_id, idx)
);

CREATE INDEX memory_thread_messages_run ON memory_thread_messages (run_id) WHERE run_id IS NOT NULL;

-- Long-term memory: one row per (tenant, namespace, key); version counts puts (1, 2, ...).
CREATE TABLE memory_items (
    tenant       TEXT NOT NULL,
    namespace    TEXT NOT NULL,
    key          TEXT NOT NULL,
    value        BYTEA,
    value_ref    TEXT,
    metadata     JSONB,
    index_text   TEXT,
    version      BIGINT NOT NULL,
    created_at   DOUBLE PRECISION NOT NULL,
    updated_at   DOUBLE PRECISION NOT NULL,
    accessed_at  DOUBLE PRECISION NOT NULL,
    ttl          DOUBLE PRECISION,
    expires_at   DOUBLE PRECISION,
    run_id       TEXT,
    position     BIGINT,
    operation_id TEXT,
    actor        TEXT,
    tier         TEXT NOT NULL DEFAULT 'hot',
    subject      TEXT,
    PRIMARY KEY (tenant, namespace, key)
);

CREATE INDEX memory_items_expiry ON memory_items (expires_at) WHERE expires_at IS NOT NULL;

CREATE INDEX memory_items_run ON memory_items (run_id) WHERE run_id IS NOT NULL;

-- Work for the embedding worker: one row per item version whose index text must be embedded.
CREATE TABLE memory_outbox (
    id            BIGSERIAL PRIMARY KEY,
    tenant        TEXT NOT NULL,
    namespace     TEXT NOT NULL,
    key           TEXT NOT NULL,
    version       BIGINT NOT NULL,
    created_at    DOUBLE PRECISION NOT NULL,
    attempts      BIGINT NOT NULL DEFAULT 0,
    claimed_by    TEXT,
    claimed_until DOUBLE PRECISION,
    last_error    TEXT,
    UNIQUE (tenant, namespace, key, version)
);

CREATE INDEX memory_outbox_ready ON memory_outbox (claimed_until, id);

-- A run's memory goes with the run, however it is deleted (prune_runs).
CREATE FUNCTION memory_drop_run_memory() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM memory_run WHERE run_id = OLD.run_id;
    RETURN NULL;
END
$$;
CREATE TRIGGER memory_run_of_deleted_run AFTER DELETE ON runs
    FOR EACH ROW EXECUTE FUNCTION memory_drop_run_memory();

-- An offloaded value whose row goes (deleted, or replaced by a put) is
-- queued for collection: pruning deletes the artifact once nothing
-- references it (select_gc_page counts memory rows as references). SECURITY
-- DEFINER: a tenant's role deletes its memory but may not touch artifact_gc;
-- the function only queues a ref, which collection checks again anyway.
CREATE FUNCTION memory_queue_artifact() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF OLD.value_ref IS NOT NULL AND (TG_OP = 'DELETE' OR OLD.value_ref IS DISTINCT FROM NEW.value_ref) THEN
        -- only a stored artifact: a role cannot fill the queue with made-up refs
        INSERT INTO artifact_gc (ref, queued_at)
        SELECT OLD.value_ref, extract(epoch FROM clock_timestamp())
        WHERE EXISTS (SELECT 1 FROM artifacts WHERE ref = OLD.value_ref)
        ON CONFLICT (ref) DO NOTHING;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER memory_run_gc AFTER DELETE OR UPDATE OF value_ref ON memory_run
    FOR EACH ROW EXECUTE FUNCTION memory_queue_artifact();
CREATE TRIGGER memory_thread_messages_gc AFTER DELETE OR UPDATE OF value_ref ON memory_thread_messages
    FOR EACH ROW EXECUTE FUNCTION memory_queue_artifact();
CREATE TRIGGER memory_items_gc AFTER DELETE OR UPDATE OF value_ref ON memory_items
    FOR EACH ROW EXECUTE FUNCTION memory_queue_artifact();

-- Row-level security: the grant rule of runs and history (migration 0006).
-- Run memory is per-run: its run must be of the row's tenant (as history's,
-- migration 0008). Items and thread messages name the run that wrote them:
-- such a provenance must be a run of the row's tenant too, so no role can
-- file a memory as written by another tenant's run. A tenant's role may
-- delete its own memory (forgetting is the tenant's right).
ALTER TABLE memory_run ENABLE ROW LEVEL SECURITY;
ALTER TABLE memory_threads ENABLE ROW LEVEL SECURITY;
ALTER TABLE memory_thread_messages ENABLE ROW LEVEL SECURITY;
ALTER TABLE memory_items ENABLE ROW LEVEL SECURITY;
ALTER TABLE memory_outbox ENABLE ROW LEVEL SECURITY;

-- The collection queue's reference checks (select_gc_page): one index probe each.
CREATE INDEX memory_run_ref ON memory_run (value_ref) WHERE value_ref IS NOT NULL;
CREATE INDEX memory_thread_messages_ref ON memory_thread_messages (value_ref) WHERE value_ref IS NOT NULL;
CREATE INDEX memory_items_ref ON memory_items (value_ref) WHERE value_ref IS NOT NULL;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION memory_queue_artifact() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION memory_drop_run_memory() SET search_path = %I, pg_temp', current_schema());
END
$$;

-- artifacts: readable through a row the reader may see (runs, history,
-- mailbox, memory).
CREATE POLICY referenced ON artifacts FOR SELECT
    USING (EXISTS (SELECT 1 FROM runs AS r WHERE r.input_ref = artifacts.ref)
           OR EXISTS (SELECT 1 FROM runs AS r WHERE r.result_ref = artifacts.ref)
           OR EXISTS (SELECT 1 FROM history AS h WHERE h.payload_ref = artifacts.ref)
           OR EXISTS (SELECT 1 FROM mailbox AS m WHERE m.payload_ref = artifacts.ref)
           OR EXISTS (SELECT 1 FROM memory_run AS m WHERE m.value_ref = artifacts.ref)
           OR EXISTS (SELECT 1 FROM memory_thread_messages AS m WHERE m.value_ref = artifacts.ref)
           OR EXISTS (SELECT 1 FROM memory_items AS m WHERE m.value_ref = artifacts.ref));

-- Vectors of long-term memory items (issue 14): derived data, computed by
-- the embedding worker from memory_items.index_text after the item's put
-- committed (memory_outbox says what is due). One row per item: the vector
-- of `version`, made by `embedder` (vectors of different embedders are never
-- compared). `tier`: 'hot' holds `dims` float32 (little-endian); 'cold'
-- holds `dims` int8, each component `scale` times its int8 (a quarter of the
-- bytes; see cairn.store.vectorindex). Without pgvector the store scores
-- them exactly in the client; `vec` (pgvector's type, hot rows only) exists
-- only where the extension could be created when this migration ran.
CREATE TABLE memory_vectors (
    tenant      TEXT NOT NULL,
    namespace   TEXT NOT NULL,
    key         TEXT NOT NULL,
    version     BIGINT NOT NULL,
    embedder    TEXT NOT NULL,
    dims        BIGINT NOT NULL,
    tier        TEXT NOT NULL DEFAULT 'hot',
    embedding   BYTEA NOT NULL,
    scale       DOUBLE PRECISION,
    embedded_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (tenant, namespace, key)
);

-- pgvector where it can be had: the extension as it is (created by an
-- administrator before, in any schema, often `public`), else created here
-- (in this schema: the search_path), else none. The column's type names the
-- extension's schema, which is not on the store's search_path; the store
-- finds it from the column (query has_pgvector). No ANN index: see
-- docs/design.md ("pgvector: exact, no HNSW index"). The exact fallback reads
-- `embedding` either way.
DO $$
DECLARE
    home TEXT;
BEGIN
    BEGIN
        CREATE EXTENSION IF NOT EXISTS vector;
    EXCEPTION WHEN OTHERS THEN
        NULL;  -- not installed, or not ours to create: maybe an administrator did
    END;
    SELECT n.nspname INTO home
    FROM pg_extension AS e JOIN pg_namespace AS n ON n.oid = e.extnamespace
    WHERE e.extname = 'vector' AND has_schema_privilege(n.oid, 'USAGE');
    IF home IS NULL THEN
        RETURN;  -- no pgvector we may use: the exact fallback
    END IF;
    EXECUTE format('ALTER TABLE memory_vectors ADD COLUMN vec %I.vector', home);
    -- (how the column is stored: migration 0018)
END
$$;

-- Row-level security: the grant rule of runs and history (migration 0006).
-- A tenant's role reads, stores, re-tiers and drops only its own tenants'
-- vectors (its embedding worker and its deletions).
ALTER TABLE memory_vectors ENABLE ROW LEVEL SECURITY;

-- The cold tier of long-term memory item values (issue 14): the value of an
-- item nobody read or wrote for MemoryPolicy(cold_after=) seconds leaves its
-- hot row (memory_items.value becomes NULL, tier 'cold') for this table,
-- zlib-compressed (`codec`; `size` is the length of the value it restores).
-- One row per cold item, in the same database as the item, so a tiering pass
-- moves each value in one transaction (hot or cold, never lost nor both),
-- and deleting the item deletes its cold copy in the same statement (the
-- triggers below, whoever deletes it: an item, a namespace, a run's items,
-- a tenant, the TTL sweep). Reads join it (read-through); a put makes the
-- item hot again and drops the copy. Metadata and index text stay hot: the
-- search filter and the embedding worker read them in SQL.
CREATE TABLE memory_item_cold (
    tenant    TEXT NOT NULL,
    namespace TEXT NOT NULL,
    key       TEXT NOT NULL,
    codec     TEXT NOT NULL,
    size      BIGINT NOT NULL,
    value     BYTEA NOT NULL,
    PRIMARY KEY (tenant, namespace, key)
);

-- The copy goes with its item, and when the item turns hot again (a put, a
-- rewarm). The invoker's rights: the copy is of the same tenant as its item,
-- which the role could delete (row-level security below).
CREATE FUNCTION memory_drop_cold_copy() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM memory_item_cold
    WHERE tenant = OLD.tenant AND namespace = OLD.namespace AND key = OLD.key;
    RETURN NULL;
END
$$;
CREATE TRIGGER memory_items_cold_gone AFTER DELETE ON memory_items
    FOR EACH ROW WHEN (OLD.tier = 'cold') EXECUTE FUNCTION memory_drop_cold_copy();
CREATE TRIGGER memory_items_cold_rewarmed AFTER UPDATE OF tier ON memory_items
    FOR EACH ROW WHEN (OLD.tier = 'cold' AND NEW.tier = 'hot') EXECUTE FUNCTION memory_drop_cold_copy();

-- Row-level security: the grant rule of memory_items (0015).
ALTER TABLE memory_item_cold ENABLE ROW LEVEL SECURITY;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION memory_drop_cold_copy() SET search_path = %I, pg_temp', current_schema());
END
$$;

-- How memory_vectors keeps a hot row's vectors (issue 14, pgvector only).
-- A hot row holds its vector twice (1.5 kB each at 384 dimensions), over
-- the 2 kB at which PostgreSQL moves values out of line, and pgvector's type
-- defaults to EXTERNAL: every vector pgvector scans would be a TOAST fetch
-- (measured: no faster than the client's scan). So `vec` stays in the row
-- and the hot `embedding`, which only cooling reads, goes out of line. A
-- migration of its own, not an edit of 0016, so that a database that applied
-- 0016 gets it too; rows written before keep their storage until rewritten
-- (the next embedding or tiering of the item).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_attribute
               WHERE attrelid = 'memory_vectors'::regclass AND attname = 'vec' AND NOT attisdropped) THEN
        ALTER TABLE memory_vectors ALTER COLUMN vec SET STORAGE MAIN,
                                   ALTER COLUMN embedding SET STORAGE EXTERNAL;
    END IF;
END
$$;

-- The rows of memory_vectors the client scores where pgvector is installed
-- (issue 14): cold ones and hot ones without their pgvector copy yet. A
-- search reads them with search_without_pgvector after pgvector has scored
-- the rest; without this index that read was a second sequential scan of
-- the whole table (measured at 100,000 hot rows: it doubled a search).
-- Partial on the query's own condition, so it holds only those rows; keyed
-- like the primary key, so that a statement on one item's cold vector that
-- the planner sends through it (its condition implies the index's) is still
-- one seek: keyed by (tenant, dims) and with statistics taken while it was
-- empty, cooling 100,000 vectors took 28 ms a statement. Only where
-- migration 0016 added `vec` (without pgvector the client scores every
-- row, with search_candidates).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_attribute
               WHERE attrelid = 'memory_vectors'::regclass AND attname = 'vec' AND NOT attisdropped) THEN
        CREATE INDEX memory_vectors_client_scored ON memory_vectors (tenant, namespace, key)
            WHERE tier = 'cold' OR vec IS NULL;
    END IF;
END
$$;

-- The ids of schedule ticks are reserved (0020) for their own tenant (see
-- cairn/store/runids.py). Run ids are one namespace for every tenant and a
-- tick's id is predictable (schedule:<tenant>:<name>:<UTC time>), so a
-- tenant's role could insert a run under a tick id of another tenant (or
-- rename one of its own runs to it) before the tick is due, and the tick
-- would start nothing. An id beginning 'schedule:' must go on with the row's
-- own tenant, percent-encoded as the scheduler encodes it, then ':'. A CHECK
-- binds every role, the owner's included, and costs a prefix test on other
-- ids. NOT VALID: rows written before this migration are not re-checked (a
-- squatter's earlier row must not stop the upgrade; the tick it took was
-- skipped and logged, and every later one is protected).
CREATE FUNCTION url_quote(part TEXT) RETURNS TEXT
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT COALESCE(string_agg(
        CASE WHEN byte BETWEEN 48 AND 57 OR byte BETWEEN 65 AND 90 OR byte BETWEEN 97 AND 122
                  OR byte IN (45, 46, 95, 126)
             THEN chr(byte)
             ELSE '%' || upper(lpad(to_hex(byte), 2, '0')) END, '' ORDER BY i), '')
    FROM (SELECT convert_to(part, 'UTF8') AS bytes) AS encoded,
         LATERAL generate_series(0, length(encoded.bytes) - 1) AS i,
         LATERAL get_byte(encoded.bytes, i) AS byte
$$;

ALTER TABLE runs ADD CONSTRAINT runs_schedule_ids
    CHECK (NOT starts_with(run_id, 'schedule:')
           OR starts_with(run_id, 'schedule:' || url_quote(tenant) || ':')) NOT VALID;

-- A tenant's own ids (0022): ids beginning 'tenant:' go on with the row's own
-- tenant, encoded as for tick ids (cairn/store/runids.py).
ALTER TABLE runs ADD CONSTRAINT runs_tenant_ids
    CHECK (NOT starts_with(run_id, 'tenant:')
           OR starts_with(run_id, 'tenant:' || url_quote(tenant) || ':')) NOT VALID;

-- A tenant's own share of a shared queue (0023, rates 0024): at most
-- concurrency of its runs of the queue running, and at most rate_limit
-- claims per rate_period (a token bucket: tokens as of refilled_at, NULL:
-- full), on top of the installation's limits. Written by the owner; a
-- tenant's role reads and locks (FOR UPDATE) its own rows only; its claims
-- spend its bucket through admit_claim (0027), the owner's through
-- spend_share_tokens.
CREATE TABLE queue_shares (
    queue       TEXT NOT NULL,
    tenant      TEXT NOT NULL CHECK (tenant <> ''),
    concurrency BIGINT CHECK (concurrency >= 1),
    updated_at  DOUBLE PRECISION NOT NULL,
    rate_limit  BIGINT CHECK (rate_limit >= 1),
    rate_period DOUBLE PRECISION CHECK (rate_period > 0),
    rate_burst  BIGINT CHECK (rate_burst >= 1),
    tokens      DOUBLE PRECISION,
    refilled_at DOUBLE PRECISION,
    PRIMARY KEY (queue, tenant),
    CONSTRAINT queue_shares_whole_rate
        CHECK ((rate_limit IS NULL) = (rate_period IS NULL) AND (rate_burst IS NULL OR rate_limit IS NOT NULL)),
    CONSTRAINT queue_shares_not_empty CHECK (concurrency IS NOT NULL OR rate_limit IS NOT NULL)
);

ALTER TABLE queue_shares ENABLE ROW LEVEL SECURITY;
CREATE POLICY read_own_shares ON queue_shares FOR SELECT
    USING (tenant = ANY ((SELECT cairn_tenants())::TEXT[]));
CREATE POLICY lock_own_shares ON queue_shares FOR UPDATE
    USING (tenant = ANY ((SELECT cairn_tenants())::TEXT[]))
    WITH CHECK (false);

INSERT INTO tenant_privileges (object_name, privileges) VALUES ('queue_shares', 'SELECT, UPDATE (updated_at)');

-- Spend the share buckets of the owner's claims (0024; 0027 as
-- spend_queue_tokens): counts[i] tokens of tenants[i]'s share of queues[i].
CREATE FUNCTION spend_share_tokens(queues TEXT[], tenants TEXT[], counts BIGINT[], at DOUBLE PRECISION)
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

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION spend_share_tokens(TEXT[], TEXT[], BIGINT[], DOUBLE PRECISION) '
                   'SET search_path = %I, pg_temp', current_schema());
END
$$;

-- Queue admission binds a tenant's own role (0027): a run that a role under
-- row-level security moves to running (inserted so, updated to it, or moved
-- to another queue or tenant while running) is admitted when its
-- transaction commits, by admit_claim: the queue's and the tenant's
-- concurrency (its share's included) are checked under the claim's locks,
-- and one token is taken from each bucket the run is subject to. The owner's
-- claims are not re-checked; it spends through the functions above. See
-- migrations/0027_claim_admission.sql.
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

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION admit_claim() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION bucket_take(DOUBLE PRECISION, DOUBLE PRECISION, DOUBLE PRECISION, '
                   'DOUBLE PRECISION, DOUBLE PRECISION) SET search_path = %I, pg_temp', current_schema());
END
$$;

-- LangGraph checkpoints (issue 24, cairn.langgraph.CairnSaver). A LangGraph
-- thread is not a Cairn run: its checkpoints are written by LangGraph's loop
-- in any process, so they have tables of their own, keyed by the saver's
-- tenant (another tenant's thread is simply absent). Values are content
-- addressed per thread (lg_values, digest = 64 bits of BLAKE2b of the
-- serializer's type and bytes): a channel's version (lg_blobs) and a pending
-- write (lg_writes) hold packed digests (refs, 8 bytes each), so a message
-- written by a node and then appended to the list channel is stored once,
-- and a list that grew stores only its new items (kind 'list' with a base
-- version; depth counts the bases below it). See docs/design.md
-- "LangGraph checkpointer".
CREATE TABLE lg_checkpoints (
    tenant          TEXT NOT NULL,
    thread_id       TEXT NOT NULL,
    ns              TEXT NOT NULL,
    checkpoint_id   BYTEA NOT NULL,  -- packed by lg_id_key, in the order of its text's bytes (0041, 0050)
    parent_id       BYTEA,  -- packed: lg_id_pack, read with lg_id_text (0049)
    run_id          TEXT,
    checkpoint_kind TEXT,   -- NULL: 'zd1:msgpack' (0048)
    checkpoint      BYTEA NOT NULL,
    metadata_kind   TEXT,   -- NULL: 'msgpack' (0048); '': 'zd1:msgpack' (queries.sql)
    metadata        BYTEA NOT NULL,
    writes          BYTEA,  -- its pending writes, folded in by the next put (0043)
    names           TEXT,   -- its channel versions in lg_blobs, "channel<US>version" pairs (0045)
    refs            BYTEA,  -- packed digests of the values it names: inline, folded writes' (0045)
    PRIMARY KEY (tenant, thread_id, ns, checkpoint_id)
);

-- What lg_read_one reads of a row (cairn.store.checkpointsql): lg_names, the
-- channel versions of names; lg_digests, the digests packed in refs
-- (checkpointsql.unpack_refs: signed 64-bit little-endian; the last byte
-- shifted by 56 wraps into the sign, no overflow). STRICT keeps them from
-- being inlined, so the planner takes ROWS as their size: inlined, it took
-- generate_series's default of 1,000 rows a call, costed the read at 4e8 and
-- JIT-compiled it (1.4 s). Builtins are named with their schema.
CREATE FUNCTION lg_names(names TEXT) RETURNS TABLE (channel TEXT, version TEXT)
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE ROWS 2 AS $$
    SELECT n[2 * k - 1], n[2 * k]
    FROM pg_catalog.string_to_array(names, pg_catalog.chr(31)) AS n,
         pg_catalog.generate_series(1, pg_catalog.cardinality(n) / 2) AS k
$$;

CREATE FUNCTION lg_digests(refs BYTEA) RETURNS SETOF BIGINT
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE ROWS 4 AS $$
    SELECT (pg_catalog.get_byte(refs, o)::bigint
            | (pg_catalog.get_byte(refs, o + 1)::bigint << 8)
            | (pg_catalog.get_byte(refs, o + 2)::bigint << 16)
            | (pg_catalog.get_byte(refs, o + 3)::bigint << 24)
            | (pg_catalog.get_byte(refs, o + 4)::bigint << 32)
            | (pg_catalog.get_byte(refs, o + 5)::bigint << 40)
            | (pg_catalog.get_byte(refs, o + 6)::bigint << 48)
            | (pg_catalog.get_byte(refs, o + 7)::bigint << 56))
    FROM pg_catalog.generate_series(0, pg_catalog.length(refs) - 8, 8) AS o
$$;

-- A parent id packed (0049): a canonical lowercase UUID as 0x01 and its 16 bytes,
-- any other id as 0x00 and its bytes.
CREATE FUNCTION lg_id_pack(id TEXT) RETURNS BYTEA
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN (id COLLATE "C") OPERATOR(pg_catalog.~)
                     '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                THEN '\x01'::pg_catalog.bytea OPERATOR(pg_catalog.||)
                     pg_catalog.decode(pg_catalog.replace(id, '-', ''), 'hex')
                ELSE '\x00'::pg_catalog.bytea OPERATOR(pg_catalog.||)
                     pg_catalog.convert_to(id, 'UTF8') END
$$;

-- An id packed so that keys order as their text does in "C" order (its bytes;
-- 0041): a canonical UUID as 0x01 and its 16 bytes (hex digits and dashes at
-- fixed places order as the bytes they spell); any other id below every UUID
-- as 0x00 and its bytes; any other id as 0x01, the 16 bytes of the greatest
-- UUID below it, then its bytes. Between two UUIDs u < v, an id s (u < s < v)
-- packs as u's bytes and more: after u's key, before v's; two such ids in one
-- gap order by their bytes. Their UTF-8 bytes, whatever the database's
-- encoding: the order Python compares ids in. cairn.store.checkpointsql
-- packs alike (pack_id_key, pack_id): the statements take ids packed.
CREATE FUNCTION lg_id_key_other(id TEXT) RETURNS BYTEA
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE AS $$
DECLARE
    b BYTEA := pg_catalog.convert_to(id, 'UTF8');
    n INTEGER := pg_catalog.length(b);
    p INTEGER := 0;
    k INTEGER;
    c INTEGER;
    below INTEGER;
BEGIN
    -- p: how many of its first bytes spell the start of a canonical UUID
    WHILE p < 36 AND p < n LOOP
        c := pg_catalog.get_byte(b, p);
        EXIT WHEN NOT CASE WHEN p IN (8, 13, 18, 23) THEN c = 45
                           ELSE c BETWEEN 48 AND 57 OR c BETWEEN 97 AND 102 END;
        p := p + 1;
    END LOOP;
    IF p = 36 THEN  -- a UUID and more: the greatest UUID below it is that UUID
        RETURN '\x01'::BYTEA || pg_catalog.decode(pg_catalog.replace(
            pg_catalog.encode(pg_catalog.substr(b, 1, 36), 'escape'), '-', ''), 'hex') || b;
    END IF;
    -- the greatest UUID below it first differs from it at some k <= p, by a smaller character
    k := p;
    WHILE k >= 0 LOOP
        IF k < n THEN
            c := pg_catalog.get_byte(b, k);
            below := CASE WHEN k IN (8, 13, 18, 23) THEN CASE WHEN c > 45 THEN 45 END
                          WHEN c > 102 THEN 102 WHEN c > 97 THEN c - 1 WHEN c > 57 THEN 57
                          WHEN c > 48 THEN c - 1 END;
            IF below IS NOT NULL THEN
                RETURN '\x01'::BYTEA || pg_catalog.decode(pg_catalog.replace(
                    pg_catalog.encode(pg_catalog.substr(b, 1, k), 'escape') || pg_catalog.chr(below)
                    || pg_catalog.substr('ffffffff-ffff-ffff-ffff-ffffffffffff', k + 2), '-', ''), 'hex') || b;
            END IF;
        END IF;
        k := k - 1;
    END LOOP;
    RETURN '\x00'::BYTEA || b;  -- below every UUID
END
$$;

CREATE FUNCTION lg_id_key(id TEXT) RETURNS BYTEA
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN (id COLLATE "C") OPERATOR(pg_catalog.~)
                     '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                THEN '\x01'::pg_catalog.bytea OPERATOR(pg_catalog.||)
                     pg_catalog.decode(pg_catalog.replace(id, '-', ''), 'hex')
                ELSE lg_id_key_other(id) END
$$;

-- the text lg_id_pack or lg_id_key packed (anything else, which they never write, reads as NULL).
-- STABLE (convert_from is) and not STRICT, so a statement inlines it (IMMUTABLE or STRICT, it ran
-- as a call of its own: ~50 us a column a statement); lg_id_pack and lg_id_key likewise.
CREATE FUNCTION lg_id_text(packed BYTEA) RETURNS TEXT
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN pg_catalog.substr(packed, 1, 1) OPERATOR(pg_catalog.=) '\x01'::pg_catalog.bytea
                THEN CASE WHEN pg_catalog.length(packed) = 17
                          THEN pg_catalog.encode(pg_catalog.substr(packed, 2), 'hex')::pg_catalog.uuid::pg_catalog.text
                          WHEN pg_catalog.length(packed) > 17
                          THEN pg_catalog.convert_from(pg_catalog.substr(packed, 18), 'UTF8') END
                WHEN pg_catalog.substr(packed, 1, 1) OPERATOR(pg_catalog.=) '\x00'::pg_catalog.bytea
                THEN pg_catalog.convert_from(pg_catalog.substr(packed, 2), 'UTF8') END
$$;

-- delete_for_runs: a tenant's checkpoints by run id (migration 0028; only those with one: 0043)
CREATE INDEX lg_checkpoints_run ON lg_checkpoints (tenant, run_id) WHERE run_id IS NOT NULL;

CREATE TABLE lg_blobs (
    tenant    TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    ns        TEXT NOT NULL,
    channel   TEXT NOT NULL,
    version   TEXT NOT NULL,
    kind      TEXT NOT NULL CHECK (kind IN ('value', 'list', 'empty')),
    base      TEXT,
    depth     BIGINT NOT NULL,
    refs      BYTEA NOT NULL,
    PRIMARY KEY (tenant, thread_id, ns, channel, version)
);
-- a long delta of the version spine stays in its row, not in TOAST (0046)
ALTER TABLE lg_blobs ALTER COLUMN refs SET STORAGE MAIN;

CREATE TABLE lg_writes (
    tenant        TEXT NOT NULL,
    thread_id     TEXT NOT NULL,
    ns            TEXT NOT NULL,
    checkpoint_id BYTEA NOT NULL,  -- lg_id_key (0050)
    task_id       TEXT NOT NULL,
    idx           BIGINT NOT NULL,
    channel       TEXT NOT NULL,
    task_path     TEXT NOT NULL,
    kind          TEXT NOT NULL CHECK (kind IN ('value', 'list')),
    refs          BYTEA NOT NULL,
    PRIMARY KEY (tenant, thread_id, ns, checkpoint_id, task_id, idx)
);

CREATE TABLE lg_values (
    tenant    TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    digest    BIGINT NOT NULL,
    kind      TEXT,  -- NULL: 'zd1:msgpack' (0048)
    data      BYTEA NOT NULL,
    PRIMARY KEY (tenant, thread_id, digest)
);

-- Row-level security: the grant rule of the memory tables (0015).
ALTER TABLE lg_checkpoints ENABLE ROW LEVEL SECURITY;
ALTER TABLE lg_blobs ENABLE ROW LEVEL SECURITY;
ALTER TABLE lg_writes ENABLE ROW LEVEL SECURITY;
ALTER TABLE lg_values ENABLE ROW LEVEL SECURITY;

-- Who writes a thread (fencing): the saver that took it (owner, a random id
-- per CairnSaver) and how many times it changed hands (epoch). A saver takes
-- a thread on its first write to it; a saver that held it and lost it to
-- another is refused every write after (cairn.errors.ThreadTaken), so two
-- processes driving one thread never fork its chain of checkpoints.
CREATE TABLE lg_threads (
    tenant    TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    owner     TEXT NOT NULL,
    epoch     BIGINT NOT NULL,
    PRIMARY KEY (tenant, thread_id),
    collected BIGINT NOT NULL DEFAULT 0  -- prunes and deletions that collected its rows (0052)
);
ALTER TABLE lg_threads ENABLE ROW LEVEL SECURITY;

-- LangGraph's fence checked in the server (0051; the collection count, 0052; a row owned by
-- nobody, made by a collection, 0053): the thread's lock, its holder and the rule of
-- checkpointsql.hold_rule in one statement; SQLSTATE LGT01 when taken, LGS01 when the
-- writer's memory of the thread is stale.
CREATE FUNCTION lg_hold(p_tenant TEXT, p_thread TEXT, p_owner TEXT, p_epoch BIGINT, p_lease BIGINT,
                        p_collected BIGINT, OUT held BIGINT, OUT collections BIGINT)
LANGUAGE plpgsql AS $$
DECLARE
    held_owner TEXT;
    held_epoch BIGINT;
    held_collected BIGINT;
    has_row BOOLEAN;
    holding BOOLEAN;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(p_tenant || '/' || p_thread, 0)),
            set_config('enable_seqscan', 'off', true);
    SELECT owner, epoch, collected INTO held_owner, held_epoch, held_collected FROM lg_threads
    WHERE tenant = p_tenant AND thread_id = p_thread;
    has_row := FOUND;
    -- a row owned by nobody ('') was made by a collection: it counts, nobody holds the thread
    holding := has_row AND held_owner <> '';
    IF p_lease IS NOT NULL THEN
        IF holding AND held_epoch > p_lease THEN
            RAISE EXCEPTION 'LangGraph thread % is held by a later lease', p_thread
                USING ERRCODE = 'LGT01', DETAIL = held_epoch::TEXT;
        END IF;
    ELSIF holding AND held_owner <> p_owner AND p_epoch IS NOT NULL THEN
        RAISE EXCEPTION 'LangGraph thread % was taken by another saver', p_thread
            USING ERRCODE = 'LGT01', DETAIL = held_epoch::TEXT;
    END IF;
    collections := coalesce(held_collected, 0);
    IF p_collected IS NOT NULL AND NOT holding AND p_epoch IS NOT NULL THEN
        RAISE EXCEPTION 'LangGraph thread % was deleted since this writer last wrote it', p_thread
            USING ERRCODE = 'LGS01', DETAIL = 'deleted';
    END IF;
    -- a first write expects the count it read, or -1 if the thread had no holder row then
    IF p_collected IS NOT NULL AND p_collected <> -1 AND NOT has_row AND p_epoch IS NULL THEN
        RAISE EXCEPTION 'LangGraph thread % was deleted since this writer read it', p_thread
            USING ERRCODE = 'LGS01', DETAIL = 'deleted';
    END IF;
    IF p_collected IS NOT NULL AND has_row AND held_collected <> greatest(p_collected, 0) THEN
        RAISE EXCEPTION 'LangGraph thread % was collected since this writer last wrote it', p_thread
            USING ERRCODE = 'LGS01', DETAIL = held_collected::TEXT;
    END IF;
    IF p_lease IS NOT NULL THEN
        held := p_lease;
        IF holding AND held_owner = p_owner AND held_epoch = p_lease THEN
            RETURN;
        END IF;
    ELSIF holding THEN
        IF held_owner = p_owner THEN
            held := held_epoch;
            RETURN;
        END IF;
        held := held_epoch + 1;
    ELSE
        held := 1;
    END IF;
    INSERT INTO lg_threads (tenant, thread_id, owner, epoch) VALUES (p_tenant, p_thread, p_owner, held)
    ON CONFLICT (tenant, thread_id) DO UPDATE SET owner = excluded.owner, epoch = excluded.epoch;
END
$$;

-- A put sent in one message folds the pending writes it expects, or refuses itself
-- (SQLSTATE LGF01) and is sent again in two (0051).
CREATE FUNCTION lg_fold_as_sent(mismatched BIGINT) RETURNS BIGINT LANGUAGE plpgsql AS $$
BEGIN
    IF mismatched > 0 THEN
        RAISE EXCEPTION 'the pending writes to fold are not those the put sent folded'
            USING ERRCODE = 'LGF01';
    END IF;
    RETURN mismatched;
END
$$;

-- Encryption at rest: each tenant's data keys, wrapped by a KEK (0029, cairn.store.sealed).
CREATE TABLE data_keys (
    tenant     TEXT NOT NULL,
    version    BIGINT NOT NULL,
    kek_id     TEXT NOT NULL,
    wrapped    BYTEA NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    subject    TEXT,
    PRIMARY KEY (tenant, version)
);

-- Row-level security: the grant rule of the memory tables (0015).
ALTER TABLE data_keys ENABLE ROW LEVEL SECURITY;

-- Workspace objects (issue 27, cairn.workspace): the blobs, chunk lists and
-- trees of runs' workspace snapshots, content addressed per tenant (oid:
-- BLAKE2b-256 hex of the object's kind and plain bytes; data: its stored,
-- compressed form). Two tenants' identical files are two rows: whether an
-- object exists says nothing across tenants. A snapshot's root id is
-- recorded in the detail of the step's journal entry, not here; an object
-- is written by the run's lease holder (fenced, the tenant read from the
-- run row) before the entry that names its root.
CREATE TABLE workspace_objects (
    tenant    TEXT NOT NULL,
    oid       TEXT NOT NULL,
    data      BYTEA NOT NULL,
    stored_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (tenant, oid)
);
ALTER TABLE workspace_objects ALTER COLUMN data SET STORAGE EXTERNAL;  -- compressed already

-- Row-level security: the grant rule of the memory tables (0015).
ALTER TABLE workspace_objects ENABLE ROW LEVEL SECURITY;

-- The role and token a run was started with (0033, cairn.engine.access).
CREATE FUNCTION runs_started_with_checked() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND (NEW.started_role IS DISTINCT FROM OLD.started_role
                             OR NEW.started_token IS DISTINCT FROM OLD.started_token) THEN
        RAISE EXCEPTION 'the role and token a run was started with never change'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NEW.started_role = 'installation' AND row_security_active('runs') THEN
        RAISE EXCEPTION 'a tenant''s role cannot start a run as installation'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER runs_started_with_checked
    BEFORE INSERT OR UPDATE OF started_role, started_token ON runs
    FOR EACH ROW EXECUTE FUNCTION runs_started_with_checked();

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION runs_started_with_checked() SET search_path = %I, pg_temp',
                   current_schema());
END
$$;

-- Signed checkpoints of a tenant's run heads (0032; issue 26, cairn.audit): the
-- Merkle root over every run's last (seq, link), signed with Ed25519, and the
-- record as exported to an anchor (JSON).
CREATE TABLE audit_checkpoints (
    tenant TEXT NOT NULL,
    id     BIGINT NOT NULL,
    at     DOUBLE PRECISION NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (tenant, id)
);

-- The runs with entries before the audit chain (0022 / 0031), and their last
-- such entry: the verifier accepts an entry without a link only there.
CREATE TABLE audit_legacy (
    run_id   TEXT PRIMARY KEY,
    last_seq BIGINT NOT NULL
);
-- Artifacts at addresses that survive re-encryption (issue 25). With
-- encryption at rest an artifact is stored under a keyed hash of its
-- content, one key per tenant (cairn.store.sealedartifacts), not under the
-- hash of its sealed bytes: re-encrypting it after a key rotation rewrites
-- its bytes in place, and every row naming it (history.payload_ref, which
-- the audit chain's links cover, among them) stays as it is. The bytes are
-- authenticated by their envelope, bound to that name, not by the name.
--
-- A tenant's role stores such an artifact only through this function, which
-- adds a name never taken and otherwise only refreshes when the bytes were
-- last stored: a role cannot overwrite an artifact. Rewriting one
-- (re-encryption) is the owner's alone. "at" is capped as in store_artifact.
CREATE FUNCTION store_artifact_at(name TEXT, content BYTEA, at DOUBLE PRECISION) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
DECLARE
    stamp DOUBLE PRECISION := LEAST(at, extract(epoch FROM clock_timestamp()));
BEGIN
    IF name IS NULL OR name !~ '^[0-9a-f]{64}$' THEN
        RAISE EXCEPTION 'malformed artifact name' USING ERRCODE = '22023';
    END IF;
    INSERT INTO artifact_gc (ref, queued_at) VALUES (name, stamp) ON CONFLICT (ref) DO NOTHING;
    INSERT INTO artifacts (ref, data, touched_at) VALUES (name, content, stamp)
    ON CONFLICT (ref) DO UPDATE SET touched_at = GREATEST(artifacts.touched_at, excluded.touched_at);
END
$$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION store_artifact_at(TEXT, BYTEA, DOUBLE PRECISION) SET search_path = %I, pg_temp',
                   current_schema());
END
$$;

-- Erasure (0037; issue 26, cairn.api.erasure): the subject indexes, its run's
-- subject fixed, one live key per subject, and the erasure records (the owner's).
CREATE INDEX runs_subject ON runs (tenant, subject) WHERE subject IS NOT NULL;

CREATE FUNCTION runs_subject_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.subject IS DISTINCT FROM OLD.subject THEN
        RAISE EXCEPTION 'the subject of a run never changes';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER runs_subject_fixed BEFORE UPDATE OF subject ON runs
    FOR EACH ROW EXECUTE FUNCTION runs_subject_fixed();

CREATE INDEX memory_items_subject ON memory_items (tenant, subject) WHERE subject IS NOT NULL;
CREATE INDEX memory_thread_messages_subject ON memory_thread_messages (tenant, subject)
    WHERE subject IS NOT NULL;

CREATE UNIQUE INDEX data_keys_live_subject ON data_keys (tenant, subject)
    WHERE subject IS NOT NULL AND kek_id <> 'erased';

CREATE TABLE erasures (
    id          TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    scope       TEXT NOT NULL CHECK (scope IN ('subject', 'thread', 'tenant')),
    digest      TEXT NOT NULL,
    actor       TEXT NOT NULL,
    started_at  DOUBLE PRECISION NOT NULL,
    finished_at DOUBLE PRECISION,
    counts      TEXT,
    -- keyed digests of the runs it deleted (JSON): an anchored checkpoint
    -- that names one verifies it as erased, not as a run cut out
    runs        TEXT
);

CREATE INDEX erasures_target ON erasures (tenant, scope, digest);

-- Archived runs (0038; issue 26 item 5, cairn.store.archive): the run row
-- stays, its other rows live in one archive object (ref) until restored.
CREATE TABLE run_archives (
    run_id       TEXT PRIMARY KEY,
    tenant       TEXT NOT NULL,
    ref          TEXT NOT NULL,
    entries      BIGINT NOT NULL,
    last_seq     BIGINT NOT NULL,
    last_link    BYTEA,
    hot_bytes    BIGINT NOT NULL,
    stored_bytes BIGINT NOT NULL,
    archived_at  DOUBLE PRECISION NOT NULL,
    actor        TEXT,
    -- the first and last entry's time (0047; NULL: archived before it), for the audit log's pages
    first_at     DOUBLE PRECISION,
    last_at      DOUBLE PRECISION
);
CREATE INDEX run_archives_ref ON run_archives (ref);
CREATE INDEX run_archives_first_at ON run_archives (tenant, first_at, last_at, run_id COLLATE "C");
CREATE INDEX run_archives_last_at ON run_archives (tenant, last_at, first_at, run_id COLLATE "C");

CREATE TABLE run_archive_refs (
    run_id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    ref    TEXT NOT NULL,
    PRIMARY KEY (run_id, ref)
);
CREATE INDEX run_archive_refs_ref ON run_archive_refs (ref);

ALTER TABLE run_archives ENABLE ROW LEVEL SECURITY;
ALTER TABLE run_archive_refs ENABLE ROW LEVEL SECURITY;

-- An archived run cannot be mutated: its run row cannot change, whoever
-- writes (this trigger; restore it first). Every store write of the run's
-- other rows is fenced on the run being running (a lease holder's) or
-- changes the run row in its transaction (an operator's), so none reaches an
-- archived run. No trigger on history itself: it would cost every journaled
-- step (~15 us on SQLite, bench/archive.py --triggers) to stop writers
-- outside the store, whom the audit chain catches.
CREATE FUNCTION archived_run_fixed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM run_archives WHERE run_id = OLD.run_id) THEN
        RAISE EXCEPTION 'the run is archived: restore it before changing it' USING ERRCODE = '55000';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER runs_archived_fixed BEFORE UPDATE ON runs
    FOR EACH ROW EXECUTE FUNCTION archived_run_fixed();

-- Deleting a run (pruning) deletes its archive rows; prune_runs queues the
-- archive object and the refs for collection first.
CREATE FUNCTION run_archives_drop() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM run_archives WHERE run_id = OLD.run_id;
    DELETE FROM run_archive_refs WHERE run_id = OLD.run_id;
    RETURN NULL;
END
$$;
CREATE TRIGGER run_archives_of_deleted_run AFTER DELETE ON runs
    FOR EACH ROW EXECUTE FUNCTION run_archives_drop();

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION archived_run_fixed() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION run_archives_drop() SET search_path = %I, pg_temp', current_schema());
END
$$;

-- An archive and the artifacts it references are readable through its row (0038).
DROP POLICY referenced ON artifacts;
CREATE POLICY referenced ON artifacts FOR SELECT
    USING (EXISTS (SELECT 1 FROM runs AS r WHERE r.input_ref = artifacts.ref)
           OR EXISTS (SELECT 1 FROM runs AS r WHERE r.result_ref = artifacts.ref)
           OR EXISTS (SELECT 1 FROM history AS h WHERE h.payload_ref = artifacts.ref)
           OR EXISTS (SELECT 1 FROM mailbox AS m WHERE m.payload_ref = artifacts.ref)
           OR EXISTS (SELECT 1 FROM memory_run AS m WHERE m.value_ref = artifacts.ref)
           OR EXISTS (SELECT 1 FROM memory_thread_messages AS m WHERE m.value_ref = artifacts.ref)
           OR EXISTS (SELECT 1 FROM memory_items AS m WHERE m.value_ref = artifacts.ref)
           OR EXISTS (SELECT 1 FROM run_archives AS a WHERE a.ref = artifacts.ref)
           OR EXISTS (SELECT 1 FROM run_archive_refs AS a WHERE a.ref = artifacts.ref));

-- The retention controller (0036; issue 26 part 3, cairn.store.retention): the
-- policies per data class, the controller's lease, and the record of each
-- run deleted (its audit record once its history is gone).
--
-- A policy keeps one data class of one tenant's runs (or '*': every tenant
-- without its own) of one workflow (or '*') for `keep` seconds (NULL:
-- forever); the most specific policy that matches decides. `updated_by` is
-- the actor who set it.
CREATE TABLE retention_policies (
    tenant     TEXT NOT NULL CHECK (tenant <> ''),
    workflow   TEXT NOT NULL CHECK (workflow <> ''),
    data_class TEXT NOT NULL,
    keep       DOUBLE PRECISION CHECK (keep IS NULL OR keep >= 0),
    updated_at DOUBLE PRECISION NOT NULL,
    updated_by TEXT NOT NULL,
    PRIMARY KEY (tenant, workflow, data_class)
);

-- A tenant's role reads its own tenants' policies and the installation's
-- defaults ('*'), and writes only its own tenants' (the '*' rows are the owner's).
ALTER TABLE retention_policies ENABLE ROW LEVEL SECURITY;
CREATE POLICY read_own_policies ON retention_policies FOR SELECT
    USING (tenant = '*' OR tenant = ANY ((SELECT cairn_tenants())::TEXT[]));
CREATE POLICY insert_own_policies ON retention_policies FOR INSERT
    WITH CHECK (tenant = ANY ((SELECT cairn_tenants())::TEXT[]));
CREATE POLICY update_own_policies ON retention_policies FOR UPDATE
    USING (tenant = ANY ((SELECT cairn_tenants())::TEXT[]))
    WITH CHECK (tenant = ANY ((SELECT cairn_tenants())::TEXT[]));
CREATE POLICY delete_own_policies ON retention_policies FOR DELETE
    USING (tenant = ANY ((SELECT cairn_tenants())::TEXT[]));

INSERT INTO tenant_privileges (object_name, privileges) VALUES
    ('retention_policies', 'SELECT, INSERT, UPDATE, DELETE');

-- Who enforces the policies now: one controller at a time. Every deletion
-- checks, in its own transaction, that its holder still holds the lease at
-- its epoch (a takeover bumps the epoch), so a stale controller deletes
-- nothing. The owner's alone (the controller deletes as the owner).
CREATE TABLE retention_lease (
    name       TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,
    epoch      BIGINT NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL
);

-- A run deleted (by retention or prune), written in the transaction that
-- deletes it: its tenant, workflow, when it finished, its last entry and that
-- entry's audit link (the head an anchor may have signed), when and by whom.
-- The owner's alone.
CREATE TABLE retention_deleted (
    run_id      TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    workflow    TEXT NOT NULL,
    finished_at DOUBLE PRECISION NOT NULL,
    last_seq    BIGINT NOT NULL,
    head        BYTEA,
    deleted_at  DOUBLE PRECISION NOT NULL,
    deleted_by  TEXT NOT NULL
);

CREATE INDEX retention_deleted_finished ON retention_deleted (finished_at);

-- The operator log (0042; issue 26, cairn/store/oplog.py): one append-only record
-- per operator mutation of a non-run object (tokens, queues, schedules, keys,
-- bundles, retention policies...), written in the mutation's transaction and
-- hash-chained per tenant with the audit chain's link function. tenant '' is
-- the installation's own objects (queue limits, bundles).
--
-- A tenant's role may read and append its own tenant's records only (row
-- security, INSERT without UPDATE or DELETE): it can neither rewrite nor
-- remove a record, and one it appends behind the store's back with a forged
-- link fails `cairn audit verify`.
CREATE TABLE operator_log (
    tenant    TEXT NOT NULL,
    seq       BIGINT NOT NULL,
    at        DOUBLE PRECISION NOT NULL,
    kind      TEXT NOT NULL,
    object_id TEXT NOT NULL,
    action    TEXT NOT NULL,
    actor     TEXT NOT NULL,
    auth      TEXT NOT NULL,
    change    TEXT NOT NULL,
    digest    BYTEA NOT NULL,
    link      BYTEA NOT NULL,
    PRIMARY KEY (tenant, seq)
);
-- The operator log by tenant in time order, for the audit log's pages (0047).
CREATE INDEX operator_log_at ON operator_log (tenant, at, seq);
ALTER TABLE operator_log ENABLE ROW LEVEL SECURITY;
INSERT INTO tenant_privileges (object_name, privileges) VALUES ('operator_log', 'SELECT, INSERT');
SELECT grant_privileges('operator_log');

-- The tenant boundary of every tenant table (0044): one policy each, created
-- here in one loop so that the rule (cairn_tenants) is called the same way
-- everywhere. A table added later goes into its list here, and its migration
-- creates the same policy.
DO $$
DECLARE
    rule CONSTANT TEXT := 'tenant = ANY ((SELECT cairn_tenants())::TEXT[])';
    of_run CONSTANT TEXT := 'EXISTS (SELECT 1 FROM runs AS r WHERE r.run_id = %1$I.run_id AND r.tenant = %1$I.tenant)';
    tbl TEXT;
BEGIN
    -- rows of a tenant
    FOREACH tbl IN ARRAY ARRAY['runs', 'api_tokens', 'schedules', 'memory_threads', 'memory_outbox', 'memory_vectors',
                               'memory_item_cold', 'lg_checkpoints', 'lg_blobs', 'lg_writes', 'lg_values',
                               'lg_threads', 'data_keys', 'workspace_objects', 'operator_log'] LOOP
        EXECUTE format('CREATE POLICY tenant_isolation ON %I USING (%s) WITH CHECK (%s)', tbl, rule, rule);
    END LOOP;
    -- rows of a run: written only for a run of the same tenant
    FOREACH tbl IN ARRAY ARRAY['history', 'mailbox', 'approvals', 'memory_run', 'run_archives', 'run_archive_refs'] LOOP
        EXECUTE format('CREATE POLICY tenant_isolation ON %I USING (%s) WITH CHECK (%s AND %s)',
                       tbl, rule, rule, format(of_run, tbl));
    END LOOP;
    -- rows that may belong to a run: then written only for a run of the same tenant
    FOREACH tbl IN ARRAY ARRAY['memory_thread_messages', 'memory_items'] LOOP
        EXECUTE format('CREATE POLICY tenant_isolation ON %1$I USING (%2$s) '
                       'WITH CHECK (%2$s AND (%1$I.run_id IS NULL OR %3$s))', tbl, rule, format(of_run, tbl));
    END LOOP;
END
$$;
