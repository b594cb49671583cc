-- The SQLite schema, whole: what migrations/0001..0004 produce, in one file.
--
-- This file is the reference to read; the migrations remain what the store
-- runs (an existing database needs their steps, not this end state).
-- tests/store/test_schema.py applies all migrations to one database and this
-- file to another and requires the two schemas to be identical, so a
-- migration added without updating this file fails the build (and so does an
-- edit here that no migration makes).
--
-- schema_migrations is created by the store itself (SQLiteStore._migrate),
-- before the first migration, and records each one applied.

CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL);

-- Runs and their single ordered history. Every write by a lease holder is
-- fenced on epoch.
CREATE TABLE runs (
    run_id           TEXT PRIMARY KEY,
    tenant           TEXT NOT NULL,
    workflow         TEXT NOT NULL,
    workflow_version TEXT NOT NULL,
    thread_id        TEXT,
    queue            TEXT NOT NULL DEFAULT 'default',
    priority         INTEGER NOT NULL DEFAULT 0,
    parent_run_id    TEXT,
    status           TEXT NOT NULL,
    input            BLOB,
    input_ref        TEXT,
    result           BLOB,
    result_ref       TEXT,
    error            TEXT,
    epoch            INTEGER NOT NULL DEFAULT 0,
    owner            TEXT,
    lease_expires_at REAL,
    wake_at          REAL,
    waiting_on       TEXT,
    -- When the run may next be claimed; NULL while it cannot be. One column
    -- for pending, due timers and expired leases keeps the claim query a
    -- range scan over one small partial index.
    runnable_at      REAL,
    recoveries       INTEGER NOT NULL DEFAULT 0,
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    -- Per-run budget limits (tokens, cost, tool calls, wall time) as JSON.
    -- Usage is derived from the journal, which is already durable. (0002)
    budget           TEXT,
    -- What a suspended run waits for besides a timer or a child (a wait key
    -- such as 'signal:NAME'); a delivery for it wakes the run. (0005)
    waiting_for      TEXT,
    -- The bundle the run executes on (cairn.engine.bundles); NULL for runs
    -- older than bundles. Claims filter on it. (0006; assigned 0009 at merge)
    bundle           TEXT,
    -- The role and token the run was started with; never changed (0024).
    started_role     TEXT CHECK (started_role IN ('viewer', 'operator', 'admin', 'installation')),
    started_token    TEXT,
    -- Whose data the run holds (erasure by subject); never changed (0026).
    subject          TEXT
) WITHOUT ROWID;  -- the run id B-tree is the table: one tree less to write per commit

-- Deliberately few indexes: each one is written on every claim and finish.
CREATE INDEX runs_tenant_created ON runs (tenant, created_at);
CREATE INDEX runs_parent ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL;
CREATE INDEX runs_thread ON runs (thread_id) WHERE thread_id IS NOT NULL;
-- Claims walk lanes: each (queue, tenant) with runnable runs, one index seek
-- per lane, then a lane's best runs (priority, then longest runnable) from
-- the same index. runs_running counts what each lane has in flight. (0004)
CREATE INDEX runs_lanes ON runs (queue, tenant, priority DESC, runnable_at) WHERE runnable_at IS NOT NULL;
CREATE INDEX runs_running ON runs (queue, tenant) WHERE status = 'running';
-- Pruning: finished runs by age, written once per run (when it ends). Queries
-- repeat the predicate word for word so SQLite can use the index. (0003)
CREATE INDEX runs_finished ON runs (updated_at)
    WHERE status IN ('completed', 'failed', 'cancelled', 'quarantined', 'killed', 'halted');
-- "Does any row still reference this artifact?" (0003)
CREATE INDEX runs_input_ref ON runs (input_ref) WHERE input_ref IS NOT NULL;
CREATE INDEX runs_result_ref ON runs (result_ref) WHERE result_ref IS NOT NULL;

-- The journal and the event stream are one table: a step costs one row.
-- tenant is filled in by the store from the run row inside the very INSERT
-- that writes the entry, so an entry cannot claim a tenant its run does not
-- have; NOT NULL without a default, so a write path that forgot it fails.
CREATE TABLE history (
    run_id      TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    tenant      TEXT NOT NULL,
    event       TEXT NOT NULL,
    at          REAL NOT NULL,
    epoch       INTEGER NOT NULL,
    worker      TEXT,
    position    INTEGER,
    step_kind   TEXT,
    name        TEXT,
    input_hash  TEXT,
    attempt     INTEGER,
    started_at  REAL,
    payload     BLOB,
    payload_ref TEXT,
    detail      TEXT,
    digest      BLOB,
    link        BLOB DEFAULT X'',
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

CREATE INDEX history_payload_ref ON history (payload_ref) WHERE payload_ref IS NOT NULL;
CREATE INDEX history_events ON history (run_id, name, seq) WHERE step_kind = 'event';
-- The audit chain (0022; cairn/store/auditlinks.py): entries not linked yet
-- (only inside a transaction in progress: the store links them before commit).
CREATE INDEX history_unlinked ON history (run_id, seq) WHERE link = X'';

-- A history payload too large for its row, even compressed (0014): the row
-- keeps a link (X'0002' and this id's digits) and the store's queries put
-- the payload back in its place. A rowid table: a WITHOUT ROWID row of a
-- few kilobytes takes an overflow page of its own, a rowid table's leaves
-- hold such rows one after another.
CREATE TABLE history_payloads (
    id   INTEGER PRIMARY KEY,
    data BLOB NOT NULL
);

-- Deleting an entry (pruning) deletes the payload it links to. (0014)
CREATE TRIGGER history_payload_gone AFTER DELETE ON history WHEN substr(OLD.payload, 1, 2) = X'0002'
BEGIN
    DELETE FROM history_payloads WHERE id = CAST(substr(OLD.payload, 3) AS INTEGER);
END;

-- The history as it reads: a spilled payload put back in its link's place,
-- written once for every statement that reads entries (0016; SQLite flattens
-- the view into each query, which keeps its own index and order).
CREATE VIEW history_entries AS
SELECT run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash, attempt,
       started_at,
       CASE WHEN substr(payload, 1, 2) = X'0002'
            THEN (SELECT p.data FROM history_payloads AS p WHERE p.id = CAST(substr(payload, 3) AS INTEGER))
            ELSE payload END AS payload,
       payload_ref, detail
FROM history;

-- Artifacts are content-addressed files beside the database, shared by every
-- tenant. Those referenced by pruned runs wait here to be collected, so a
-- crash loses no candidate.
CREATE TABLE artifact_gc (
    ref       TEXT PRIMARY KEY,
    queued_at REAL NOT NULL
) WITHOUT ROWID;

-- Queues with limits; a queue without a row is unlimited. Rates are token
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

-- A run's mailbox (0005): what was delivered to it (signals, decisions), in
-- order of arrival, each message consumed at most once by the journal entry
-- at taken_position; dedupe makes a delivery idempotent.
CREATE TABLE mailbox (
    run_id         TEXT NOT NULL,
    seq            INTEGER NOT NULL,
    tenant         TEXT NOT NULL,
    key            TEXT NOT NULL,
    payload        BLOB,
    payload_ref    TEXT,
    sender         TEXT,
    dedupe         TEXT,
    sent_at        REAL NOT NULL,
    taken_at       REAL,
    taken_position INTEGER,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

CREATE UNIQUE INDEX mailbox_dedupe ON mailbox (run_id, dedupe) WHERE dedupe IS NOT NULL;
CREATE INDEX mailbox_waiting ON mailbox (run_id, key, seq) WHERE taken_at IS NULL;
CREATE INDEX mailbox_payload_ref ON mailbox (payload_ref) WHERE payload_ref IS NOT NULL;

-- Bundles (0010):
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

-- Approvals (0007): requests a run made for people to approve, reject or
-- edit; written by the lease holder with the journal entry that records the
-- request (request_seq: its details), decided once (decision_seq: the
-- mailbox message that delivered the decision to the run).
CREATE TABLE approvals (
    run_id       TEXT NOT NULL,
    request_id   TEXT NOT NULL,
    tenant       TEXT NOT NULL,
    position     INTEGER NOT NULL,
    request_seq  INTEGER NOT NULL,
    action       TEXT NOT NULL,
    type_name    TEXT NOT NULL,
    schema       TEXT,
    approvers    TEXT,
    requested_at REAL NOT NULL,
    expires_at   REAL,
    status       TEXT NOT NULL DEFAULT 'pending',
    decided_by   TEXT,
    decided_at   REAL,
    comment      TEXT,
    decision_seq INTEGER,
    PRIMARY KEY (run_id, request_id)
) WITHOUT ROWID;

CREATE INDEX approvals_pending ON approvals (tenant, requested_at) WHERE status = 'pending';

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
    created_at  REAL NOT NULL,
    created_by  TEXT,
    revoked_at  REAL
) WITHOUT ROWID;

CREATE INDEX api_tokens_tenant ON api_tokens (tenant, created_at);

-- A tenant's run changes in the order they happened: the cursor of the
-- tenant-wide event stream and of the dashboard's live runs list.
CREATE INDEX runs_tenant_updated ON runs (tenant, updated_at, run_id);

-- Schedules: the definition the workers last registered, and the latest tick
-- fired or passed over (UTC epoch seconds; NULL: none yet). A tick fires in
-- the transaction that moves last_tick up to it and creates its run.
CREATE TABLE schedules (
    tenant      TEXT NOT NULL,
    name        TEXT NOT NULL,
    workflow    TEXT NOT NULL,
    cron        TEXT NOT NULL,
    timezone    TEXT NOT NULL,
    missed      TEXT NOT NULL,
    grace       REAL NOT NULL,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL,
    last_tick   REAL,
    last_run_id TEXT,
    fired_at    REAL,
    fired       INTEGER NOT NULL DEFAULT 0,
    -- The role its ticks' runs are started with, as registered (0028; shown:
    -- the run takes it from the declaration in code).
    started_role TEXT CHECK (started_role IN ('viewer', 'operator', 'admin', 'installation')),
    PRIMARY KEY (tenant, name)
) WITHOUT ROWID;

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
    value        BLOB,
    value_ref    TEXT,
    version      INTEGER NOT NULL,
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL,
    position     INTEGER,
    operation_id TEXT,
    actor        TEXT,
    PRIMARY KEY (run_id, key)
) WITHOUT ROWID;

-- Thread memory: one row per thread (its retention), and its messages in
-- order (idx 0, 1, 2, ...; a compaction replaces a prefix by one summary
-- message at the prefix's last idx, so the order stays the idx order).
CREATE TABLE memory_threads (
    tenant       TEXT NOT NULL,
    thread_id    TEXT NOT NULL,
    next_idx     INTEGER NOT NULL,
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL,
    accessed_at  REAL NOT NULL,
    ttl          REAL,
    expires_at   REAL,
    PRIMARY KEY (tenant, thread_id)
) WITHOUT ROWID;

CREATE INDEX memory_threads_expiry ON memory_threads (expires_at) WHERE expires_at IS NOT NULL;

CREATE TABLE memory_thread_messages (
    tenant       TEXT NOT NULL,
    thread_id    TEXT NOT NULL,
    idx          INTEGER NOT NULL,
    kind         TEXT NOT NULL,
    value        BLOB,
    value_ref    TEXT,
    created_at   REAL NOT NULL,
    run_id       TEXT,
    position     INTEGER,
    operation_id TEXT,
    actor        TEXT,
    subject      TEXT,
    PRIMARY KEY (tenant, thread_id, idx)
) WITHOUT ROWID;

CREATE INDEX memory_thread_messages_run ON memory_thread_messages (run_id) WHERE run_id IS NOT NULL;

-- Long-term memory: one row per (tenant, namespace, key); version counts puts (1, 2, ...).
CREATE TABLE memory_items (
    tenant       TEXT NOT NULL,
    namespace    TEXT NOT NULL,
    key          TEXT NOT NULL,
    value        BLOB,
    value_ref    TEXT,
    metadata     TEXT,
    index_text   TEXT,
    version      INTEGER NOT NULL,
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL,
    accessed_at  REAL NOT NULL,
    ttl          REAL,
    expires_at   REAL,
    run_id       TEXT,
    position     INTEGER,
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
    id            INTEGER PRIMARY KEY,
    tenant        TEXT NOT NULL,
    namespace     TEXT NOT NULL,
    key           TEXT NOT NULL,
    version       INTEGER NOT NULL,
    created_at    REAL NOT NULL,
    attempts      INTEGER NOT NULL DEFAULT 0,
    claimed_by    TEXT,
    claimed_until REAL,
    last_error    TEXT,
    UNIQUE (tenant, namespace, key, version)
);

CREATE INDEX memory_outbox_ready ON memory_outbox (claimed_until, id);

-- A run's memory goes with the run, however it is deleted (prune_runs).
CREATE TRIGGER memory_run_of_deleted_run AFTER DELETE ON runs
BEGIN
    DELETE FROM memory_run WHERE run_id = OLD.run_id;
END;

-- An offloaded value whose row goes (deleted, or replaced by a put) is
-- queued for collection: pruning deletes the artifact once nothing
-- references it (select_gc_page counts memory rows as references).
CREATE TRIGGER memory_run_gc AFTER DELETE ON memory_run WHEN OLD.value_ref IS NOT NULL
BEGIN
    INSERT INTO artifact_gc (ref, queued_at) VALUES (OLD.value_ref, OLD.updated_at) ON CONFLICT (ref) DO NOTHING;
END;

CREATE TRIGGER memory_run_gc_update AFTER UPDATE OF value_ref ON memory_run
WHEN OLD.value_ref IS NOT NULL AND OLD.value_ref IS NOT NEW.value_ref
BEGIN
    INSERT INTO artifact_gc (ref, queued_at) VALUES (OLD.value_ref, OLD.updated_at) ON CONFLICT (ref) DO NOTHING;
END;

CREATE TRIGGER memory_thread_messages_gc AFTER DELETE ON memory_thread_messages WHEN OLD.value_ref IS NOT NULL
BEGIN
    INSERT INTO artifact_gc (ref, queued_at) VALUES (OLD.value_ref, OLD.created_at) ON CONFLICT (ref) DO NOTHING;
END;

CREATE TRIGGER memory_thread_messages_gc_update AFTER UPDATE OF value_ref ON memory_thread_messages
WHEN OLD.value_ref IS NOT NULL AND OLD.value_ref IS NOT NEW.value_ref
BEGIN
    INSERT INTO artifact_gc (ref, queued_at) VALUES (OLD.value_ref, OLD.created_at) ON CONFLICT (ref) DO NOTHING;
END;

CREATE TRIGGER memory_items_gc AFTER DELETE ON memory_items WHEN OLD.value_ref IS NOT NULL
BEGIN
    INSERT INTO artifact_gc (ref, queued_at) VALUES (OLD.value_ref, OLD.updated_at) ON CONFLICT (ref) DO NOTHING;
END;

CREATE TRIGGER memory_items_gc_update AFTER UPDATE OF value_ref ON memory_items
WHEN OLD.value_ref IS NOT NULL AND OLD.value_ref IS NOT NEW.value_ref
BEGIN
    INSERT INTO artifact_gc (ref, queued_at) VALUES (OLD.value_ref, OLD.updated_at) ON CONFLICT (ref) DO NOTHING;
END;

-- The collection queue's reference checks (select_gc_page): one index probe each.
CREATE INDEX memory_run_ref ON memory_run (value_ref) WHERE value_ref IS NOT NULL;

CREATE INDEX memory_thread_messages_ref ON memory_thread_messages (value_ref) WHERE value_ref IS NOT NULL;

CREATE INDEX memory_items_ref ON memory_items (value_ref) WHERE value_ref IS NOT NULL;

-- Vectors of long-term memory items (issue 14): derived data, computed by
-- the embedding worker from memory_items.index_text after the item's put
-- committed (memory_outbox says what is due). One row per item: the vector
-- of `version`, made by `embedder` (vectors of different embedders are never
-- compared). `tier`: 'hot' holds `dims` float32 (little-endian, what
-- sqlite-vec's distance functions read); 'cold' holds `dims` int8, each
-- component `scale` times its int8 (a quarter of the bytes; see
-- cairn.store.vectorindex). Search scores both in the same statement.
CREATE TABLE memory_vectors (
    tenant      TEXT NOT NULL,
    namespace   TEXT NOT NULL,
    key         TEXT NOT NULL,
    version     INTEGER NOT NULL,
    embedder    TEXT NOT NULL,
    dims        INTEGER NOT NULL,
    tier        TEXT NOT NULL DEFAULT 'hot',
    embedding   BLOB NOT NULL,
    scale       REAL,
    embedded_at REAL NOT NULL,
    PRIMARY KEY (tenant, namespace, key)
);  -- a rowid table: rows of 1.5 kB overflow a WITHOUT ROWID b-tree's pages (a scan was 3x slower)
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
    size      INTEGER NOT NULL,
    value     BLOB NOT NULL,
    PRIMARY KEY (tenant, namespace, key)
);  -- a rowid table: a value of kilobytes would overflow a WITHOUT ROWID b-tree's pages

CREATE TRIGGER memory_items_cold_gone AFTER DELETE ON memory_items WHEN OLD.tier = 'cold'
BEGIN
    DELETE FROM memory_item_cold WHERE tenant = OLD.tenant AND namespace = OLD.namespace AND key = OLD.key;
END;

CREATE TRIGGER memory_items_cold_rewarmed AFTER UPDATE OF tier ON memory_items
WHEN OLD.tier = 'cold' AND NEW.tier = 'hot'
BEGIN
    DELETE FROM memory_item_cold WHERE tenant = OLD.tenant AND namespace = OLD.namespace AND key = OLD.key;
END;

-- A tenant's own share of a shared queue (0015, rates 0017): at most
-- concurrency of its runs of the queue running, and at most rate_limit
-- claims per rate_period (a token bucket: tokens as of refilled_at, NULL:
-- full), on top of the installation's limits.
CREATE TABLE queue_shares (
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
    checkpoint_id   TEXT NOT NULL,
    parent_id       TEXT,
    run_id          TEXT,
    checkpoint_kind TEXT NOT NULL,
    checkpoint      BLOB NOT NULL,
    metadata_kind   TEXT NOT NULL,
    metadata        BLOB NOT NULL,
    writes          BLOB,  -- its pending writes, folded in by the next put (0030)
    PRIMARY KEY (tenant, thread_id, ns, checkpoint_id)
) WITHOUT ROWID;

-- delete_for_runs: a tenant's checkpoints by run id (migration 0019; only those with one: 0030)
CREATE INDEX lg_checkpoints_run ON lg_checkpoints (tenant, run_id) WHERE run_id IS NOT NULL;

CREATE TABLE lg_blobs (
    tenant    TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    ns        TEXT NOT NULL,
    channel   TEXT NOT NULL,
    version   TEXT NOT NULL,
    kind      TEXT NOT NULL CHECK (kind IN ('value', 'list', 'empty')),
    base      TEXT,
    depth     INTEGER NOT NULL,
    refs      BLOB NOT NULL,
    PRIMARY KEY (tenant, thread_id, ns, channel, version)
) WITHOUT ROWID;

CREATE TABLE lg_writes (
    tenant        TEXT NOT NULL,
    thread_id     TEXT NOT NULL,
    ns            TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    task_id       TEXT NOT NULL,
    idx           INTEGER NOT NULL,
    channel       TEXT NOT NULL,
    task_path     TEXT NOT NULL,
    kind          TEXT NOT NULL CHECK (kind IN ('value', 'list')),
    refs          BLOB NOT NULL,
    PRIMARY KEY (tenant, thread_id, ns, checkpoint_id, task_id, idx)
) WITHOUT ROWID;

CREATE TABLE lg_values (
    tenant    TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    digest    INTEGER NOT NULL,
    kind      TEXT NOT NULL,
    data      BLOB NOT NULL,
    PRIMARY KEY (tenant, thread_id, digest)
);

-- Who writes a thread (fencing): the saver that took it (owner, a random id
-- per CairnSaver) and how many times it changed hands (epoch). A saver takes
-- a thread on its first write to it; a saver that held it and lost it to
-- another is refused every write after (cairn.errors.ThreadTaken), so two
-- processes driving one thread never fork its chain of checkpoints.
CREATE TABLE lg_threads (
    tenant    TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    owner     TEXT NOT NULL,
    epoch     INTEGER NOT NULL,
    collected INTEGER NOT NULL DEFAULT 0,  -- prunes and deletions that collected its rows (0032)
    PRIMARY KEY (tenant, thread_id)
) WITHOUT ROWID;

-- Encryption at rest: each tenant's data keys, wrapped by a KEK (0020, cairn.store.sealed).
CREATE TABLE data_keys (
    tenant     TEXT NOT NULL,
    version    INTEGER NOT NULL,
    kek_id     TEXT NOT NULL,
    wrapped    BLOB NOT NULL,
    created_at REAL NOT NULL,
    subject    TEXT,
    PRIMARY KEY (tenant, version)
) WITHOUT ROWID;
-- Workspace objects (issue 27, cairn.workspace): the blobs, chunk lists and
-- trees of runs' workspace snapshots, content addressed per tenant (oid:
-- BLAKE2b-256 hex of the object's kind and plain bytes; data: its stored,
-- compressed form). Two tenants' identical files are two rows: whether an
-- object exists says nothing across tenants. A snapshot's root id is
-- recorded in the detail of the step's journal entry, not here; an object
-- is written by the run's lease holder (fenced, the tenant read from the
-- run row) before the entry that names its root. A rowid table: objects
-- are up to a 1 MiB chunk, too large for a WITHOUT ROWID b-tree.
CREATE TABLE workspace_objects (
    tenant    TEXT NOT NULL,
    oid       TEXT NOT NULL,
    data      BLOB NOT NULL,
    stored_at REAL NOT NULL,
    PRIMARY KEY (tenant, oid)
);

-- The role and token a run was started with never change (0024, cairn.engine.access).
CREATE TRIGGER runs_started_with_fixed
BEFORE UPDATE OF started_role, started_token ON runs
WHEN NEW.started_role IS NOT OLD.started_role OR NEW.started_token IS NOT OLD.started_token
BEGIN
    SELECT RAISE(ABORT, 'the role and token a run was started with never change');
END;
-- Signed checkpoints of a tenant's run heads (0023; issue 26, cairn.audit): the
-- Merkle root over every run's last (seq, link), signed with Ed25519, and the
-- record as exported to an anchor (JSON).
CREATE TABLE audit_checkpoints (
    tenant TEXT NOT NULL,
    id     INTEGER NOT NULL,
    at     REAL NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (tenant, id)
) WITHOUT ROWID;

-- The runs with entries before the audit chain (0022 / 0031), and their last
-- such entry: the verifier accepts an entry without a link only there.
CREATE TABLE audit_legacy (
    run_id   TEXT PRIMARY KEY,
    last_seq INTEGER NOT NULL
) WITHOUT ROWID;

-- Erasure (0026; issue 26, cairn.api.erasure): the subject indexes, its run's
-- subject fixed, one live key per subject, and the erasure records.
CREATE INDEX runs_subject ON runs (tenant, subject) WHERE subject IS NOT NULL;

CREATE TRIGGER runs_subject_fixed
BEFORE UPDATE OF subject ON runs
WHEN NEW.subject IS NOT OLD.subject
BEGIN
    SELECT RAISE(ABORT, 'the subject of a run never changes');
END;

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
    started_at  REAL NOT NULL,
    finished_at REAL,
    counts      TEXT,
    -- keyed digests of the runs it deleted (JSON): an anchored checkpoint
    -- that names one verifies it as erased, not as a run cut out
    runs        TEXT
) WITHOUT ROWID;

CREATE INDEX erasures_target ON erasures (tenant, scope, digest);
-- Archived runs (0027; issue 26 item 5, cairn.store.archive): the run row
-- stays, its other rows live in one archive object (ref) until restored.
CREATE TABLE run_archives (
    run_id       TEXT PRIMARY KEY,
    tenant       TEXT NOT NULL,
    ref          TEXT NOT NULL,
    entries      INTEGER NOT NULL,
    last_seq     INTEGER NOT NULL,
    last_link    BLOB,
    hot_bytes    INTEGER NOT NULL,
    stored_bytes INTEGER NOT NULL,
    archived_at  REAL NOT NULL,
    actor        TEXT,
    -- the first and last entry's time (0031; NULL: archived before it), for the audit log's pages
    first_at     REAL,
    last_at      REAL
) WITHOUT ROWID;
CREATE INDEX run_archives_ref ON run_archives (ref);
CREATE INDEX run_archives_first_at ON run_archives (tenant, first_at, last_at);
CREATE INDEX run_archives_last_at ON run_archives (tenant, last_at, first_at);

CREATE TABLE run_archive_refs (
    run_id TEXT NOT NULL,
    ref    TEXT NOT NULL,
    PRIMARY KEY (run_id, ref)
) WITHOUT ROWID;
CREATE INDEX run_archive_refs_ref ON run_archive_refs (ref);

CREATE TRIGGER runs_archived_fixed BEFORE UPDATE ON runs
WHEN EXISTS (SELECT 1 FROM run_archives WHERE run_id = OLD.run_id)
BEGIN
    SELECT RAISE(ABORT, 'the run is archived: restore it before changing it');
END;
CREATE TRIGGER run_archives_of_deleted_run AFTER DELETE ON runs
BEGIN
    DELETE FROM run_archives WHERE run_id = OLD.run_id;
    DELETE FROM run_archive_refs WHERE run_id = OLD.run_id;
END;
-- The retention controller (0025; issue 26 part 3, cairn.store.retention): the
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
    keep       REAL CHECK (keep IS NULL OR keep >= 0),
    updated_at REAL NOT NULL,
    updated_by TEXT NOT NULL,
    PRIMARY KEY (tenant, workflow, data_class)
) WITHOUT ROWID;

-- Who enforces the policies now: one controller at a time. Every deletion
-- checks, in its own transaction, that its holder still holds the lease at
-- its epoch (a takeover bumps the epoch), so a stale controller deletes nothing.
CREATE TABLE retention_lease (
    name       TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,
    epoch      INTEGER NOT NULL,
    expires_at REAL NOT NULL
) WITHOUT ROWID;

-- A run deleted (by retention or prune), written in the transaction that
-- deletes it: its tenant, workflow, when it finished, its last entry and that
-- entry's audit link (the head an anchor may have signed), when and by whom.
CREATE TABLE retention_deleted (
    run_id      TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    workflow    TEXT NOT NULL,
    finished_at REAL NOT NULL,
    last_seq    INTEGER NOT NULL,
    head        BLOB,
    deleted_at  REAL NOT NULL,
    deleted_by  TEXT NOT NULL
) WITHOUT ROWID;

CREATE INDEX retention_deleted_finished ON retention_deleted (finished_at);
-- The operator log (0029; issue 26, cairn/store/oplog.py): one append-only
-- record per operator mutation of a non-run object, written in the mutation's
-- transaction, hash-chained per tenant ('' : the installation's objects).
CREATE TABLE operator_log (
    tenant    TEXT NOT NULL,
    seq       INTEGER NOT NULL,
    at        REAL NOT NULL,
    kind      TEXT NOT NULL,
    object_id TEXT NOT NULL,
    action    TEXT NOT NULL,
    actor     TEXT NOT NULL,
    auth      TEXT NOT NULL,
    change    TEXT NOT NULL,
    digest    BLOB NOT NULL,
    link      BLOB NOT NULL,
    PRIMARY KEY (tenant, seq)
) WITHOUT ROWID;
-- The operator log by tenant in time order, for the audit log's pages (0031).
CREATE INDEX operator_log_at ON operator_log (tenant, at, seq);
