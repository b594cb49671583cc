-- Named queries for the SQLite backend, loaded by cairn.store.sqlfiles.
-- Parameters are named (:run_id); each block ends at the next "-- name:".

-- name: insert_run
INSERT INTO runs (run_id, tenant, workflow, workflow_version, thread_id, queue, priority,
                  parent_run_id, status, input, input_ref, epoch, owner, lease_expires_at,
                  runnable_at, budget, created_at, updated_at, bundle, started_role, started_token, subject)
VALUES (:run_id, :tenant, :workflow, :workflow_version, :thread_id, :queue, :priority,
        :parent_run_id, :status, :input, :input_ref, :epoch, :owner, :lease_expires_at,
        :runnable_at, :budget, :now, :now, :bundle, :started_role, :started_token, :subject)
ON CONFLICT (run_id) DO NOTHING

-- name: select_run_subject
-- The subject a run was started for (erasure; cairn.store.sealed seals its values with the subject's key).
SELECT subject FROM runs WHERE run_id = :run_id

-- name: select_started_with
-- The role and token a run was started with (cairn.engine.access reads it, once per execution).
SELECT started_role, started_token FROM runs WHERE run_id = :run_id

-- name: select_run
SELECT run_id, workflow, workflow_version, tenant, thread_id, status, input, input_ref, result,
       result_ref, error, epoch, owner, lease_expires_at, wake_at, waiting_on, waiting_for, recoveries, queue,
       priority, parent_run_id, created_at, updated_at, budget, bundle
FROM runs WHERE run_id = :run_id

-- A NULL :limit means no limit, as in PostgreSQL (here LIMIT takes -1 for that),
-- in list_runs, select_history and select_model_calls.
-- name: list_runs
SELECT run_id, workflow, workflow_version, tenant, thread_id, status, input, input_ref, result,
       result_ref, error, epoch, owner, lease_expires_at, wake_at, waiting_on, waiting_for, recoveries, queue,
       priority, parent_run_id, created_at, updated_at, budget, bundle
FROM runs
WHERE (:tenant IS NULL OR tenant = :tenant)
  AND (:workflow IS NULL OR workflow = :workflow)
  AND (:thread_id IS NULL OR thread_id = :thread_id)
  AND (:parent_run_id IS NULL OR parent_run_id = :parent_run_id)
  AND (:statuses IS NULL OR status IN (SELECT value FROM json_each(:statuses)))
ORDER BY created_at DESC, run_id DESC
LIMIT ifnull(:limit, -1)

-- Entries are read through the view history_entries (schema.sql), which puts
-- a payload too large for its row back from history_payloads.
-- name: select_history
SELECT run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash, attempt,
       started_at, payload, payload_ref, detail
FROM history_entries WHERE run_id = :run_id AND seq > :after_seq ORDER BY seq LIMIT ifnull(:limit, -1)

-- select_history without the payloads (from the table: no payload is read,
-- nor a spilled one looked up): the entries a reader fetches a few payloads of.
-- name: select_history_headers
SELECT run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash, attempt,
       started_at, NULL, NULL, detail
FROM history WHERE run_id = :run_id AND seq > :after_seq ORDER BY seq

-- Each entry's seq, type, position, kind, name and time, and nothing else:
-- what a graph run's reader lists its checkpoints from (history_index).
-- name: select_history_index
SELECT seq, event, position, step_kind, name, at FROM history WHERE run_id = :run_id AND seq > :after_seq ORDER BY seq

-- The same for the newest :last entries only (history_index(last=)): a cold
-- reader's first page of a long graph run reads its tail, not every entry.
-- name: select_history_index_last
SELECT seq, event, position, step_kind, name, at FROM (
    SELECT seq, event, position, step_kind, name, at FROM history
    WHERE run_id = :run_id AND seq > :after_seq ORDER BY seq DESC LIMIT :last)
ORDER BY seq

-- The entries of a run at the seqs given (a JSON array): what rebuilding a
-- page's model calls needs, and nothing else (modelcalls.needs).
-- name: select_history_at
SELECT run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash, attempt,
       started_at, payload, payload_ref, detail
FROM history_entries WHERE run_id = :run_id AND seq IN (SELECT value FROM json_each(:seqs)) ORDER BY seq

-- A page of a run's model calls (the recorded ones, with a payload), read
-- from the primary key's order after :after_seq.
-- name: select_model_calls
SELECT run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash, attempt,
       started_at, payload, payload_ref, detail
FROM history_entries
WHERE run_id = :run_id AND seq > :after_seq AND step_kind = 'model' AND event = 'step.completed'
  AND (payload IS NOT NULL OR payload_ref IS NOT NULL)
ORDER BY seq LIMIT ifnull(:limit, -1)

-- name: max_seq
SELECT COALESCE(MAX(seq), 0) FROM history WHERE run_id = :run_id

-- name: run_usage
-- What engine.journal.Usage sums, summed here (a read must not load a long
-- run's history for it): the tokens and cost of completed model calls, the
-- tool entries that count as calls (entries with a position only); and the
-- last seq. A damaged detail (not JSON) counts nothing.
SELECT
  COALESCE(SUM(CASE WHEN step_kind = 'model' AND event = 'step.completed' AND position IS NOT NULL
                         AND json_valid(detail)
                    THEN CAST(COALESCE(json_extract(detail, '$.usage.total_tokens'), 0) AS INTEGER) END), 0),
  COALESCE(SUM(CASE WHEN step_kind = 'model' AND event = 'step.completed' AND position IS NOT NULL
                         AND json_valid(detail)
                    THEN CAST(COALESCE(json_extract(detail, '$.cost'), 0) AS REAL) END), 0.0),
  COUNT(CASE WHEN step_kind = 'tool' AND position IS NOT NULL
                  AND event IN ('step.completed', 'step.failed', 'step.retried') THEN 1 END),
  COALESCE(MAX(seq), 0)
FROM history WHERE run_id = :run_id

-- Event inserts take positional parameters (?1..?15, in HistoryEvent field
-- order): they run once per step, and binding by position is measurably
-- cheaper than binding by name. The tenant is never a parameter: it is read
-- from the run row by the same statement, so an entry always carries its
-- run's tenant (and nothing is inserted for a run that does not exist).
-- Every append keeps the run's timestamps monotonic: an entry's ``at`` is
-- never earlier than the run's last entry's (a clock stepped back, or a
-- worker whose clock lags, must not make history go back in time).
-- name: insert_event
INSERT INTO history (run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash,
                     attempt, started_at, payload, payload_ref, detail, tenant)
SELECT ?1, ?2, ?3,
       MAX(?4, COALESCE((SELECT h.at FROM history AS h WHERE h.run_id = ?1 ORDER BY h.seq DESC LIMIT 1), ?4)),
       ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, r.tenant
FROM runs AS r WHERE r.run_id = ?1

-- A payload too large for a history row (SQLiteStore: _event_row), written
-- in the transaction of the entry that links to it.
-- name: insert_history_payload
INSERT INTO history_payloads (data) VALUES (?)

-- The hot path: one statement checks the fence (the run row must be running
-- at this epoch; the same row gives the tenant), keeps the history gap-free
-- (seq must follow the current last entry) and appends. Being one statement,
-- it is atomic without an explicit transaction.
-- name: insert_event_fenced
INSERT INTO history (run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash,
                     attempt, started_at, payload, payload_ref, detail, tenant, digest, link)
SELECT ?1, ?2, ?3,
       MAX(?4, COALESCE((SELECT h.at FROM history AS h WHERE h.run_id = ?1 ORDER BY h.seq DESC LIMIT 1), ?4)),
       ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, r.tenant, ?16, ?17
FROM runs AS r
WHERE r.run_id = ?1 AND r.epoch = ?5 AND r.status = 'running'
  AND ?2 = (SELECT COALESCE(MAX(seq), 0) + 1 FROM history WHERE run_id = ?1)
RETURNING at

-- The hot path once the store knows the run's last entry (it appended it
-- itself, under this epoch: ``SQLiteStore._tails``): the same fence on the
-- run row, but no read of ``history``. A statement that reads the table it
-- inserts into makes SQLite copy its rows into a temporary table first
-- (about 30,000 instructions, as much as the insert itself); the caller has
-- already checked that ``seq`` follows the known last entry and clamped
-- ``at`` to its time, and the primary key refuses a ``seq`` taken meanwhile.
-- name: insert_event_next
INSERT INTO history (run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash,
                     attempt, started_at, payload, payload_ref, detail, tenant, digest, link)
SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, r.tenant, ?16, ?17
FROM runs AS r
WHERE r.run_id = ?1 AND r.epoch = ?5 AND r.status = 'running'

-- A run created already held (``create_claimed_run``): its first three
-- entries (created, claimed, started) in one statement, the tenant bound
-- rather than read from the run row inserted just before in the same
-- transaction. One statement instead of three (executemany of
-- insert_event_next): about 90,000 instructions less per run.
-- name: insert_created_events
INSERT INTO history (run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash,
                     attempt, started_at, payload, payload_ref, detail, tenant)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?46),
       (?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28, ?29, ?30, ?46),
       (?31, ?32, ?33, ?34, ?35, ?36, ?37, ?38, ?39, ?40, ?41, ?42, ?43, ?44, ?45, ?46)

-- name: select_claim_state
SELECT run_id, status, owner, epoch, recoveries, runnable_at FROM runs WHERE run_id = :run_id

-- name: quarantine
UPDATE runs SET status = 'quarantined', owner = NULL, epoch = epoch + 1, lease_expires_at = NULL,
       runnable_at = NULL, recoveries = :recoveries, updated_at = :now,
       error = :error
WHERE run_id = :run_id
RETURNING run_id, workflow, workflow_version, tenant, thread_id, status, input, input_ref, result,
          result_ref, error, epoch, owner, lease_expires_at, wake_at, waiting_on, waiting_for, recoveries,
          queue, priority, parent_run_id, created_at, updated_at, budget, bundle

-- name: reclaim_owned
UPDATE runs SET runnable_at = :now, lease_expires_at = :now, updated_at = :now
WHERE runnable_at IS NOT NULL AND owner = :worker AND status = 'running'

-- name: renew_lease
UPDATE runs SET lease_expires_at = :lease_until, runnable_at = :lease_until, updated_at = :now
WHERE run_id = :run_id AND owner = :worker AND epoch = :epoch AND status = 'running'

-- name: lock_child_status
SELECT status FROM runs WHERE run_id = :run_id

-- name: suspend
UPDATE runs SET status = :status, owner = NULL, lease_expires_at = NULL, wake_at = :wake_at,
       waiting_on = :waiting_on, waiting_for = :waiting_for, runnable_at = :runnable_at, updated_at = :now
WHERE run_id = :run_id AND epoch = :epoch AND status = 'running'

-- name: release
UPDATE runs SET status = 'pending', owner = NULL, lease_expires_at = NULL, runnable_at = :now,
       updated_at = :now
WHERE run_id = :run_id AND epoch = :epoch AND status = 'running'

-- name: finish
UPDATE runs SET status = :status, owner = NULL, lease_expires_at = NULL, runnable_at = NULL,
       result = :result, result_ref = :result_ref, error = :error, updated_at = :now
WHERE run_id = :run_id AND epoch = :epoch AND status = 'running'
RETURNING parent_run_id

-- name: wake_waiting_parent
UPDATE runs SET runnable_at = :now, updated_at = :now
WHERE run_id = (SELECT parent_run_id FROM runs WHERE run_id = :child_id)
  AND status = 'suspended' AND waiting_on = :child_id

-- name: select_live_descendants
WITH RECURSIVE tree(run_id) AS (
    SELECT :run_id
    UNION ALL
    SELECT runs.run_id FROM runs JOIN tree ON runs.parent_run_id = tree.run_id
)
SELECT runs.run_id, runs.epoch FROM runs JOIN tree ON runs.run_id = tree.run_id
WHERE runs.status NOT IN (SELECT value FROM json_each(:terminal))

-- name: cancel
UPDATE runs SET status = 'cancelled', owner = NULL, epoch = epoch + 1, lease_expires_at = NULL,
       runnable_at = NULL, wake_at = NULL, updated_at = :now,
       error = :error
WHERE run_id = :run_id
RETURNING run_id, workflow, workflow_version, tenant, thread_id, status, input, input_ref, result,
          result_ref, error, epoch, owner, lease_expires_at, wake_at, waiting_on, waiting_for, recoveries,
          queue, priority, parent_run_id, created_at, updated_at, budget, bundle

-- name: last_failed_position
SELECT position FROM history
WHERE run_id = :run_id AND event = 'step.failed' ORDER BY seq DESC LIMIT 1

-- name: retry
UPDATE runs SET status = 'pending', owner = NULL, epoch = epoch + 1, lease_expires_at = NULL,
       runnable_at = :now, wake_at = NULL, waiting_on = NULL, waiting_for = NULL, recoveries = 0, error = NULL,
       updated_at = :now
WHERE run_id = :run_id
RETURNING run_id, workflow, workflow_version, tenant, thread_id, status, input, input_ref, result,
          result_ref, error, epoch, owner, lease_expires_at, wake_at, waiting_on, waiting_for, recoveries,
          queue, priority, parent_run_id, created_at, updated_at, budget, bundle

-- name: select_live_of_tenant
SELECT run_id, epoch FROM runs
WHERE tenant = :tenant AND status NOT IN (SELECT value FROM json_each(:terminal))

-- name: kill
UPDATE runs SET status = 'killed', owner = NULL, epoch = epoch + 1, lease_expires_at = NULL,
       runnable_at = NULL, updated_at = :now, error = :error
WHERE run_id = :run_id
RETURNING run_id, workflow, workflow_version, tenant, thread_id, status, input, input_ref, result,
          result_ref, error, epoch, owner, lease_expires_at, wake_at, waiting_on, waiting_for, recoveries,
          queue, priority, parent_run_id, created_at, updated_at, budget, bundle

-- name: reopen
UPDATE runs SET status = 'pending', owner = NULL, epoch = epoch + 1, lease_expires_at = NULL,
       runnable_at = :now, wake_at = NULL, waiting_on = NULL, waiting_for = NULL, error = NULL, updated_at = :now
WHERE run_id = :run_id
RETURNING run_id, workflow, workflow_version, tenant, thread_id, status, input, input_ref, result,
          result_ref, error, epoch, owner, lease_expires_at, wake_at, waiting_on, waiting_for, recoveries,
          queue, priority, parent_run_id, created_at, updated_at, budget, bundle

-- name: halt
UPDATE runs SET status = 'halted', owner = NULL, epoch = epoch + 1, lease_expires_at = NULL,
       runnable_at = NULL, error = :error, updated_at = :now
WHERE run_id = :run_id AND epoch = :fence AND status = 'running'
RETURNING run_id, workflow, workflow_version, tenant, thread_id, status, input, input_ref, result,
          result_ref, error, epoch, owner, lease_expires_at, wake_at, waiting_on, waiting_for, recoveries,
          queue, priority, parent_run_id, created_at, updated_at, budget, bundle

-- name: set_budget
UPDATE runs SET budget = :budget, updated_at = :now,
       runnable_at = CASE
           WHEN status = 'suspended' AND wake_at IS NULL AND waiting_on IS NULL AND waiting_for IS NULL THEN :now
           ELSE runnable_at END
WHERE run_id = :run_id
RETURNING run_id, workflow, workflow_version, tenant, thread_id, status, input, input_ref, result,
          result_ref, error, epoch, owner, lease_expires_at, wake_at, waiting_on, waiting_for, recoveries,
          queue, priority, parent_run_id, created_at, updated_at, budget, bundle

-- Pruning ------------------------------------------------------------------------
-- Candidate roots of prunable trees, oldest first, one page after the keyset
-- (:after_at, :after_id). The first status term repeats the predicate of the
-- runs_finished index word for word, which lets SQLite use it.
-- name: select_prune_roots
SELECT r.run_id, r.updated_at FROM runs AS r
WHERE r.status IN ('completed', 'failed', 'cancelled', 'quarantined', 'killed', 'halted')
  AND r.status IN (SELECT value FROM json_each(:statuses))
  AND r.updated_at < :cutoff
  AND (:roots IS NULL OR r.run_id IN (SELECT value FROM json_each(:roots)))
  AND (:after_at IS NULL OR r.updated_at > :after_at
       OR (r.updated_at = :after_at AND r.run_id > :after_id))
  -- a root: no parent, or a parent that is gone (a NULL parent_run_id matches no run)
  AND NOT EXISTS (SELECT 1 FROM runs AS p WHERE p.run_id = r.parent_run_id)
ORDER BY r.updated_at, r.run_id
LIMIT :page

-- Every member of the trees under :roots (a JSON array), with its root.
-- UNION (not UNION ALL): even a malformed parent cycle terminates.
-- name: select_trees
WITH RECURSIVE tree(root, run_id) AS (
    SELECT value, value FROM json_each(:roots)
    UNION
    SELECT tree.root, runs.run_id FROM runs JOIN tree ON runs.parent_run_id = tree.run_id
)
SELECT tree.root, runs.run_id, runs.status, runs.updated_at, runs.tenant, runs.workflow
FROM tree JOIN runs ON runs.run_id = tree.run_id

-- Queue every artifact the runs in :run_ids reference for collection.
-- name: queue_artifacts_of_runs
INSERT INTO artifact_gc (ref, queued_at)
SELECT ref, :now FROM (
    SELECT input_ref AS ref FROM runs
    WHERE run_id IN (SELECT value FROM json_each(:run_ids)) AND input_ref IS NOT NULL
    UNION
    SELECT result_ref FROM runs
    WHERE run_id IN (SELECT value FROM json_each(:run_ids)) AND result_ref IS NOT NULL
    UNION
    SELECT payload_ref FROM history
    WHERE run_id IN (SELECT value FROM json_each(:run_ids)) AND payload_ref IS NOT NULL
    UNION
    SELECT payload_ref FROM mailbox
    WHERE run_id IN (SELECT value FROM json_each(:run_ids)) AND payload_ref IS NOT NULL
    UNION
    SELECT ref FROM run_archives WHERE run_id IN (SELECT value FROM json_each(:run_ids))
    UNION
    SELECT ref FROM run_archive_refs WHERE run_id IN (SELECT value FROM json_each(:run_ids))
) WHERE true
ON CONFLICT (ref) DO NOTHING

-- name: delete_history_of_runs
DELETE FROM history WHERE run_id IN (SELECT value FROM json_each(:run_ids))

-- name: delete_mailbox_of_runs
DELETE FROM mailbox WHERE run_id IN (SELECT value FROM json_each(:run_ids))

-- name: delete_runs
DELETE FROM runs WHERE run_id IN (SELECT value FROM json_each(:run_ids))

-- One page of the collection queue, each ref with whether a row still
-- references it (the ref indexes make each check one index probe).
-- name: select_gc_page
SELECT g.ref, g.queued_at,
       EXISTS (SELECT 1 FROM runs WHERE input_ref = g.ref)
       OR EXISTS (SELECT 1 FROM runs WHERE result_ref = g.ref)
       -- an entry whose body retention expired keeps its ref (the audit link covers it), not the body
       OR EXISTS (SELECT 1 FROM history WHERE payload_ref = g.ref
                  AND (payload IS NULL OR substr(payload, 1, 2) <> X'0003'))
       OR EXISTS (SELECT 1 FROM mailbox WHERE payload_ref = g.ref)
       OR EXISTS (SELECT 1 FROM memory_run WHERE value_ref = g.ref)
       OR EXISTS (SELECT 1 FROM memory_thread_messages WHERE value_ref = g.ref)
       OR EXISTS (SELECT 1 FROM memory_items WHERE value_ref = g.ref)
       OR EXISTS (SELECT 1 FROM run_archives WHERE ref = g.ref)
       OR EXISTS (SELECT 1 FROM run_archive_refs WHERE ref = g.ref) AS referenced
FROM artifact_gc AS g
WHERE :after_at IS NULL OR g.queued_at > :after_at OR (g.queued_at = :after_at AND g.ref > :after_ref)
ORDER BY g.queued_at, g.ref
LIMIT :page

-- Bytes about to be stored, queued for collection before the file is
-- written: if the writer dies before recording the entry that points to them,
-- pruning still finds them (and deletes them once the grace period is over).
-- name: queue_artifact
INSERT INTO artifact_gc (ref, queued_at) VALUES (:ref, :now) ON CONFLICT (ref) DO NOTHING

-- name: dequeue_artifacts
DELETE FROM artifact_gc WHERE ref IN (SELECT value FROM json_each(:refs))

-- Queues and fair claims (see store/admission.py). Lanes are found by
-- skipping through runs_lanes: each statement is one index seek.
-- name: next_queue
SELECT queue FROM runs WHERE runnable_at IS NOT NULL AND queue > :after ORDER BY queue LIMIT 1

-- name: next_tenant
SELECT tenant FROM runs
WHERE runnable_at IS NOT NULL AND queue = :queue AND tenant > :after
ORDER BY tenant LIMIT 1

-- The unary + keeps runnable_at out of the index search: with statistics
-- from ANALYZE saying queue and tenant are nearly constant, SQLite would
-- otherwise skip-scan runnable_at and sort every due row; this way it reads
-- the lane in index order and stops after :limit rows.
-- name: lane_candidates
SELECT run_id, priority, runnable_at, status, owner, epoch, recoveries FROM runs
WHERE runnable_at IS NOT NULL AND queue = :queue AND tenant = :tenant AND +runnable_at <= :now
  AND workflow IN (SELECT value FROM json_each(:workflows))
  AND (bundle IS NULL OR :bundles IS NULL OR bundle IN (SELECT value FROM json_each(:bundles)))
ORDER BY priority DESC, runnable_at
LIMIT :limit

-- name: lane_running
SELECT tenant, count(*) FROM runs WHERE queue = :queue AND status = 'running' GROUP BY tenant

-- name: queue_running
SELECT count(*) FROM runs WHERE queue = :queue AND status = 'running'

-- name: select_queues
SELECT name, concurrency, tenant_concurrency, rate_limit, rate_period, rate_burst,
       tenant_rate_limit, tenant_rate_period, tenant_rate_burst
FROM queues ORDER BY name

-- name: select_buckets
SELECT queue, tenant, tokens, refilled_at FROM queue_buckets WHERE queue = :queue

-- name: upsert_bucket
INSERT INTO queue_buckets (queue, tenant, tokens, refilled_at) VALUES (:queue, :tenant, :tokens, :at)
ON CONFLICT (queue, tenant) DO UPDATE SET tokens = excluded.tokens, refilled_at = excluded.refilled_at

-- name: upsert_queue
INSERT INTO queues (name, concurrency, tenant_concurrency, rate_limit, rate_period, rate_burst,
                    tenant_rate_limit, tenant_rate_period, tenant_rate_burst, updated_at)
VALUES (:name, :concurrency, :tenant_concurrency, :rate_limit, :rate_period, :rate_burst,
        :tenant_rate_limit, :tenant_rate_period, :tenant_rate_burst, :now)
ON CONFLICT (name) DO UPDATE SET
    concurrency = excluded.concurrency, tenant_concurrency = excluded.tenant_concurrency,
    rate_limit = excluded.rate_limit, rate_period = excluded.rate_period, rate_burst = excluded.rate_burst,
    tenant_rate_limit = excluded.tenant_rate_limit, tenant_rate_period = excluded.tenant_rate_period,
    tenant_rate_burst = excluded.tenant_rate_burst, updated_at = excluded.updated_at

-- name: delete_queue
DELETE FROM queues WHERE name = :name

-- A bucket whose rate is gone goes too (a later rate starts full).
-- name: delete_stale_buckets
DELETE FROM queue_buckets
WHERE queue = :name AND ((tenant = '' AND :rate_limit IS NULL) OR (tenant <> '' AND :tenant_rate_limit IS NULL))

-- name: queue_counts
SELECT queue, SUM(status = 'running'), SUM(runnable_at <= :now) FROM runs
WHERE runnable_at IS NOT NULL GROUP BY queue

-- name: tenant_queue_counts
SELECT queue, SUM(status = 'running'), SUM(runnable_at <= :now) FROM runs
WHERE runnable_at IS NOT NULL AND tenant = :tenant GROUP BY queue

-- Set-based claiming: the runs a claim takes, in three statements for the
-- whole batch (their histories, their rows, their lifecycle entries) instead
-- of several per run. The claim holds the write lock, so nobody appends to
-- those runs meanwhile and the entries need no fence.
-- name: select_histories
SELECT run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash, attempt,
       started_at, payload, payload_ref, detail
FROM history_entries WHERE run_id IN (SELECT value FROM json_each(:run_ids)) ORDER BY run_id, seq

-- :claims is a JSON array of [run_id, recoveries] pairs.
-- name: claim_many
UPDATE runs SET status = 'running', owner = :worker, epoch = epoch + 1,
       lease_expires_at = :lease_until, runnable_at = :lease_until, wake_at = NULL,
       waiting_on = NULL, waiting_for = NULL, recoveries = c.claim_recoveries, updated_at = :now
FROM (SELECT json_extract(value, '$[0]') AS claim_id, json_extract(value, '$[1]') AS claim_recoveries
      FROM json_each(:claims)) AS c
WHERE runs.run_id = c.claim_id
RETURNING run_id, workflow, workflow_version, tenant, thread_id, status, input, input_ref, result,
          result_ref, error, epoch, owner, lease_expires_at, wake_at, waiting_on, waiting_for, recoveries,
          queue, priority, parent_run_id, created_at, updated_at, budget, bundle

-- :entries is a JSON array of [run_id, seq, event, at, epoch, worker, detail]
-- (detail as JSON text, or null).
-- name: insert_events_many
INSERT INTO history (run_id, seq, event, at, epoch, worker, detail, tenant)
SELECT json_extract(e.value, '$[0]'), json_extract(e.value, '$[1]'), json_extract(e.value, '$[2]'),
       MAX(json_extract(e.value, '$[3]'),
           COALESCE((SELECT h.at FROM history AS h WHERE h.run_id = r.run_id ORDER BY h.seq DESC LIMIT 1),
                    json_extract(e.value, '$[3]'))),
       json_extract(e.value, '$[4]'), json_extract(e.value, '$[5]'),
       json_extract(e.value, '$[6]'), r.tenant
FROM json_each(:entries) AS e JOIN runs AS r ON r.run_id = json_extract(e.value, '$[0]')
RETURNING run_id, seq, at

-- Mailboxes (see schema.sql): deliveries to a run, each consumed at most
-- once by the journal entry that records it. Every statement runs in a
-- write transaction that holds the run (the database lock), so the next seq
-- and the dedupe check cannot race.
-- name: message_by_dedupe
SELECT seq FROM mailbox WHERE run_id = :run_id AND dedupe = :dedupe

-- name: insert_message
INSERT INTO mailbox (run_id, seq, tenant, key, payload, payload_ref, sender, dedupe, sent_at)
SELECT :run_id, COALESCE((SELECT MAX(m.seq) FROM mailbox AS m WHERE m.run_id = :run_id), 0) + 1, r.tenant,
       :key, :payload, :payload_ref, :sender, :dedupe, :now
FROM runs AS r WHERE r.run_id = :run_id
RETURNING seq

-- A delivery wakes the run if it is parked waiting for exactly this key.
-- name: wake_waiting_for
UPDATE runs SET runnable_at = :now, updated_at = :now
WHERE run_id = :run_id AND status = 'suspended' AND waiting_for = :key

-- name: next_message
SELECT run_id, seq, key, payload, payload_ref, sender, dedupe, sent_at, taken_at, taken_position
FROM mailbox WHERE run_id = :run_id AND key = :key AND taken_at IS NULL ORDER BY seq LIMIT 1

-- name: message_at
SELECT run_id, seq, key, payload, payload_ref, sender, dedupe, sent_at, taken_at, taken_position
FROM mailbox WHERE run_id = :run_id AND seq = :seq AND key = :key

-- name: take_message
UPDATE mailbox SET taken_at = :now, taken_position = :position
WHERE run_id = :run_id AND seq = :seq AND (taken_at IS NULL OR taken_position = :released)

-- name: select_messages
SELECT run_id, seq, key, payload, payload_ref, sender, dedupe, sent_at, taken_at, taken_position
FROM mailbox WHERE run_id = :run_id AND seq > :after_seq AND (:key IS NULL OR key = :key) ORDER BY seq

-- Bundles (see schema.sql) ---------------------------------------------------------
-- A bundle's id is its content's hash: storing it again changes nothing.
-- name: insert_bundle
INSERT INTO bundles (bundle_id, workflow, version, code, content, created_at)
VALUES (:bundle_id, :workflow, :version, :code, :content, :now)
ON CONFLICT (bundle_id) DO NOTHING

-- name: select_bundles
SELECT bundle_id, workflow, version, code, content, created_at, served_at FROM bundles
WHERE :workflows IS NULL OR workflow IN (SELECT value FROM json_each(:workflows))
ORDER BY workflow, created_at, bundle_id

-- name: serve_bundles
UPDATE bundles SET served_at = :now
WHERE bundle_id IN (SELECT value FROM json_each(:bundle_ids)) AND (served_at IS NULL OR served_at < :now)

-- Runs by tenant, workflow and status, for the metrics (a scan of runs:
-- read at a scrape, not per step).
-- name: run_counts
SELECT tenant, workflow, status, count(*) FROM runs GROUP BY tenant, workflow, status

-- name: bundle_counts
SELECT bundle, workflow, workflow_version, status, count(*) FROM runs
GROUP BY bundle, workflow, workflow_version, status

-- An operator moves a run that is not running to another bundle; its
-- journal stays (lifecycle.migrate decides; the entry records it).
-- name: migrate
UPDATE runs SET bundle = :bundle, workflow_version = :version, updated_at = :now
WHERE run_id = :run_id
RETURNING run_id, workflow, workflow_version, tenant, thread_id, status, input, input_ref, result,
          result_ref, error, epoch, owner, lease_expires_at, wake_at, waiting_on, waiting_for, recoveries,
          queue, priority, parent_run_id, created_at, updated_at, budget, bundle

-- Published events (ctx.set_event): the latest entry of a key, through the
-- partial index history_events.
-- name: latest_event
SELECT run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash, attempt,
       started_at, payload, payload_ref, detail
FROM history_entries WHERE run_id = :run_id AND step_kind = 'event' AND name = :key AND event = 'step.completed'
ORDER BY seq DESC LIMIT 1

-- Approvals (see schema.sql): a request is written by the lease holder with
-- its journal entry, decided once by an operator (holding the run: the
-- database lock), expired once by the holder when its timeout passed.
-- A request made again at the same position (after a retry voided the
-- entry that made it) keeps its row and its decision; it points at the new entry.
-- name: insert_approval
INSERT INTO approvals (run_id, request_id, tenant, position, request_seq, action, type_name, schema,
                       approvers, requested_at, expires_at)
SELECT :run_id, :request_id, r.tenant, :position, :request_seq, :action, :type_name, :schema, :approvers,
       :now, :expires_at
FROM runs AS r WHERE r.run_id = :run_id
ON CONFLICT (run_id, request_id) DO UPDATE SET request_seq = excluded.request_seq,
       position = excluded.position, action = excluded.action, type_name = excluded.type_name,
       schema = excluded.schema, approvers = excluded.approvers, expires_at = excluded.expires_at

-- name: expire_approval
UPDATE approvals SET status = 'expired', decided_at = :now
WHERE run_id = :run_id AND request_id = :request_id AND status = 'pending'

-- The pending requests a rewind undid (Store.rewind_run): those at or after its cut.
-- name: void_approvals
UPDATE approvals SET status = 'voided', decided_at = :now
WHERE run_id = :run_id AND status = 'pending' AND position >= :from_position

-- name: decide_approval
UPDATE approvals SET status = :status, decided_by = :actor, decided_at = :now, comment = :comment,
       decision_seq = :decision_seq
WHERE run_id = :run_id AND request_id = :request_id AND status = 'pending'

-- Approvals with what a reader needs beside the row: the request's journal
-- entry payload (its details), the decision's message payload (its edit)
-- and the run's status. :pending keeps only the requests still open: pending,
-- of a run that is not finished.
-- name: select_approvals
SELECT a.run_id, a.request_id, a.tenant, a.position, a.request_seq, a.action, a.type_name, a.schema,
       a.approvers, a.requested_at, a.expires_at, a.status, a.decided_by, a.decided_at, a.comment,
       a.decision_seq,
       h.payload, h.payload_ref, m.payload, m.payload_ref, r.status
FROM approvals AS a
JOIN runs AS r ON r.run_id = a.run_id
LEFT JOIN history_entries AS h ON h.run_id = a.run_id AND h.seq = a.request_seq
LEFT JOIN mailbox AS m ON m.run_id = a.run_id AND m.seq = a.decision_seq
WHERE (:run_id IS NULL OR a.run_id = :run_id)
  AND (:request_id IS NULL OR a.request_id = :request_id)
  AND (:tenant IS NULL OR a.tenant = :tenant)
  AND (NOT :pending OR (a.status = 'pending'
                        AND r.status NOT IN ('completed', 'failed', 'cancelled', 'quarantined', 'killed',
                                             'halted')))
ORDER BY a.requested_at, a.run_id, a.request_id
LIMIT :limit

-- name: delete_approvals_of_runs
DELETE FROM approvals WHERE run_id IN (SELECT value FROM json_each(:run_ids))

-- == The HTTP API: tokens and the tenant's run changes (cairn.server) ==========================

-- name: insert_token
INSERT INTO api_tokens (token_id, tenant, role, name, digest, created_at, created_by, revoked_at)
VALUES (:token_id, :tenant, :role, :name, :digest, :created_at, :created_by, NULL)

-- name: select_token
SELECT token_id, tenant, role, name, digest, created_at, created_by, revoked_at
FROM api_tokens WHERE token_id = :token_id

-- name: list_tokens
SELECT token_id, tenant, role, name, digest, created_at, created_by, revoked_at
FROM api_tokens WHERE (:tenant IS NULL OR tenant = :tenant)
ORDER BY tenant, created_at, token_id

-- name: revoke_token
UPDATE api_tokens SET revoked_at = :now WHERE token_id = :token_id AND revoked_at IS NULL

-- name: runs_changed
-- A tenant's runs changed after the cursor (updated_at, run_id), in that order.
SELECT run_id, workflow, workflow_version, tenant, thread_id, status, input, input_ref, result,
       result_ref, error, epoch, owner, lease_expires_at, wake_at, waiting_on, waiting_for, recoveries, queue,
       priority, parent_run_id, created_at, updated_at, budget, bundle
FROM runs
WHERE tenant = :tenant AND (updated_at > :after_at OR (updated_at = :after_at AND run_id > :after_run_id))
  AND updated_at <= :until
ORDER BY updated_at, run_id
LIMIT :limit

-- schedules (store/schedules.py) ---------------------------------------------

-- name: upsert_schedule
-- A worker registers what its code declares: the definition is replaced, the
-- firing state (created_at, last_tick, ...) kept.
INSERT INTO schedules (tenant, name, workflow, cron, timezone, missed, grace, created_at, updated_at,
                       started_role)
VALUES (:tenant, :name, :workflow, :cron, :timezone, :missed, :grace, :now, :now, :started_role)
ON CONFLICT (tenant, name) DO UPDATE SET
    workflow = excluded.workflow, cron = excluded.cron, timezone = excluded.timezone,
    missed = excluded.missed, grace = excluded.grace, updated_at = excluded.updated_at,
    started_role = excluded.started_role
RETURNING tenant, name, workflow, cron, timezone, missed, grace, created_at, updated_at, last_tick,
          last_run_id, fired_at, fired, started_role

-- name: lock_schedule
-- The schedule row, read under the write lock (PostgreSQL: FOR UPDATE).
SELECT tenant, name, workflow, cron, timezone, missed, grace, created_at, updated_at, last_tick,
       last_run_id, fired_at, fired, started_role
FROM schedules WHERE tenant = :tenant AND name = :name

-- name: select_schedules
SELECT tenant, name, workflow, cron, timezone, missed, grace, created_at, updated_at, last_tick,
       last_run_id, fired_at, fired, started_role
FROM schedules WHERE :tenant IS NULL OR tenant = :tenant
ORDER BY tenant, name

-- name: advance_schedule
-- Move last_tick up to :tick (never back); :run_id is the run the tick
-- started, if it started one (:created 1).
UPDATE schedules SET
    last_tick = :tick,
    last_run_id = CASE WHEN :created = 1 THEN :run_id ELSE last_run_id END,
    fired_at = CASE WHEN :created = 1 THEN :now ELSE fired_at END,
    fired = fired + :created
WHERE tenant = :tenant AND name = :name AND (last_tick IS NULL OR last_tick < :tick)

-- Transactional steps (``Store.transact``): the fence, checked inside the
-- write transaction before the user's body runs. The write lock the
-- transaction holds keeps it true until the commit.
-- name: transact_fence
SELECT 1 FROM runs WHERE run_id = :run_id AND epoch = :epoch AND status = 'running'

-- After a transactional step's body: a temporary table or view it created
-- would outlive the transaction on this connection and shadow main's tables
-- (unqualified names look in temp first), and a temporary trigger on a main
-- table (CREATE TRIGGER temp.x ... ON main.history) would act on Cairn's own
-- writes. Cairn's own temp objects are triggers: the store compares what this
-- returns with what it installed (SQLiteStore._check_session).
-- name: transact_session_check
SELECT type, name, tbl_name, sql FROM sqlite_temp_master

-- Memory tiers (issue 14; store/memsql.py). Expired rows are invisible at
-- once (every read compares expires_at with now); sweep_memory deletes them.
-- Namespace prefixes compare with substr, never LIKE (store/namespaces.py).

-- name: memory_run_tenant
SELECT tenant FROM runs WHERE run_id = :run_id

-- name: put_memory_item
-- A new version of the item; an expired one starts over (created_at).
INSERT INTO memory_items (tenant, namespace, key, value, value_ref, metadata, index_text, version,
                          created_at, updated_at, accessed_at, ttl, expires_at, run_id, position,
                          operation_id, actor, tier, subject)
VALUES (:tenant, :namespace, :key, :value, :value_ref, :metadata, :index_text, 1, :now, :now, :now,
        :ttl, :expires_at, :run_id, :position, :operation_id, :actor, 'hot',
        COALESCE(:subject, (SELECT r.subject FROM runs AS r WHERE r.run_id = :run_id)))
ON CONFLICT (tenant, namespace, key) DO UPDATE SET
    value = excluded.value, value_ref = excluded.value_ref, metadata = excluded.metadata,
    index_text = excluded.index_text, version = memory_items.version + 1,
    created_at = CASE WHEN memory_items.expires_at IS NOT NULL AND memory_items.expires_at <= excluded.updated_at
                      THEN excluded.created_at ELSE memory_items.created_at END,
    updated_at = excluded.updated_at, accessed_at = excluded.accessed_at, ttl = excluded.ttl,
    expires_at = excluded.expires_at, run_id = excluded.run_id, position = excluded.position,
    operation_id = excluded.operation_id, actor = excluded.actor, tier = 'hot',
    subject = excluded.subject
RETURNING version

-- name: put_memory_item_of_run
-- put_memory_item by a step: the tenant is the run's, read by the statement
-- (one statement, where reading it first would be two; never the caller's).
INSERT INTO memory_items (tenant, namespace, key, value, value_ref, metadata, index_text, version,
                          created_at, updated_at, accessed_at, ttl, expires_at, run_id, position,
                          operation_id, actor, tier, subject)
SELECT r.tenant, :namespace, :key, :value, :value_ref, :metadata, :index_text, 1, :now, :now, :now,
        :ttl, :expires_at, :run_id, :position, :operation_id, :actor, 'hot',
        COALESCE(:subject, r.subject)
FROM runs AS r WHERE r.run_id = :run_id
ON CONFLICT (tenant, namespace, key) DO UPDATE SET
    value = excluded.value, value_ref = excluded.value_ref, metadata = excluded.metadata,
    index_text = excluded.index_text, version = memory_items.version + 1,
    created_at = CASE WHEN memory_items.expires_at IS NOT NULL AND memory_items.expires_at <= excluded.updated_at
                      THEN excluded.created_at ELSE memory_items.created_at END,
    updated_at = excluded.updated_at, accessed_at = excluded.accessed_at, ttl = excluded.ttl,
    expires_at = excluded.expires_at, run_id = excluded.run_id, position = excluded.position,
    operation_id = excluded.operation_id, actor = excluded.actor, tier = 'hot',
    subject = excluded.subject
RETURNING tenant, version

-- name: insert_memory_outbox
INSERT INTO memory_outbox (tenant, namespace, key, version, created_at)
VALUES (:tenant, :namespace, :key, :version, :now)
ON CONFLICT (tenant, namespace, key, version) DO NOTHING

-- name: delete_memory_outbox_of_item
DELETE FROM memory_outbox WHERE tenant = :tenant AND namespace = :namespace AND key = :key

-- name: delete_orphan_memory_outbox
-- Outbox rows whose item is gone (deleted, swept): nothing left to embed.
DELETE FROM memory_outbox
WHERE (:tenant IS NULL OR tenant = :tenant)
  AND NOT EXISTS (SELECT 1 FROM memory_items AS i
                  WHERE i.tenant = memory_outbox.tenant AND i.namespace = memory_outbox.namespace
                    AND i.key = memory_outbox.key)

-- name: delete_memory_item
DELETE FROM memory_items WHERE tenant = :tenant AND namespace = :namespace AND key = :key
RETURNING tenant, namespace, key

-- name: select_memory_item
-- A cold item's value is read through from memory_item_cold (codec, size, value last).
SELECT i.tenant, i.namespace, i.key, i.value, i.value_ref, i.metadata, i.index_text, i.version, i.created_at,
       i.updated_at, i.accessed_at, i.ttl, i.expires_at, i.run_id, i.position, i.operation_id, i.actor, i.tier,
       c.codec, c.size, c.value
FROM memory_items AS i
LEFT JOIN memory_item_cold AS c
       ON i.tier = 'cold' AND c.tenant = i.tenant AND c.namespace = i.namespace AND c.key = i.key
WHERE i.tenant = :tenant AND i.namespace = :namespace AND i.key = :key
  AND (i.expires_at IS NULL OR i.expires_at > :now)

-- name: refresh_memory_item
-- A read under a refresh-on-read policy: the item lives ttl from now.
UPDATE memory_items SET accessed_at = :now,
    expires_at = CASE WHEN ttl IS NULL THEN NULL ELSE :now + ttl END
WHERE tenant = :tenant AND namespace = :namespace AND key = :key
  AND (expires_at IS NULL OR expires_at > :now)

-- name: list_memory_items
SELECT i.tenant, i.namespace, i.key, i.value, i.value_ref, i.metadata, i.index_text, i.version, i.created_at,
       i.updated_at, i.accessed_at, i.ttl, i.expires_at, i.run_id, i.position, i.operation_id, i.actor, i.tier,
       c.codec, c.size, c.value
FROM memory_items AS i
LEFT JOIN memory_item_cold AS c
       ON i.tier = 'cold' AND c.tenant = i.tenant AND c.namespace = i.namespace AND c.key = i.key
WHERE (:tenant IS NULL OR i.tenant = :tenant)
  AND substr(i.namespace, 1, length(:prefix)) = :prefix
  AND (i.expires_at IS NULL OR i.expires_at > :now)
  AND (:run_id IS NULL OR i.run_id = :run_id)
ORDER BY i.tenant, i.namespace, i.key
LIMIT :limit

-- name: delete_memory_items_prefix
DELETE FROM memory_items
WHERE (:tenant IS NULL OR tenant = :tenant) AND substr(namespace, 1, length(:prefix)) = :prefix
RETURNING tenant, namespace, key

-- name: delete_memory_items_of_run
DELETE FROM memory_items WHERE run_id = :run_id AND (:tenant IS NULL OR tenant = :tenant)
RETURNING tenant, namespace, key

-- name: put_memory_run
-- The tenant is the run's, read by the statement (never the caller's).
INSERT INTO memory_run (run_id, key, tenant, value, value_ref, version, created_at, updated_at, position,
                        operation_id, actor)
SELECT run_id, :key, tenant, :value, :value_ref, 1, :now, :now, :position, :operation_id, :actor
FROM runs WHERE run_id = :run_id AND (:tenant IS NULL OR tenant = :tenant)
ON CONFLICT (run_id, key) DO UPDATE SET
    value = excluded.value, value_ref = excluded.value_ref, version = memory_run.version + 1,
    updated_at = excluded.updated_at, position = excluded.position, operation_id = excluded.operation_id,
    actor = excluded.actor
RETURNING version

-- name: delete_memory_run_key
DELETE FROM memory_run WHERE run_id = :run_id AND key = :key

-- name: select_memory_run
SELECT run_id, tenant, key, value, value_ref, version, created_at, updated_at, position, operation_id, actor
FROM memory_run
WHERE run_id = :run_id AND (:key IS NULL OR key = :key) AND (:tenant IS NULL OR tenant = :tenant)
ORDER BY key

-- name: delete_memory_run_of_run
DELETE FROM memory_run WHERE run_id = :run_id AND (:tenant IS NULL OR tenant = :tenant)
RETURNING 1

-- name: delete_memory_run_of_tenant
DELETE FROM memory_run WHERE tenant = :tenant
RETURNING 1

-- name: drop_expired_memory_messages
-- Appending to an expired thread starts a new one: its old messages go first.
DELETE FROM memory_thread_messages
WHERE tenant = :tenant AND thread_id = :thread_id
  AND EXISTS (SELECT 1 FROM memory_threads AS t
              WHERE t.tenant = :tenant AND t.thread_id = :thread_id
                AND t.expires_at IS NOT NULL AND t.expires_at <= :now)

-- name: drop_expired_memory_thread
DELETE FROM memory_threads
WHERE tenant = :tenant AND thread_id = :thread_id AND expires_at IS NOT NULL AND expires_at <= :now

-- name: reserve_memory_thread
-- Take :count indexes at the end of the thread; returns the one after them.
-- A write refreshes the thread's retention (ttl from now).
INSERT INTO memory_threads (tenant, thread_id, next_idx, created_at, updated_at, accessed_at, ttl, expires_at)
VALUES (:tenant, :thread_id, :count, :now, :now, :now, :ttl,
        CASE WHEN :ttl IS NULL THEN NULL ELSE :now + :ttl END)
ON CONFLICT (tenant, thread_id) DO UPDATE SET
    next_idx = memory_threads.next_idx + :count, updated_at = excluded.updated_at,
    accessed_at = excluded.accessed_at, ttl = COALESCE(:ttl, memory_threads.ttl),
    expires_at = CASE WHEN COALESCE(:ttl, memory_threads.ttl) IS NULL THEN NULL
                      ELSE :now + COALESCE(:ttl, memory_threads.ttl) END
RETURNING next_idx

-- name: insert_memory_message
INSERT INTO memory_thread_messages (tenant, thread_id, idx, kind, value, value_ref, created_at, run_id,
                                    position, operation_id, actor, subject)
VALUES (:tenant, :thread_id, :idx, :kind, :value, :value_ref, :now, :run_id, :position, :operation_id,
        :actor,
        COALESCE(:subject, (SELECT r.subject FROM runs AS r WHERE r.run_id = :run_id)))
ON CONFLICT (tenant, thread_id, idx) DO UPDATE SET
    kind = excluded.kind, value = excluded.value, value_ref = excluded.value_ref,
    created_at = excluded.created_at, run_id = excluded.run_id, position = excluded.position,
    operation_id = excluded.operation_id, actor = excluded.actor,
    subject = excluded.subject

-- name: compact_memory_messages
DELETE FROM memory_thread_messages WHERE tenant = :tenant AND thread_id = :thread_id AND idx < :upto - 1

-- name: select_memory_thread
SELECT next_idx FROM memory_threads
WHERE tenant = :tenant AND thread_id = :thread_id AND (expires_at IS NULL OR expires_at > :now)

-- name: refresh_memory_thread
UPDATE memory_threads SET accessed_at = :now,
    expires_at = CASE WHEN ttl IS NULL THEN NULL ELSE :now + ttl END
WHERE tenant = :tenant AND thread_id = :thread_id AND (expires_at IS NULL OR expires_at > :now)

-- name: select_memory_messages
-- The window of a live thread: from index :after + 1, at most :limit.
SELECT tenant, thread_id, idx, kind, value, value_ref, created_at, run_id, position, operation_id, actor
FROM memory_thread_messages AS m
WHERE tenant = :tenant AND thread_id = :thread_id AND idx > :after
  AND EXISTS (SELECT 1 FROM memory_threads AS t
              WHERE t.tenant = m.tenant AND t.thread_id = m.thread_id
                AND (t.expires_at IS NULL OR t.expires_at > :now))
ORDER BY idx
LIMIT :limit

-- name: select_memory_messages_last
-- The last :limit messages of a live thread (newest first: the caller reverses).
SELECT tenant, thread_id, idx, kind, value, value_ref, created_at, run_id, position, operation_id, actor
FROM memory_thread_messages AS m
WHERE tenant = :tenant AND thread_id = :thread_id
  AND EXISTS (SELECT 1 FROM memory_threads AS t
              WHERE t.tenant = m.tenant AND t.thread_id = m.thread_id
                AND (t.expires_at IS NULL OR t.expires_at > :now))
ORDER BY idx DESC
LIMIT :limit

-- name: list_memory_threads
SELECT tenant, thread_id, next_idx, created_at, updated_at, expires_at FROM memory_threads
WHERE (:tenant IS NULL OR tenant = :tenant) AND (expires_at IS NULL OR expires_at > :now)
ORDER BY tenant, thread_id
LIMIT :limit

-- name: delete_memory_messages_of_thread
DELETE FROM memory_thread_messages
WHERE thread_id = :thread_id AND (:tenant IS NULL OR tenant = :tenant)
RETURNING 1

-- name: delete_memory_thread
DELETE FROM memory_threads WHERE thread_id = :thread_id AND (:tenant IS NULL OR tenant = :tenant)

-- name: delete_memory_messages_of_run
DELETE FROM memory_thread_messages WHERE run_id = :run_id AND (:tenant IS NULL OR tenant = :tenant)
RETURNING 1

-- name: delete_memory_messages_of_tenant
DELETE FROM memory_thread_messages WHERE tenant = :tenant
RETURNING 1

-- name: delete_memory_threads_of_tenant
DELETE FROM memory_threads WHERE tenant = :tenant

-- name: sweep_memory_items
-- Expired items (the sweep: they were invisible since they expired).
DELETE FROM memory_items
WHERE (tenant, namespace, key) IN (SELECT tenant, namespace, key FROM memory_items
                                   WHERE expires_at IS NOT NULL AND expires_at <= :now LIMIT :limit)
RETURNING tenant, namespace, key

-- name: sweep_memory_messages
DELETE FROM memory_thread_messages
WHERE (tenant, thread_id) IN (SELECT tenant, thread_id FROM memory_threads
                              WHERE expires_at IS NOT NULL AND expires_at <= :now)
RETURNING 1

-- name: sweep_memory_threads
DELETE FROM memory_threads WHERE expires_at IS NOT NULL AND expires_at <= :now

-- name: select_all_memory_outbox
-- Every outbox row, oldest first (inspection and tests; the embedding
-- worker claims with its own statements).
SELECT tenant, namespace, key, version, created_at, attempts, claimed_by, claimed_until, last_error
FROM memory_outbox ORDER BY id

-- Semantic memory (cairn.store.vectorindex) ---------------------------------------------------
-- The scope of a search, shared by its statements: the tenant's vectors of
-- the namespaces under :prefix, made by :embedder, of the item's current
-- version (a vector of an older version is stale: its item is counted as
-- unindexed instead), not expired, and matching every key of :filter (a
-- JSON object of scalars) with equal type and value. The filter is part of
-- the scan, before ORDER BY ... LIMIT, so it never costs recall.

-- name: search_vectors
SELECT v.namespace, v.key, v.version,
       CASE v.tier WHEN 'hot' THEN vec_distance_cosine(v.embedding, :query)
            ELSE vec_distance_cosine(vec_int8(v.embedding), vec_int8(:query_int8)) END AS distance
FROM memory_vectors AS v
JOIN memory_items AS i ON i.tenant = v.tenant AND i.namespace = v.namespace AND i.key = v.key
WHERE v.tenant = :tenant AND substr(v.namespace, 1, length(:prefix)) = :prefix
  AND (:embedder IS NULL OR v.embedder = :embedder) AND v.dims = :dims AND i.version = v.version
  AND (i.expires_at IS NULL OR i.expires_at > :now)
  AND (:filter IS NULL OR NOT EXISTS (
      SELECT 1 FROM json_each(:filter) AS f
      WHERE NOT EXISTS (
          SELECT 1 FROM json_each(i.metadata) AS m
          WHERE m.key = f.key AND m.atom IS f.atom
            AND (m.type = f.type OR (m.type IN ('integer', 'real') AND f.type IN ('integer', 'real'))))))
ORDER BY distance, v.namespace, v.key
LIMIT :k

-- name: search_nearest_vectors
-- search_vectors without a metadata filter, in two steps: the :candidates
-- vectors in scope nearest the query, from memory_vectors alone, then those
-- whose item is current and not expired. Joining every vector to its item
-- first cost as much as scoring them all (100,000 index seeks); the item
-- check only fails for stale or expiring items, so it is left to the few.
-- The store falls back to search_vectors when fewer than :k survive: taken
-- in the order of the scores, the survivors among the nearest candidates
-- are the nearest survivors overall, so either way the result is exact.
WITH nearest AS MATERIALIZED (
    SELECT v.namespace, v.key, v.version,
           CASE v.tier WHEN 'hot' THEN vec_distance_cosine(v.embedding, :query)
                ELSE vec_distance_cosine(vec_int8(v.embedding), vec_int8(:query_int8)) END AS distance
    FROM memory_vectors AS v
    WHERE v.tenant = :tenant AND substr(v.namespace, 1, length(:prefix)) = :prefix
      AND (:embedder IS NULL OR v.embedder = :embedder) AND v.dims = :dims
    ORDER BY distance, v.namespace, v.key
    LIMIT :candidates)
SELECT n.namespace, n.key, n.version, n.distance
FROM nearest AS n
JOIN memory_items AS i ON i.tenant = :tenant AND i.namespace = n.namespace AND i.key = n.key
WHERE i.version = n.version AND (i.expires_at IS NULL OR i.expires_at > :now)
ORDER BY n.distance, n.namespace, n.key
LIMIT :k

-- name: search_candidates
SELECT v.namespace, v.key, v.version, v.tier, v.scale, v.embedding
FROM memory_vectors AS v
JOIN memory_items AS i ON i.tenant = v.tenant AND i.namespace = v.namespace AND i.key = v.key
WHERE v.tenant = :tenant AND substr(v.namespace, 1, length(:prefix)) = :prefix
  AND (:embedder IS NULL OR v.embedder = :embedder) AND v.dims = :dims AND i.version = v.version
  AND (i.expires_at IS NULL OR i.expires_at > :now)
  AND (:filter IS NULL OR NOT EXISTS (
      SELECT 1 FROM json_each(:filter) AS f
      WHERE NOT EXISTS (
          SELECT 1 FROM json_each(i.metadata) AS m
          WHERE m.key = f.key AND m.atom IS f.atom
            AND (m.type = f.type OR (m.type IN ('integer', 'real') AND f.type IN ('integer', 'real'))))))
  AND (:tier IS NULL OR v.tier = :tier)

-- name: count_unindexed
-- Items in scope with an outbox row newer than their vector (or no vector).
SELECT count(*) FROM (
    SELECT DISTINCT o.namespace, o.key
    FROM memory_outbox AS o
    LEFT JOIN memory_vectors AS v ON v.tenant = o.tenant AND v.namespace = o.namespace AND v.key = o.key
    WHERE o.tenant = :tenant AND substr(o.namespace, 1, length(:prefix)) = :prefix
      AND (v.version IS NULL OR v.version < o.version))

-- name: claim_outbox
-- Up to :limit outbox rows that are ready (never claimed, or their claim or
-- back-off is over), oldest first, claimed under :token until :until. The
-- attempt is counted at the claim, so a worker that dies mid-batch counts too.
UPDATE memory_outbox
SET claimed_by = :token, claimed_until = :until, attempts = attempts + 1
WHERE id IN (SELECT id FROM memory_outbox
             WHERE claimed_until IS NULL OR claimed_until <= :now
             ORDER BY id LIMIT :limit)
RETURNING id, tenant, namespace, key, version, attempts

-- name: outbox_item
SELECT version, index_text FROM memory_items WHERE tenant = :tenant AND namespace = :namespace AND key = :key

-- name: outbox_claimed
SELECT 1 FROM memory_outbox WHERE id = :id AND claimed_by = :token

-- name: upsert_vector
-- The vector of :version, unless one of a newer version is stored already.
INSERT INTO memory_vectors (tenant, namespace, key, version, embedder, dims, tier, embedding, scale,
                            embedded_at)
VALUES (:tenant, :namespace, :key, :version, :embedder, :dims, 'hot', :embedding, NULL, :now)
ON CONFLICT (tenant, namespace, key) DO UPDATE
SET version = excluded.version, embedder = excluded.embedder, dims = excluded.dims, tier = 'hot',
    embedding = excluded.embedding, scale = NULL, embedded_at = excluded.embedded_at
WHERE memory_vectors.version <= excluded.version

-- name: delete_outbox_upto
DELETE FROM memory_outbox WHERE tenant = :tenant AND namespace = :namespace AND key = :key
  AND version <= :version

-- name: delete_outbox_row
DELETE FROM memory_outbox WHERE id = :id

-- name: delete_vector
DELETE FROM memory_vectors WHERE tenant = :tenant AND namespace = :namespace AND key = :key

-- name: fail_outbox
UPDATE memory_outbox SET claimed_by = NULL, claimed_until = :retry_at, last_error = :error
WHERE id = :id AND claimed_by = :token

-- name: drop_vectors
-- An item's vector (:key given: exactly :namespace and :key) or every vector
-- under a namespace prefix (:key NULL), of one tenant.
DELETE FROM memory_vectors
WHERE tenant = :tenant
  AND ((:key IS NULL AND substr(namespace, 1, length(:namespace)) = :namespace)
       OR (namespace = :namespace AND key = :key))

-- name: vectors_to_cool
-- Hot vectors of items nobody touched since :before.
SELECT v.tenant, v.namespace, v.key, v.version, v.embedding
FROM memory_vectors AS v
JOIN memory_items AS i ON i.tenant = v.tenant AND i.namespace = v.namespace AND i.key = v.key
WHERE v.tier = 'hot' AND i.accessed_at < :before
ORDER BY v.tenant, v.namespace, v.key
LIMIT :limit

-- name: cool_vector
UPDATE memory_vectors SET tier = 'cold', embedding = :embedding, scale = :scale
WHERE tenant = :tenant AND namespace = :namespace AND key = :key AND version = :version AND tier = 'hot'

-- name: rewarm_vectors
-- Cold vectors of items touched since :since go back to the embedding
-- worker, which stores them hot again (a restore is a re-embedding: the
-- float32 vector is gone). One outbox row per item at its current version.
INSERT INTO memory_outbox (tenant, namespace, key, version, created_at)
SELECT v.tenant, v.namespace, v.key, v.version, :now
FROM memory_vectors AS v
JOIN memory_items AS i ON i.tenant = v.tenant AND i.namespace = v.namespace AND i.key = v.key
WHERE v.tier = 'cold' AND i.accessed_at >= :since AND i.version = v.version
ON CONFLICT (tenant, namespace, key, version) DO NOTHING
RETURNING 1

-- name: vector_tiers
SELECT tier, count(*), coalesce(sum(length(embedding)), 0)
FROM memory_vectors WHERE (:tenant IS NULL OR tenant = :tenant)
GROUP BY tier ORDER BY tier

-- Cold tier of item values (store/memsql.py, tier_items; migration memory_cold) ----------------
-- An item's value leaves its hot row once nobody read or wrote it since
-- :before, and comes back when it was touched since; each move is one
-- transaction of these statements (the value is compressed in the client).
-- Values under :min_bytes stay hot: their cold row would cost more than they do.

-- name: items_to_cool
SELECT tenant, namespace, key, version, value FROM memory_items
WHERE tier = 'hot' AND value IS NOT NULL AND length(value) >= :min_bytes AND accessed_at < :before
  AND (expires_at IS NULL OR expires_at > :now)
ORDER BY accessed_at
LIMIT :limit

-- name: insert_item_cold
INSERT INTO memory_item_cold (tenant, namespace, key, codec, size, value)
VALUES (:tenant, :namespace, :key, :codec, :size, :value)
ON CONFLICT (tenant, namespace, key) DO UPDATE SET codec = excluded.codec, size = excluded.size,
    value = excluded.value

-- name: cool_item
UPDATE memory_items SET value = NULL, tier = 'cold'
WHERE tenant = :tenant AND namespace = :namespace AND key = :key AND version = :version AND tier = 'hot'
RETURNING 1

-- name: items_to_rewarm
-- Cold items touched (written, or read under refresh-on-read) since :since.
SELECT i.tenant, i.namespace, i.key, i.version, c.codec, c.size, c.value
FROM memory_items AS i
JOIN memory_item_cold AS c ON c.tenant = i.tenant AND c.namespace = i.namespace AND c.key = i.key
WHERE i.tier = 'cold' AND i.accessed_at >= :since
LIMIT :limit

-- name: rewarm_item
-- The trigger memory_items_cold_rewarmed drops the cold copy.
UPDATE memory_items SET value = :value, tier = 'hot'
WHERE tenant = :tenant AND namespace = :namespace AND key = :key AND version = :version AND tier = 'cold'

-- name: item_tiers
-- Items and the bytes of their values per tier: inline bytes of hot rows
-- (offloaded values live in the artifact store), compressed bytes of cold ones.
SELECT i.tier, count(*), coalesce(sum(length(i.value)), 0), coalesce(sum(length(c.value)), 0),
       coalesce(sum(c.size), 0)
FROM memory_items AS i
LEFT JOIN memory_item_cold AS c
       ON i.tier = 'cold' AND c.tenant = i.tenant AND c.namespace = i.namespace AND c.key = i.key
WHERE (:tenant IS NULL OR i.tenant = :tenant)
GROUP BY i.tier ORDER BY i.tier

-- name: select_all_item_cold
-- Every cold copy (inspection and tests: a deletion must leave none behind).
SELECT tenant, namespace, key, codec, size, value FROM memory_item_cold ORDER BY tenant, namespace, key

-- A tenant's own share of a queue (migration 0015).
-- name: lane_shares
SELECT tenant, concurrency, rate_limit, rate_period, rate_burst, tokens, refilled_at
FROM queue_shares WHERE queue = :queue

-- name: select_shares
SELECT queue, tenant, concurrency, rate_limit, rate_period, rate_burst FROM queue_shares
WHERE :tenant IS NULL OR tenant = :tenant ORDER BY queue, tenant

-- A share replaced keeps its bucket while it has a rate (as a queue's
-- limits do); a share without one forgets it, so a later rate starts full.
-- name: upsert_share
INSERT INTO queue_shares (queue, tenant, concurrency, rate_limit, rate_period, rate_burst, updated_at)
VALUES (:queue, :tenant, :concurrency, :rate_limit, :rate_period, :rate_burst, :now)
ON CONFLICT (queue, tenant) DO UPDATE SET
    concurrency = excluded.concurrency, rate_limit = excluded.rate_limit, rate_period = excluded.rate_period,
    rate_burst = excluded.rate_burst,
    tokens = CASE WHEN excluded.rate_limit IS NULL THEN NULL ELSE queue_shares.tokens END,
    refilled_at = CASE WHEN excluded.rate_limit IS NULL THEN NULL ELSE queue_shares.refilled_at END,
    updated_at = excluded.updated_at

-- What a claim spent of one lane's share bucket (admission.charge_shares).
-- name: spend_share_tokens
UPDATE queue_shares SET tokens = :tokens, refilled_at = :at WHERE queue = :queue AND tenant = :tenant

-- name: delete_share
DELETE FROM queue_shares WHERE queue = :queue AND tenant = :tenant

-- LangGraph checkpoints (cairn.store.checkpointsql, migration lg). Every
-- statement names its tenant: another tenant's thread is absent.

-- name: lg_lock_thread
SELECT 1

-- name: lg_put_checkpoint
-- the checkpoint's row: a new one, or its pending row filled in (lg_put_record: its writes kept).
-- Fenced: nothing is written unless the thread's holder is :owner at :epoch
-- (checkpointsql._lg_operate; issue 24, 2026-12-07 afternoon: the holder's SELECT of its own was a
-- statement a write)
INSERT INTO lg_checkpoints (tenant, thread_id, ns, checkpoint_id, parent_id, run_id,
                            checkpoint_kind, checkpoint, metadata_kind, metadata)
SELECT :tenant, :thread_id, :ns, :checkpoint_id, :parent_id, :run_id,
       :checkpoint_kind, :checkpoint, :metadata_kind, :metadata
WHERE EXISTS (SELECT 1 FROM lg_threads
              WHERE tenant = :tenant AND thread_id = :thread_id AND owner = :owner AND epoch = :epoch
                AND collected = :collected)
ON CONFLICT (tenant, thread_id, ns, checkpoint_id) DO UPDATE SET
    parent_id = excluded.parent_id, run_id = excluded.run_id,
    checkpoint_kind = excluded.checkpoint_kind, checkpoint = excluded.checkpoint,
    metadata_kind = excluded.metadata_kind, metadata = excluded.metadata

-- name: lg_fold_writes
-- a put moves its parent's pending writes out of lg_writes, to fold them into the parent's
-- row (checkpointsql._lg_fold): only a parent that is stored and not folded yet
DELETE FROM lg_writes
WHERE tenant = :tenant AND thread_id = :thread_id AND ns = :ns AND checkpoint_id = :checkpoint_id
  AND EXISTS (SELECT 1 FROM lg_checkpoints AS c
              WHERE c.tenant = :tenant AND c.thread_id = :thread_id AND c.ns = :ns
                AND c.checkpoint_id = :checkpoint_id AND c.writes IS NULL)
RETURNING task_id, idx, channel, task_path, kind, refs

-- name: lg_set_folded
UPDATE lg_checkpoints SET writes = :folded
WHERE tenant = :tenant AND thread_id = :thread_id AND ns = :ns AND checkpoint_id = :checkpoint_id
  AND writes IS NULL

-- name: lg_put_value
INSERT INTO lg_values (tenant, thread_id, digest, kind, data)
VALUES (:tenant, :thread_id, :digest, :kind, :data)
ON CONFLICT (tenant, thread_id, digest) DO NOTHING

-- name: lg_blob_depth
SELECT depth FROM lg_blobs
WHERE tenant = :tenant AND thread_id = :thread_id AND ns = :ns AND channel = :channel AND version = :version

-- name: lg_put_blob
-- a channel version in one statement (issue 24, 2026-12-07: it read its base's depth in a
-- statement of its own before): a list naming a base still stored whose chain is below
-- max_depth keeps its base and holds only its added items, else it is whole (as PostgreSQL's
-- lg_put_blobs_many); WHERE true: SQLite's upsert after a SELECT needs a WHERE clause
INSERT INTO lg_blobs (tenant, thread_id, ns, channel, version, kind, base, depth, refs)
SELECT :tenant, :thread_id, :ns, :channel, :version, :kind,
       CASE WHEN b.depth + 1 < :max_depth THEN :base END,
       CASE WHEN b.depth + 1 < :max_depth THEN b.depth + 1 ELSE 0 END,
       CASE WHEN b.depth + 1 < :max_depth THEN :added ELSE :refs END
FROM (SELECT (SELECT x.depth FROM lg_blobs AS x
              WHERE x.tenant = :tenant AND x.thread_id = :thread_id AND x.ns = :ns
                AND x.channel = :channel AND x.version = :base AND :base <> :version) AS depth) AS b
WHERE true
ON CONFLICT (tenant, thread_id, ns, channel, version) DO UPDATE SET
    kind = excluded.kind, base = excluded.base, depth = excluded.depth, refs = excluded.refs

-- name: lg_put_record
-- a put_writes' record (checkpointsql.fold_writes) appended to its checkpoint's writes: to the
-- checkpoint's row when it is stored, else to its *pending* row (checkpoint_kind '': the writes of a
-- checkpoint not stored yet, which no query but the writes' reads, lg_writes_of, and which its put
-- fills in, lg_put_checkpoint). unfold_writes reads the records in order, a regular write kept as
-- first written, a special one as last written, as lg_writes kept its rows. Fenced, as
-- lg_put_checkpoint: no row changed unless the thread's holder is :owner at :epoch. (Issue 24,
-- 2026-12-07 afternoon: under LangGraph's default durability a super-step's writes were three rows
-- of lg_writes, inserted, then deleted by the put: two statements and two tables' pages a step more.)
INSERT INTO lg_checkpoints (tenant, thread_id, ns, checkpoint_id, checkpoint_kind, checkpoint,
                            metadata_kind, metadata, writes)
SELECT :tenant, :thread_id, :ns, :checkpoint_id, '', x'', '', x'', :record
WHERE EXISTS (SELECT 1 FROM lg_threads
              WHERE tenant = :tenant AND thread_id = :thread_id AND owner = :owner AND epoch = :epoch
                AND collected = :collected)
ON CONFLICT (tenant, thread_id, ns, checkpoint_id) DO UPDATE SET
    writes = CAST(coalesce(lg_checkpoints.writes, x'') || excluded.writes AS BLOB)  -- || makes text

-- name: lg_delete_pending
-- the thread's pending rows (lg_put_record), as lg_delete_orphan_writes its rows of lg_writes: but
-- those after their namespace's latest checkpoint, a super-step whose checkpoint's put is still to
-- come, a writer in flight (dropping them collected the values they name, which that writer's saver
-- still took for stored)
DELETE FROM lg_checkpoints
WHERE tenant = :tenant AND thread_id = :thread_id AND checkpoint_kind = ''
  AND NOT coalesce(checkpoint_id > (SELECT max(c.checkpoint_id) FROM lg_checkpoints AS c
                                    WHERE c.tenant = lg_checkpoints.tenant
                                      AND c.thread_id = lg_checkpoints.thread_id
                                      AND c.ns = lg_checkpoints.ns AND c.checkpoint_kind <> ''), false)

-- name: lg_latest_checkpoint
SELECT thread_id, ns, checkpoint_id, parent_id, checkpoint_kind, checkpoint, metadata_kind, metadata
FROM lg_checkpoints
WHERE tenant = :tenant AND thread_id = :thread_id AND ns = :ns AND checkpoint_kind <> ''  -- not pending
ORDER BY checkpoint_id DESC LIMIT 1

-- name: lg_checkpoint
SELECT thread_id, ns, checkpoint_id, parent_id, checkpoint_kind, checkpoint, metadata_kind, metadata
FROM lg_checkpoints
WHERE tenant = :tenant AND thread_id = :thread_id AND ns = :ns AND checkpoint_id = :checkpoint_id
  AND checkpoint_kind <> ''

-- name: lg_list_checkpoints
SELECT thread_id, ns, checkpoint_id, parent_id, checkpoint_kind, checkpoint, metadata_kind, metadata
FROM lg_checkpoints
WHERE tenant = :tenant AND (:thread_id IS NULL OR thread_id = :thread_id) AND (:ns IS NULL OR ns = :ns)
  AND (:checkpoint_id IS NULL OR checkpoint_id = :checkpoint_id) AND (:before IS NULL OR checkpoint_id < :before)
  AND checkpoint_kind <> ''
ORDER BY thread_id, ns, checkpoint_id DESC
LIMIT coalesce(:limit, -1)

-- name: lg_list_thread
-- a page of one thread's namespace, newest first, walked down its primary key from the
-- end (the catch-all lg_list_checkpoints sorted every checkpoint of the tenant: 4.7 ms a
-- first page at 3,000 checkpoints)
SELECT thread_id, ns, checkpoint_id, parent_id, checkpoint_kind, checkpoint, metadata_kind, metadata
FROM lg_checkpoints
WHERE tenant = :tenant AND thread_id = :thread_id AND ns = :ns AND checkpoint_kind <> ''
ORDER BY checkpoint_id DESC
LIMIT coalesce(:limit, -1)

-- name: lg_list_thread_before
SELECT thread_id, ns, checkpoint_id, parent_id, checkpoint_kind, checkpoint, metadata_kind, metadata
FROM lg_checkpoints
WHERE tenant = :tenant AND thread_id = :thread_id AND ns = :ns AND checkpoint_id < :before
  AND checkpoint_kind <> ''
ORDER BY checkpoint_id DESC
LIMIT coalesce(:limit, -1)

-- name: lg_blob_chains
-- each asked channel's version and the bases below it, by channel, the oldest first
-- (:channels and :versions are JSON arrays of the same length, paired by position;
-- CROSS JOIN keeps SQLite from scanning the thread's blobs to match them)
WITH RECURSIVE wanted (channel, version) AS (
    SELECT c.value, v.value FROM json_each(:channels) AS c JOIN json_each(:versions) AS v ON v.key = c.key
), chain (channel, kind, base, depth, refs) AS (
    SELECT b.channel, b.kind, b.base, b.depth, b.refs FROM wanted AS w CROSS JOIN lg_blobs AS b
      ON b.tenant = :tenant AND b.thread_id = :thread_id AND b.ns = :ns AND b.channel = w.channel
     AND b.version = w.version
    UNION ALL
    SELECT b.channel, b.kind, b.base, b.depth, b.refs FROM chain AS c CROSS JOIN lg_blobs AS b
      ON b.tenant = :tenant AND b.thread_id = :thread_id AND b.ns = :ns AND b.channel = c.channel
     AND b.version = c.base
)
SELECT channel, kind, base, depth, refs FROM chain ORDER BY channel, depth

-- name: lg_values
SELECT digest, kind, data FROM lg_values
WHERE tenant = :tenant AND thread_id = :thread_id AND digest IN (SELECT value FROM json_each(:digests))

-- name: lg_writes_of
-- the checkpoint's folded writes (a row with NULL task id: checkpointsql.read_writes), then
-- its rows of lg_writes
SELECT NULL AS task_id, NULL AS idx, NULL AS channel, NULL AS task_path, NULL AS kind, writes AS refs
FROM lg_checkpoints
WHERE tenant = :tenant AND thread_id = :thread_id AND ns = :ns AND checkpoint_id = :checkpoint_id
  AND writes IS NOT NULL
UNION ALL
SELECT task_id, idx, channel, task_path, kind, refs FROM lg_writes
WHERE tenant = :tenant AND thread_id = :thread_id AND ns = :ns AND checkpoint_id = :checkpoint_id
ORDER BY task_path, task_id, idx

-- name: lg_delete_thread_checkpoints
DELETE FROM lg_checkpoints WHERE tenant = :tenant AND thread_id = :thread_id

-- name: lg_delete_thread_blobs
DELETE FROM lg_blobs WHERE tenant = :tenant AND thread_id = :thread_id

-- name: lg_delete_thread_writes
DELETE FROM lg_writes WHERE tenant = :tenant AND thread_id = :thread_id

-- name: lg_delete_thread_values
DELETE FROM lg_values WHERE tenant = :tenant AND thread_id = :thread_id

-- name: lg_delete_runs
DELETE FROM lg_checkpoints WHERE tenant = :tenant AND run_id IN (SELECT value FROM json_each(:run_ids))
RETURNING thread_id

-- name: lg_delete_older
-- every checkpoint of the thread but the latest of each namespace (pending rows: lg_delete_pending)
DELETE FROM lg_checkpoints
WHERE tenant = :tenant AND thread_id = :thread_id
  AND checkpoint_id < (SELECT max(c.checkpoint_id) FROM lg_checkpoints AS c
                       WHERE c.tenant = lg_checkpoints.tenant AND c.thread_id = lg_checkpoints.thread_id
                         AND c.ns = lg_checkpoints.ns AND c.checkpoint_kind <> '')

-- name: lg_delete_orphan_writes
-- rows of lg_writes of checkpoints not stored (a prune's, delete_for_runs'), but those after their
-- namespace's latest checkpoint (as lg_delete_pending)
DELETE FROM lg_writes
WHERE tenant = :tenant AND thread_id = :thread_id
  AND NOT EXISTS (SELECT 1 FROM lg_checkpoints AS c
                  WHERE c.tenant = lg_writes.tenant AND c.thread_id = lg_writes.thread_id
                    AND c.ns = lg_writes.ns AND c.checkpoint_id = lg_writes.checkpoint_id
                    AND c.checkpoint_kind <> '')
  AND NOT coalesce(checkpoint_id > (SELECT max(c.checkpoint_id) FROM lg_checkpoints AS c
                                    WHERE c.tenant = lg_writes.tenant AND c.thread_id = lg_writes.thread_id
                                      AND c.ns = lg_writes.ns AND c.checkpoint_kind <> ''), false)

-- name: lg_thread_checkpoints
SELECT ns, checkpoint_id, checkpoint_kind, checkpoint FROM lg_checkpoints
WHERE tenant = :tenant AND thread_id = :thread_id AND checkpoint_kind <> ''  -- pending rows: writes only

-- name: lg_thread_blobs
SELECT ns, channel, version, base FROM lg_blobs WHERE tenant = :tenant AND thread_id = :thread_id

-- name: lg_delete_blob
DELETE FROM lg_blobs
WHERE tenant = :tenant AND thread_id = :thread_id AND ns = :ns AND channel = :channel AND version = :version

-- name: lg_thread_refs
-- every packed digest list of the thread (and, with their checkpoint id, its folded writes,
-- pending rows' included)
SELECT refs, NULL FROM lg_blobs WHERE tenant = :tenant AND thread_id = :thread_id
UNION ALL
SELECT refs, NULL FROM lg_writes WHERE tenant = :tenant AND thread_id = :thread_id
UNION ALL
SELECT writes, checkpoint_id FROM lg_checkpoints
WHERE tenant = :tenant AND thread_id = :thread_id AND writes IS NOT NULL

-- name: lg_thread_digests
-- every value of the thread, and whether it is a compression dictionary (cairn.lgdictionary)
SELECT digest, kind = 'lgdict' FROM lg_values WHERE tenant = :tenant AND thread_id = :thread_id

-- name: lg_dictionary
SELECT digest, data FROM lg_values
WHERE tenant = :tenant AND thread_id = :thread_id AND digest = :digest AND kind = 'lgdict'

-- name: lg_first_dictionary
SELECT digest, data FROM lg_values WHERE tenant = :tenant AND thread_id = :thread_id AND kind = 'lgdict'
ORDER BY digest LIMIT 1

-- name: lg_delete_value
DELETE FROM lg_values WHERE tenant = :tenant AND thread_id = :thread_id AND digest = :digest

-- name: lg_copy_checkpoints
INSERT INTO lg_checkpoints (tenant, thread_id, ns, checkpoint_id, parent_id, run_id,
                            checkpoint_kind, checkpoint, metadata_kind, metadata, writes)
SELECT tenant, :target, ns, checkpoint_id, parent_id, run_id, checkpoint_kind, checkpoint, metadata_kind, metadata,
       writes
FROM lg_checkpoints WHERE tenant = :tenant AND thread_id = :source
-- a row the target has is kept, but for a pending one (a copy made before the source's put): the
-- source's row replaces it, so a copy made again once the checkpoint is stored brings it over
ON CONFLICT (tenant, thread_id, ns, checkpoint_id) DO UPDATE SET
    parent_id = excluded.parent_id, run_id = excluded.run_id, checkpoint_kind = excluded.checkpoint_kind,
    checkpoint = excluded.checkpoint, metadata_kind = excluded.metadata_kind, metadata = excluded.metadata,
    writes = excluded.writes
WHERE lg_checkpoints.checkpoint_kind = ''

-- name: lg_copy_blobs
INSERT INTO lg_blobs (tenant, thread_id, ns, channel, version, kind, base, depth, refs)
SELECT tenant, :target, ns, channel, version, kind, base, depth, refs
FROM lg_blobs WHERE tenant = :tenant AND thread_id = :source
ON CONFLICT (tenant, thread_id, ns, channel, version) DO NOTHING

-- name: lg_copy_writes
INSERT INTO lg_writes (tenant, thread_id, ns, checkpoint_id, task_id, idx, channel, task_path, kind, refs)
SELECT tenant, :target, ns, checkpoint_id, task_id, idx, channel, task_path, kind, refs
FROM lg_writes WHERE tenant = :tenant AND thread_id = :source
ON CONFLICT (tenant, thread_id, ns, checkpoint_id, task_id, idx) DO NOTHING

-- name: lg_copy_values
INSERT INTO lg_values (tenant, thread_id, digest, kind, data)
SELECT tenant, :target, digest, kind, data
FROM lg_values WHERE tenant = :tenant AND thread_id = :source
ON CONFLICT (tenant, thread_id, digest) DO NOTHING

-- name: lg_thread_holder
SELECT owner, epoch, collected FROM lg_threads WHERE tenant = :tenant AND thread_id = :thread_id

-- name: lg_thread_count
-- the thread's collection count, read by a saver's first write before it reads anything else
-- of the thread (CairnSaver._expecting); no row: checkpointsql.NO_ROW
SELECT collected FROM lg_threads WHERE tenant = :tenant AND thread_id = :thread_id

-- name: lg_count_collection
-- a prune or delete_for_runs collected the thread's rows (checkpointsql._lg_collect, migration
-- 0032); a thread nobody holds (a copy_thread target never written) gets a row owned by
-- nobody (checkpointsql.NOBODY, seventh session), so the collection counts there too
INSERT INTO lg_threads (tenant, thread_id, owner, epoch, collected)
VALUES (:tenant, :thread_id, '', 0, 1)
ON CONFLICT (tenant, thread_id) DO UPDATE SET collected = lg_threads.collected + 1

-- name: lg_take_thread
INSERT INTO lg_threads (tenant, thread_id, owner, epoch) VALUES (:tenant, :thread_id, :owner, :epoch)
ON CONFLICT (tenant, thread_id) DO UPDATE SET owner = excluded.owner, epoch = excluded.epoch

-- name: lg_delete_thread_holder
DELETE FROM lg_threads WHERE tenant = :tenant AND thread_id = :thread_id

-- == Encryption at rest: data keys (cairn.store.keysql, migration data_keys) ======================
-- name: select_data_keys
SELECT tenant, version, kek_id, wrapped, created_at, subject FROM data_keys
WHERE (:tenant IS NULL OR tenant = :tenant)
ORDER BY tenant, version

-- name: insert_data_key
INSERT INTO data_keys (tenant, version, kek_id, wrapped, created_at)
VALUES (:tenant, :version, :kek_id, :wrapped, :created_at)
ON CONFLICT (tenant, version) DO NOTHING

-- name: rewrap_data_key
UPDATE data_keys SET kek_id = :kek_id, wrapped = :wrapped
WHERE tenant = :tenant AND version = :version AND kek_id = :old_kek_id

-- Re-encryption after a rotation (cairn.store.rekey): pages of a tenant's
-- sealed columns by key, and compare-and-set writes of their new envelopes
-- (a row changed since it was read is left for the next pass: a holder's
-- write always wins). A spilled history payload (history_payloads) comes
-- with its row's link, and is written back there.
-- name: rekey_runs_page
SELECT run_id, input, result, error FROM runs
WHERE tenant = :tenant AND run_id > :after ORDER BY run_id LIMIT :limit

-- name: rekey_run_set
UPDATE runs SET input = :input, result = :result, error = :error
WHERE run_id = :run_id AND input IS :old_input AND result IS :old_result AND error IS :old_error

-- name: rekey_history_page
SELECT h.run_id, h.seq, h.position, h.payload, p.data, h.detail FROM history AS h
LEFT JOIN history_payloads AS p
  ON substr(h.payload, 1, 2) = X'0002' AND p.id = CAST(substr(h.payload, 3) AS INTEGER)
WHERE h.tenant = :tenant AND (h.run_id > :after_run OR (h.run_id = :after_run AND h.seq > :after_seq))
  AND (h.payload IS NOT NULL OR h.detail IS NOT NULL)
ORDER BY h.run_id, h.seq LIMIT :limit

-- name: rekey_history_set
UPDATE history SET payload = :payload, detail = :detail
WHERE run_id = :run_id AND seq = :seq AND payload IS :old_payload AND detail IS :old_detail

-- name: rekey_spilled_set
UPDATE history_payloads SET data = :payload
WHERE id = CAST(substr(:link, 3) AS INTEGER) AND data = :old_payload

-- name: rekey_mailbox_page
SELECT run_id, seq, key, payload FROM mailbox
WHERE tenant = :tenant AND (run_id > :after_run OR (run_id = :after_run AND seq > :after_seq))
  AND payload IS NOT NULL
ORDER BY run_id, seq LIMIT :limit

-- name: rekey_mailbox_set
UPDATE mailbox SET payload = :payload WHERE run_id = :run_id AND seq = :seq AND payload = :old_payload

-- name: rekey_items_page
SELECT namespace, key, value, index_text FROM memory_items
WHERE tenant = :tenant AND (namespace > :after_ns OR (namespace = :after_ns AND key > :after_key))
  AND (value IS NOT NULL OR index_text IS NOT NULL)
ORDER BY namespace, key LIMIT :limit

-- name: rekey_item_set
UPDATE memory_items SET value = :value, index_text = :index_text
WHERE tenant = :tenant AND namespace = :namespace AND key = :key
  AND value IS :old_value AND index_text IS :old_index_text

-- name: rekey_run_memory_page
SELECT run_id, key, value FROM memory_run
WHERE tenant = :tenant AND (run_id > :after_run OR (run_id = :after_run AND key > :after_key))
  AND value IS NOT NULL
ORDER BY run_id, key LIMIT :limit

-- name: rekey_run_memory_set
UPDATE memory_run SET value = :value WHERE run_id = :run_id AND key = :key AND value = :old_value

-- name: rekey_thread_page
SELECT thread_id, idx, value FROM memory_thread_messages
WHERE tenant = :tenant AND (thread_id > :after_thread OR (thread_id = :after_thread AND idx > :after_idx))
  AND value IS NOT NULL
ORDER BY thread_id, idx LIMIT :limit

-- name: rekey_thread_set
UPDATE memory_thread_messages SET value = :value
WHERE tenant = :tenant AND thread_id = :thread_id AND idx = :idx AND value = :old_value

-- name: rekey_cold_page
SELECT namespace, key, codec, size, value FROM memory_item_cold
WHERE tenant = :tenant AND (namespace > :after_ns OR (namespace = :after_ns AND key > :after_key))
ORDER BY namespace, key LIMIT :limit

-- name: rekey_cold_set
UPDATE memory_item_cold SET codec = :codec, size = :size, value = :value
WHERE tenant = :tenant AND namespace = :namespace AND key = :key AND value = :old_value

-- The artifacts a tenant's rows name, by ref (cairn keys status counts their key versions).
-- name: rekey_artifact_refs_page
SELECT ref FROM (
    SELECT input_ref AS ref FROM runs WHERE tenant = :tenant AND input_ref IS NOT NULL
    UNION SELECT result_ref FROM runs WHERE tenant = :tenant AND result_ref IS NOT NULL
    UNION SELECT payload_ref FROM history WHERE tenant = :tenant AND payload_ref IS NOT NULL
    UNION SELECT payload_ref FROM mailbox WHERE tenant = :tenant AND payload_ref IS NOT NULL
    UNION SELECT value_ref FROM memory_items WHERE tenant = :tenant AND value_ref IS NOT NULL
    UNION SELECT value_ref FROM memory_run WHERE tenant = :tenant AND value_ref IS NOT NULL
    UNION SELECT value_ref FROM memory_thread_messages WHERE tenant = :tenant AND value_ref IS NOT NULL
) AS refs
WHERE ref > :after ORDER BY ref LIMIT :limit

-- name: rekey_approvals_page
SELECT run_id, request_id, comment FROM approvals
WHERE tenant = :tenant AND (run_id > :after_run OR (run_id = :after_run AND request_id > :after_request))
  AND comment IS NOT NULL
ORDER BY run_id, request_id LIMIT :limit

-- name: rekey_approval_set
UPDATE approvals SET comment = :comment
WHERE run_id = :run_id AND request_id = :request_id AND comment = :old_comment

-- Every tenant with runs, memory or LangGraph checkpoints: what turning encryption on for an
-- existing database seals.
-- name: rekey_tenants_page
SELECT tenant FROM (SELECT tenant FROM runs UNION SELECT tenant FROM memory_items
                    UNION SELECT tenant FROM memory_threads UNION SELECT tenant FROM memory_run
                    UNION SELECT tenant FROM lg_values UNION SELECT tenant FROM lg_checkpoints)
WHERE tenant > :after ORDER BY tenant LIMIT :limit

-- name: insert_subject_key
-- A subject's data key (a version above SUBJECT_KEY_BASE): nothing if the version is taken or the
-- subject has a live key already (data_keys_live_subject); the caller reads back which.
INSERT INTO data_keys (tenant, version, kek_id, wrapped, created_at, subject)
VALUES (:tenant, :version, :kek_id, :wrapped, :created_at, :subject)
ON CONFLICT DO NOTHING

-- name: erase_subject_keys
-- Crypto-shredding: a subject's keys become tombstones (their versions never reused).
UPDATE data_keys SET kek_id = 'erased', wrapped = x''
WHERE tenant = :tenant AND subject = :subject AND kek_id <> 'erased'
RETURNING version

-- name: erase_tenant_subject_keys
-- Crypto-shredding: every subject key of a tenant becomes a tombstone.
UPDATE data_keys SET kek_id = 'erased', wrapped = x''
WHERE tenant = :tenant AND subject IS NOT NULL AND kek_id <> 'erased'
RETURNING version

-- name: delete_data_key
DELETE FROM data_keys WHERE tenant = :tenant AND version = :version

-- Whether any row names an artifact (adopting a plaintext database does not seal artifacts yet).
-- name: rekey_any_artifact_page
SELECT 1 WHERE EXISTS (SELECT 1 FROM runs WHERE input_ref IS NOT NULL OR result_ref IS NOT NULL)
  OR EXISTS (SELECT 1 FROM history WHERE payload_ref IS NOT NULL)
  OR EXISTS (SELECT 1 FROM mailbox WHERE payload_ref IS NOT NULL)
  OR EXISTS (SELECT 1 FROM memory_items WHERE value_ref IS NOT NULL)
  OR EXISTS (SELECT 1 FROM memory_run WHERE value_ref IS NOT NULL)
  OR EXISTS (SELECT 1 FROM memory_thread_messages WHERE value_ref IS NOT NULL)

-- Workspace objects (cairn.store.wssql, migration workspaces) ------------------------------

-- name: ws_run_tenant
SELECT tenant FROM runs WHERE run_id = :run_id

-- name: ws_put_object
-- storing an object again counts as storing it (stored_at: the collector's fence)
INSERT INTO workspace_objects (tenant, oid, data, stored_at)
VALUES (:tenant, :oid, :data, :now)
ON CONFLICT (tenant, oid) DO UPDATE SET stored_at = max(stored_at, excluded.stored_at)

-- name: ws_objects
SELECT oid, data FROM workspace_objects
WHERE tenant = :tenant AND oid IN (SELECT value FROM json_each(:oids))

-- Re-encryption of a tenant's workspace objects (cairn.store.rekey): at
-- addresses that survive it, so each is rewritten in place, compare-and-set.
-- name: rekey_ws_page
SELECT oid, data FROM workspace_objects WHERE tenant = :tenant AND oid > :after ORDER BY oid LIMIT :limit

-- name: rekey_ws_set
UPDATE workspace_objects SET data = :data WHERE tenant = :tenant AND oid = :oid AND data = :old_data

-- LangGraph checkpoints (cairn.langgraph.CairnSaver): a tenant's values and checkpoints by key
-- (:first: from the start, where a thread id or namespace may be empty), each rewritten in
-- place, compare-and-set. Their rows and digests stay: the places name them.
-- name: rekey_lg_values_page
SELECT thread_id, digest, data FROM lg_values
WHERE tenant = :tenant
  AND (:first OR thread_id > :after_thread OR (thread_id = :after_thread AND digest > :after_digest))
ORDER BY thread_id, digest LIMIT :limit

-- name: rekey_lg_value_set
UPDATE lg_values SET data = :data
WHERE tenant = :tenant AND thread_id = :thread_id AND digest = :digest AND data = :old_data

-- name: rekey_lg_checkpoints_page
SELECT thread_id, ns, checkpoint_id, checkpoint, metadata FROM lg_checkpoints
WHERE tenant = :tenant AND checkpoint_kind <> ''  -- a pending row (lg_put_record) holds no checkpoint
  AND (:first OR thread_id > :after_thread OR (thread_id = :after_thread AND ns > :after_ns)
       OR (thread_id = :after_thread AND ns = :after_ns AND checkpoint_id > :after_id))
ORDER BY thread_id, ns, checkpoint_id LIMIT :limit

-- name: rekey_lg_checkpoint_set
UPDATE lg_checkpoints SET checkpoint = :checkpoint, metadata = :metadata
WHERE tenant = :tenant AND thread_id = :thread_id AND ns = :ns AND checkpoint_id = :checkpoint_id
  AND checkpoint = :old_checkpoint AND metadata = :old_metadata

-- The audit chain (issue 26; cairn/store/auditlinks.py). The entry before
-- the one a store appends: its time (the clamp) and its link.
-- name: audit_previous
SELECT at, link FROM history WHERE run_id = ?1 AND seq = ?2

-- Entries written without their link in the transaction in progress (the
-- partial index holds nothing else), each with the stored link before it.
-- name: audit_unlinked
SELECT h.run_id, h.seq, h.event, h.at, h.epoch, h.worker, h.position, h.step_kind, h.name, h.input_hash,
       h.attempt, h.started_at,
       CASE WHEN substr(h.payload, 1, 2) = X'0002'
            THEN (SELECT p.data FROM history_payloads AS p WHERE p.id = CAST(substr(h.payload, 3) AS INTEGER))
            ELSE h.payload END,
       h.payload_ref, h.detail, h.digest,
       (SELECT b.link FROM history AS b WHERE b.run_id = h.run_id AND b.seq = h.seq - 1), h.tenant
FROM history AS h WHERE h.link = X'' ORDER BY h.run_id, h.seq

-- name: audit_set_link
UPDATE history SET digest = ?3, link = ?4 WHERE run_id = ?1 AND seq = ?2

-- A page of entries as the audit verifier reads them (after a key, in
-- (run_id, seq) order; one tenant's or one run's).
-- name: audit_entries
SELECT h.run_id, h.seq, h.event, h.at, h.epoch, h.worker, h.position, h.step_kind, h.name, h.input_hash,
       h.attempt, h.started_at,
       CASE WHEN substr(h.payload, 1, 2) = X'0002'
            THEN (SELECT p.data FROM history_payloads AS p WHERE p.id = CAST(substr(h.payload, 3) AS INTEGER))
            ELSE h.payload END,
       h.payload_ref, h.detail, h.digest, h.link, h.tenant
FROM history AS h
WHERE (h.run_id, h.seq) > (:after_run, :after_seq)
  AND (:tenant IS NULL OR h.tenant = :tenant) AND (:run_id IS NULL OR h.run_id = :run_id)
ORDER BY h.run_id, h.seq LIMIT :page

-- The audit log's hot entries (``store.auditsql.audit_log_rows``): a
-- tenant's are its hot runs' merged, each run opened only once the merge
-- reaches where its entries start, no index on history by time (it would
-- cost every journaled step). A run's entries are in time order by seq
-- (each clamped to the one before) and none is before its run's created_at.
-- The hot runs of a tenant with an entry at or after :at (the last one: a
-- primary key probe; an archived run has none), in created order, a page at
-- a time (runs_tenant_created).
-- name: audit_log_runs_oldest
SELECT r.run_id, r.created_at FROM runs AS r
WHERE r.tenant = :tenant
  AND r.created_at >= :after_created AND (r.created_at > :after_created OR r.run_id > :after_run)
  AND (SELECT h.at FROM history AS h WHERE h.run_id = r.run_id ORDER BY h.seq DESC LIMIT 1) >= :at
ORDER BY r.created_at, r.run_id LIMIT :page

-- Newest first: the tenant's runs created by :at, each with its last
-- entry's time (NULL: archived, no hot entry), ordered by the caller.
-- name: audit_log_runs_newest
SELECT r.run_id, (SELECT h.at FROM history AS h WHERE h.run_id = r.run_id ORDER BY h.seq DESC LIMIT 1)
FROM runs AS r WHERE r.tenant = :tenant AND r.created_at <= :at

-- One run's entries past a position, by seq (its time order) from :seq on,
-- a page at a time (the primary key; of a tenant, or any).
-- name: audit_log_run_oldest
SELECT h.run_id, h.seq, h.event, h.at, h.epoch, h.worker, h.detail, h.tenant
FROM history AS h
WHERE h.run_id = :run_id AND h.seq > :seq AND (:tenant IS NULL OR h.tenant = :tenant)
  AND (h.at, h.run_id, h.seq) > (:at, :after_run, :after_seq)
ORDER BY h.seq LIMIT :page

-- name: audit_log_run_newest
SELECT h.run_id, h.seq, h.event, h.at, h.epoch, h.worker, h.detail, h.tenant
FROM history AS h
WHERE h.run_id = :run_id AND h.seq < :seq AND (:tenant IS NULL OR h.tenant = :tenant) AND h.at >= :since
  AND (h.at, h.run_id, h.seq) < (:at, :after_run, :after_seq)
ORDER BY h.seq DESC LIMIT :page

-- The tenants with runs, one index seek each (the log of every tenant merges
-- one stream per tenant).
-- name: audit_log_tenants
WITH RECURSIVE t(tenant) AS (
    SELECT MIN(tenant) FROM runs
    UNION ALL
    SELECT (SELECT MIN(r.tenant) FROM runs AS r WHERE r.tenant > t.tenant) FROM t WHERE t.tenant IS NOT NULL
)
SELECT tenant FROM t WHERE tenant IS NOT NULL

-- name: audit_store_digest
UPDATE history SET digest = :digest WHERE run_id = :run_id AND seq = :seq AND digest IS NULL

-- name: audit_run_tenants
SELECT run_id, tenant FROM runs WHERE (:tenant IS NULL OR tenant = :tenant) AND (:run_id IS NULL OR run_id = :run_id)

-- name: insert_audit_checkpoint
INSERT INTO audit_checkpoints (tenant, id, at, record)
SELECT :tenant, COALESCE(MAX(id), 0) + 1, :at, :record FROM audit_checkpoints WHERE tenant = :tenant
RETURNING id

-- name: audit_checkpoints
SELECT tenant, id, at, record FROM audit_checkpoints WHERE (:tenant IS NULL OR tenant = :tenant) ORDER BY tenant, id

-- name: audit_legacy
SELECT run_id, last_seq FROM audit_legacy
-- name: ws_tenants
SELECT DISTINCT tenant FROM workspace_objects ORDER BY tenant

-- name: ws_roots
SELECT DISTINCT json_extract(h.detail, '$.workspace')
FROM history AS h JOIN runs AS r ON r.run_id = h.run_id
WHERE r.tenant = :tenant AND h.detail IS NOT NULL AND json_type(h.detail, '$.workspace') = 'text'

-- name: ws_sealed_detail
SELECT h.run_id FROM history AS h JOIN runs AS r ON r.run_id = h.run_id
WHERE r.tenant = :tenant AND h.detail IS NOT NULL AND json_type(h.detail, '$.sealed') IS NOT NULL
LIMIT 1

-- name: ws_sealed_entries
SELECT h.run_id, h.seq FROM history AS h JOIN runs AS r ON r.run_id = h.run_id
WHERE r.tenant = :tenant AND h.detail IS NOT NULL AND json_type(h.detail, '$.sealed') IS NOT NULL
ORDER BY h.run_id, h.seq

-- name: ws_candidates
SELECT oid FROM workspace_objects
WHERE tenant = :tenant AND oid > :after AND stored_at < :before
ORDER BY oid LIMIT :limit

-- name: ws_delete
DELETE FROM workspace_objects
WHERE tenant = :tenant AND oid IN (SELECT value FROM json_each(:oids)) AND stored_at < :before

-- Erasure (cairn.api.erasure) -------------------------------------------------------------------

-- name: erasure_runs
-- The runs an erasure covers: a tenant's runs of one subject, of one thread, or all of them.
SELECT run_id, status, parent_run_id FROM runs
WHERE tenant = :tenant AND (:subject IS NULL OR subject = :subject) AND (:thread_id IS NULL OR thread_id = :thread_id)

-- name: delete_memory_items_of_subject
DELETE FROM memory_items WHERE tenant = :tenant AND subject = :subject
RETURNING tenant, namespace, key

-- name: delete_memory_messages_of_subject
DELETE FROM memory_thread_messages WHERE tenant = :tenant AND subject = :subject
RETURNING 1

-- name: insert_erasure
INSERT INTO erasures (id, tenant, scope, digest, actor, started_at)
VALUES (:id, :tenant, :scope, :digest, :actor, :now)

-- name: finish_erasure
UPDATE erasures SET finished_at = :now, counts = :counts, actor = :actor
WHERE id = :id

-- name: select_erasures
-- The erasure records, newest first (of a tenant; an unfinished one of one target).
SELECT id, tenant, scope, digest, actor, started_at, finished_at, counts, runs FROM erasures
WHERE (:tenant IS NULL OR tenant = :tenant)
  AND (:scope IS NULL OR (scope = :scope AND digest = :digest AND finished_at IS NULL))
ORDER BY started_at DESC, id
LIMIT :limit

-- name: count_subject_memory
-- What delete_memory_items_of_subject and delete_memory_messages_of_subject would delete (a dry run).
SELECT (SELECT count(*) FROM memory_items WHERE tenant = :tenant AND subject = :subject)
     + (SELECT count(*) FROM memory_thread_messages WHERE tenant = :tenant AND subject = :subject)

-- name: note_erasure_runs
UPDATE erasures SET runs = :runs WHERE id = :id

-- name: select_erasure_runs
-- The runs each erasure deleted (keyed digests, JSON), of a tenant.
SELECT tenant, runs FROM erasures WHERE runs IS NOT NULL AND (:tenant IS NULL OR tenant = :tenant)

-- Archived runs (issue 26 item 5; cairn/store/archivesql.py): a closed run's
-- rows read whole for its archive, put back whole by a restore, deleted
-- from the hot tables once the archive is recorded.
-- name: archive_mailbox
SELECT run_id, seq, tenant, key, payload, payload_ref, sender, dedupe, sent_at, taken_at, taken_position FROM mailbox WHERE run_id = :run_id ORDER BY seq

-- name: restore_mailbox
INSERT INTO mailbox (run_id, seq, tenant, key, payload, payload_ref, sender, dedupe, sent_at, taken_at, taken_position)
VALUES (:run_id, :seq, :tenant, :key, :payload, :payload_ref, :sender, :dedupe, :sent_at, :taken_at, :taken_position)

-- name: delete_archived_mailbox
DELETE FROM mailbox WHERE run_id = :run_id

-- name: archive_approvals
SELECT run_id, request_id, tenant, position, request_seq, action, type_name, schema, approvers, requested_at, expires_at, status, decided_by, decided_at, comment, decision_seq FROM approvals WHERE run_id = :run_id ORDER BY request_id

-- name: restore_approvals
INSERT INTO approvals (run_id, request_id, tenant, position, request_seq, action, type_name, schema, approvers, requested_at, expires_at, status, decided_by, decided_at, comment, decision_seq)
VALUES (:run_id, :request_id, :tenant, :position, :request_seq, :action, :type_name, :schema, :approvers, :requested_at, :expires_at, :status, :decided_by, :decided_at, :comment, :decision_seq)

-- name: delete_archived_approvals
DELETE FROM approvals WHERE run_id = :run_id

-- name: archive_memory_run
SELECT run_id, key, tenant, value, value_ref, version, created_at, updated_at, position, operation_id, actor FROM memory_run WHERE run_id = :run_id ORDER BY key

-- name: restore_memory_run
INSERT INTO memory_run (run_id, key, tenant, value, value_ref, version, created_at, updated_at, position, operation_id, actor)
VALUES (:run_id, :key, :tenant, :value, :value_ref, :version, :created_at, :updated_at, :position, :operation_id, :actor)

-- name: delete_archived_memory_run
DELETE FROM memory_run WHERE run_id = :run_id

-- name: restore_history
INSERT INTO history (run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash, attempt, started_at, payload, payload_ref, detail, digest, link, tenant)
VALUES (:run_id, :seq, :event, :at, :epoch, :worker, :position, :step_kind, :name, :input_hash, :attempt, :started_at, :payload, :payload_ref, :detail, :digest, :link, :tenant)

-- name: delete_archived_history
DELETE FROM history WHERE run_id = :run_id

-- name: insert_run_archive
INSERT INTO run_archives (run_id, tenant, ref, entries, last_seq, last_link, hot_bytes, stored_bytes, archived_at, actor,
                          first_at, last_at)
VALUES (:run_id, :tenant, :ref, :entries, :last_seq, :last_link, :hot_bytes, :stored_bytes, :archived_at, :actor,
        :first_at, :last_at)

-- name: run_archive
SELECT run_id, tenant, ref, entries, last_seq, last_link, hot_bytes, stored_bytes, archived_at, actor FROM run_archives WHERE run_id = :run_id

-- name: delete_run_archive
DELETE FROM run_archives WHERE run_id = :run_id

-- name: insert_run_archive_ref
INSERT INTO run_archive_refs (run_id, ref) VALUES (:run_id, :ref)

-- name: delete_run_archive_refs
DELETE FROM run_archive_refs WHERE run_id = :run_id

-- The archive records of the archived runs (of a tenant), by run: a
-- cross-run listing's one read of where each archived run's rows are.
-- name: archived_records
SELECT run_id, tenant, ref, entries, last_seq, last_link, hot_bytes, stored_bytes, archived_at, actor FROM run_archives
WHERE (:tenant IS NULL OR tenant = :tenant) ORDER BY run_id

-- The audit log's archived runs of a tenant whose entries reach past a
-- position (an archive's first and last entry time, 0031), a page at a time
-- in the order their first entry comes (oldest first) or their last (newest
-- first), so a page opens only the archives it reaches; both read in the
-- order of run_archives_first_at / _last_at. Archives without a range (made
-- before 0031): audit_log_archives_unranged, opened by every page.
-- name: audit_log_archives_oldest
SELECT run_id, tenant, ref, entries, last_seq, last_link, hot_bytes, stored_bytes, archived_at, actor,
       first_at, last_at
FROM run_archives
WHERE tenant = :tenant AND last_at >= :at AND (first_at, last_at, run_id) > (:after_first, :after_last, :after_run)
ORDER BY first_at, last_at, run_id LIMIT :page

-- name: audit_log_archives_newest
SELECT run_id, tenant, ref, entries, last_seq, last_link, hot_bytes, stored_bytes, archived_at, actor,
       first_at, last_at
FROM run_archives
WHERE tenant = :tenant AND first_at <= :at AND last_at >= :since
  AND (last_at, first_at, run_id) < (:after_last, :after_first, :after_run)
ORDER BY last_at DESC, first_at DESC, run_id DESC LIMIT :page

-- One archived run's range (the log of one run).
-- name: audit_log_archive_range
SELECT first_at, last_at FROM run_archives WHERE run_id = :run_id

-- name: audit_log_archives_unranged
SELECT run_id, tenant, ref, entries, last_seq, last_link, hot_bytes, stored_bytes, archived_at, actor,
       first_at, last_at
FROM run_archives WHERE tenant = :tenant AND first_at IS NULL ORDER BY run_id

-- name: audit_log_archive_tenants
WITH RECURSIVE t(tenant) AS (
    SELECT MIN(tenant) FROM run_archives
    UNION ALL
    SELECT (SELECT MIN(a.tenant) FROM run_archives AS a WHERE a.tenant > t.tenant) FROM t WHERE t.tenant IS NOT NULL
)
SELECT tenant FROM t WHERE tenant IS NOT NULL

-- name: archived_runs
SELECT run_id FROM run_archives WHERE (:tenant IS NULL OR tenant = :tenant) ORDER BY run_id

-- The closed runs last changed before the cutoff and not archived yet,
-- oldest first (the pruning index: its predicate word for word).
-- name: archivable_runs
SELECT r.run_id FROM runs AS r
WHERE r.updated_at < :cutoff
  AND r.status IN ('completed', 'failed', 'cancelled', 'quarantined', 'killed', 'halted')
  AND NOT EXISTS (SELECT 1 FROM run_archives AS a WHERE a.run_id = r.run_id)
  AND (:tenant IS NULL OR r.tenant = :tenant)
ORDER BY r.updated_at, r.run_id LIMIT :limit

-- == Retention (issue 26 part 3; cairn.store.retentionsql) ====================================

-- name: retention_policies
SELECT tenant, workflow, data_class, keep, updated_at, updated_by FROM retention_policies
WHERE :tenant IS NULL OR tenant = :tenant OR tenant = '*'
ORDER BY tenant, workflow, data_class

-- SQLite has one writer: a policy change and its check are serialised already.
-- name: lock_retention_policies
SELECT 1

-- name: upsert_retention_policy
INSERT INTO retention_policies (tenant, workflow, data_class, keep, updated_at, updated_by)
VALUES (:tenant, :workflow, :data_class, :keep, :now, :actor)
ON CONFLICT (tenant, workflow, data_class) DO UPDATE
SET keep = excluded.keep, updated_at = excluded.updated_at, updated_by = excluded.updated_by

-- name: delete_retention_policy
DELETE FROM retention_policies WHERE tenant = :tenant AND workflow = :workflow AND data_class = :data_class
RETURNING tenant

-- Take the controller's lease: renew it (same holder and epoch, the epoch
-- kept), or take it over once it expired (the epoch bumped, so the old
-- holder's fence fails). No row returned: someone else holds it.
-- name: take_retention_lease
INSERT INTO retention_lease (name, holder, epoch, expires_at) VALUES ('controller', :holder, 1, :until)
ON CONFLICT (name) DO UPDATE SET
    epoch = CASE WHEN retention_lease.holder = :holder AND retention_lease.epoch = :epoch
                 THEN retention_lease.epoch ELSE retention_lease.epoch + 1 END,
    holder = excluded.holder, expires_at = excluded.expires_at
WHERE (retention_lease.holder = :holder AND retention_lease.epoch = :epoch) OR retention_lease.expires_at <= :now
RETURNING epoch

-- The fence of every deletion: the caller still holds the lease at its epoch.
-- name: check_retention_fence
SELECT 1 FROM retention_lease
WHERE name = 'controller' AND holder = :holder AND epoch = :epoch AND expires_at > :now

-- Before a run is deleted: its record (audit), with its last entry's link.
-- name: record_deleted_runs
INSERT INTO retention_deleted (run_id, tenant, workflow, finished_at, last_seq, head, deleted_at, deleted_by)
SELECT r.run_id, r.tenant, r.workflow, r.updated_at,
       COALESCE((SELECT max(h.seq) FROM history AS h WHERE h.run_id = r.run_id), 0),
       (SELECT h.link FROM history AS h WHERE h.run_id = r.run_id ORDER BY h.seq DESC LIMIT 1),
       :now, :actor
FROM runs AS r WHERE r.run_id IN (SELECT value FROM json_each(:run_ids))
ON CONFLICT (run_id) DO UPDATE SET
    tenant = excluded.tenant, workflow = excluded.workflow, finished_at = excluded.finished_at,
    last_seq = excluded.last_seq, head = excluded.head, deleted_at = excluded.deleted_at,
    deleted_by = excluded.deleted_by

-- name: deleted_runs
SELECT run_id, tenant, workflow, finished_at, last_seq, head, deleted_at, deleted_by FROM retention_deleted
WHERE (:tenant IS NULL OR tenant = :tenant) ORDER BY finished_at, run_id

-- Audit records finished before the latest cutoff, a page at a time.
-- Archived roots (run_archives) whose archive is older than the latest cutoff
-- of class archives: deleted, with their trees, through prune_runs.
-- name: archive_candidates
SELECT a.run_id, r.tenant, r.workflow, a.archived_at FROM run_archives AS a JOIN runs AS r ON r.run_id = a.run_id
WHERE a.archived_at < :cutoff AND (a.archived_at, a.run_id) > (:after_at, :after_id)
  AND NOT EXISTS (SELECT 1 FROM runs AS p WHERE p.run_id = r.parent_run_id)
ORDER BY a.archived_at, a.run_id LIMIT :page

-- name: deleted_run_candidates
SELECT run_id, tenant, workflow, finished_at FROM retention_deleted
WHERE finished_at < :cutoff AND (finished_at, run_id) > (:after_at, :after_id)
ORDER BY finished_at, run_id LIMIT :page

-- name: forget_deleted_run
DELETE FROM retention_deleted WHERE run_id = :run_id AND finished_at = :finished_at RETURNING run_id

-- Entries of finished runs whose body a class expires, older than the latest
-- cutoff and not expired yet, a page at a time in (run_id, seq) order.
-- name: body_candidates
SELECT h.run_id, h.seq, r.tenant, r.workflow, h.at FROM history AS h JOIN runs AS r ON r.run_id = h.run_id
WHERE r.status IN ('completed', 'failed', 'cancelled', 'quarantined', 'killed', 'halted')
  AND h.at < :cutoff
  AND (h.run_id, h.seq) > (:after_run, :after_seq)
  AND ((:cls = 'model-bodies' AND h.event = 'step.completed' AND h.step_kind = 'model'
        AND (h.payload IS NOT NULL OR h.payload_ref IS NOT NULL))
       OR (:cls = 'artifacts' AND h.payload_ref IS NOT NULL))
  AND (h.payload IS NULL OR substr(h.payload, 1, 2) <> X'0003')
ORDER BY h.run_id, h.seq LIMIT :page

-- Expire one entry's body: a spilled payload's row goes, its artifact is
-- queued for collection, the payload becomes the marker (the ref stays: the
-- audit link covers it). Only on a finished run, only once.
-- name: drop_spilled_body
DELETE FROM history_payloads WHERE id = (
    SELECT CAST(substr(payload, 3) AS INTEGER) FROM history
    WHERE run_id = :run_id AND seq = :seq AND substr(payload, 1, 2) = X'0002')

-- name: queue_body_artifact
INSERT INTO artifact_gc (ref, queued_at)
SELECT payload_ref, :now FROM history WHERE run_id = :run_id AND seq = :seq AND payload_ref IS NOT NULL
ON CONFLICT (ref) DO NOTHING

-- name: expire_body
UPDATE history SET payload = :marker
WHERE run_id = :run_id AND seq = :seq AND (payload IS NULL OR substr(payload, 1, 2) <> X'0003')
  AND EXISTS (SELECT 1 FROM runs AS r WHERE r.run_id = history.run_id
              AND r.status IN ('completed', 'failed', 'cancelled', 'quarantined', 'killed', 'halted'))
RETURNING run_id

-- Thread messages older than the latest cutoff, a page at a time.
-- name: message_candidates
SELECT tenant, thread_id, idx, created_at FROM memory_thread_messages
WHERE created_at < :cutoff AND (tenant, thread_id, idx) > (:after_tenant, :after_thread, :after_idx)
ORDER BY tenant, thread_id, idx LIMIT :page

-- name: forget_message
DELETE FROM memory_thread_messages
WHERE tenant = :tenant AND thread_id = :thread_id AND idx = :idx AND created_at < :cutoff
RETURNING idx

-- A thread left without messages, last written before the cutoff.
-- name: forget_empty_thread
DELETE FROM memory_threads
WHERE tenant = :tenant AND thread_id = :thread_id AND updated_at < :cutoff
  AND NOT EXISTS (SELECT 1 FROM memory_thread_messages AS m
                  WHERE m.tenant = memory_threads.tenant AND m.thread_id = memory_threads.thread_id)

-- Long-term items last written before the latest cutoff, of one class
-- (semantic: with index text), a page at a time.
-- name: item_candidates
SELECT tenant, namespace, key, updated_at FROM memory_items
WHERE updated_at < :cutoff AND ((:semantic AND index_text IS NOT NULL) OR (NOT :semantic AND index_text IS NULL))
  AND (tenant, namespace, key) > (:after_tenant, :after_namespace, :after_key)
ORDER BY tenant, namespace, key LIMIT :page

-- name: item_unchanged
SELECT 1 FROM memory_items WHERE tenant = :tenant AND namespace = :namespace AND key = :key
  AND updated_at = :updated_at
-- name: oplog_lock
-- The tenant's chain head is read under the write lock SQLite already holds.
SELECT 1

-- name: oplog_head
SELECT seq, link FROM operator_log WHERE tenant = :tenant ORDER BY seq DESC LIMIT 1

-- name: insert_oplog
INSERT INTO operator_log (tenant, seq, at, kind, object_id, action, actor, auth, change, digest, link)
VALUES (:tenant, :seq, :at, :kind, :object_id, :action, :actor, :auth, :change, :digest, :link)

-- name: oplog_entries
SELECT tenant, seq, at, kind, object_id, action, actor, auth, change, digest, link FROM operator_log
WHERE (:tenant IS NULL OR tenant = :tenant) AND (tenant, seq) > (:after_tenant, :after_seq)
ORDER BY tenant, seq LIMIT :page

-- The audit log's operator records of a tenant, a page past a position in
-- (at, seq) order (its chain id is the tenant's: api.auditlog turns a cursor
-- into this pair), of a kind of object if given; operator_log_at (0031).
-- name: oplog_log_oldest
SELECT tenant, seq, at, kind, object_id, action, actor, auth, change, digest, link FROM operator_log
WHERE tenant = :tenant AND (at, seq) > (:at, :after_seq) AND (:kind IS NULL OR kind = :kind)
ORDER BY at, seq LIMIT :page

-- name: oplog_log_newest
SELECT tenant, seq, at, kind, object_id, action, actor, auth, change, digest, link FROM operator_log
WHERE tenant = :tenant AND at >= :since AND (at, seq) < (:at, :after_seq) AND (:kind IS NULL OR kind = :kind)
ORDER BY at DESC, seq DESC LIMIT :page

-- name: oplog_tenants
WITH RECURSIVE t(tenant) AS (
    SELECT MIN(tenant) FROM operator_log
    UNION ALL
    SELECT (SELECT MIN(o.tenant) FROM operator_log AS o WHERE o.tenant > t.tenant) FROM t WHERE t.tenant IS NOT NULL
)
SELECT tenant FROM t WHERE tenant IS NOT NULL
