-- Named queries for the PostgreSQL backend, loaded by cairn.store.sqlfiles.
-- Parameters are psycopg named placeholders (%(run_id)s); each block ends at
-- the next "-- name:". Names match the SQLite dialect where the query does the
-- same job.
--
-- Conventions:
-- * Every parameter carries an explicit cast: PostgreSQL cannot infer the type
--   of a bare NULL parameter, and a cast also pins the plan of a prepared
--   statement.
-- * Time is always a parameter (%(now)s, from the store's injected clock),
--   never now(): tests drive leases and timers with a fake clock, and every
--   machine must agree with the Python side on what "now" is.
-- * Tables are unqualified: every connection's search_path is the store's schema.
-- * Ties in ordered results are broken by run_id COLLATE "C" (byte order, as
--   SQLite compares text), whatever the database's default collation is.
-- * history.tenant is never a parameter: every INSERT into history reads it
--   from the run row (the fence, the created run, or a lookup), so an entry
--   always carries its run's tenant.

-- name: create_run
-- Insert the run and its first history entries in one statement: it is atomic
-- in autocommit mode, so creating a run costs one round trip. Nothing at all is
-- written if the run id exists (ON CONFLICT leaves the CTE empty).
WITH ins AS (
    INSERT INTO runs (run_id, tenant, workflow, workflow_version, thread_id, queue, priority,
                      parent_run_id, status, input, input_ref, epoch, owner, lease_expires_at,
                      runnable_at, budget, created_at, updated_at, bundle, started_role, started_token, subject)
    VALUES (%(run_id)s::text, %(tenant)s::text, %(workflow)s::text, %(workflow_version)s::text,
            %(thread_id)s::text, %(queue)s::text, %(priority)s::bigint, %(parent_run_id)s::text,
            %(status)s::text, %(input)s::bytea, %(input_ref)s::text, %(epoch)s::bigint,
            %(owner)s::text, %(lease_expires_at)s::float8, %(runnable_at)s::float8,
            %(budget)s::text, %(now)s::float8, %(now)s::float8, %(bundle)s::text,
            %(started_role)s::text, %(started_token)s::text, %(subject)s::text)
    ON CONFLICT (run_id) DO NOTHING
    RETURNING run_id, tenant
)
INSERT INTO history (run_id, seq, event, at, epoch, worker, detail, tenant, digest, link)
SELECT ins.run_id, e.seq, e.event, e.at, e.epoch, e.worker, e.detail, ins.tenant, e.digest, e.link
FROM ins
CROSS JOIN unnest(%(seqs)s::bigint[], %(events)s::text[], %(ats)s::float8[], %(epochs)s::bigint[],
                  %(workers)s::text[], %(details)s::text[], %(digests)s::bytea[], %(links)s::bytea[])
     AS e(seq, event, at, epoch, worker, detail, digest, link)

-- The same in two statements, for a tenant's role: the history policy checks
-- that an entry's run is of the entry's tenant, and a run inserted by a CTE of
-- the same statement is not visible to that check yet (see 0008_waits.sql).
-- name: create_run_row
INSERT INTO runs (run_id, tenant, workflow, workflow_version, thread_id, queue, priority,
                  parent_run_id, status, input, input_ref, epoch, owner, lease_expires_at,
                  runnable_at, budget, created_at, updated_at, bundle, started_role, started_token, subject)
VALUES (%(run_id)s::text, %(tenant)s::text, %(workflow)s::text, %(workflow_version)s::text,
        %(thread_id)s::text, %(queue)s::text, %(priority)s::bigint, %(parent_run_id)s::text,
        %(status)s::text, %(input)s::bytea, %(input_ref)s::text, %(epoch)s::bigint,
        %(owner)s::text, %(lease_expires_at)s::float8, %(runnable_at)s::float8,
        %(budget)s::text, %(now)s::float8, %(now)s::float8, %(bundle)s::text,
            %(started_role)s::text, %(started_token)s::text, %(subject)s::text)
ON CONFLICT (run_id) DO NOTHING

-- name: create_run_entries
INSERT INTO history (run_id, seq, event, at, epoch, worker, detail, tenant, digest, link)
SELECT %(run_id)s::text, e.seq, e.event, e.at, e.epoch, e.worker, e.detail, %(tenant)s::text, e.digest, e.link
FROM unnest(%(seqs)s::bigint[], %(events)s::text[], %(ats)s::float8[], %(epochs)s::bigint[],
            %(workers)s::text[], %(details)s::text[], %(digests)s::bytea[], %(links)s::bytea[])
     AS e(seq, event, at, epoch, worker, detail, digest, link)

-- name: select_run_subject
-- The subject a run was started for (erasure; cairn.store.sealed seals its values with the subject's key).
SELECT subject FROM runs WHERE run_id = %(run_id)s::text

-- name: select_started_with
-- The role and token a run was started with (cairn.engine.access reads it, once per execution).
SELECT started_role, started_token FROM runs WHERE run_id = %(run_id)s::text

-- name: select_run
SELECT run_id, workflow, workflow_version, tenant, thread_id, status, input, input_ref, result,
       result_ref, error, epoch, owner, lease_expires_at, wake_at, waiting_on, waiting_for, recoveries, queue,
       priority, parent_run_id, created_at, updated_at, budget, bundle
FROM runs WHERE run_id = %(run_id)s::text

-- name: list_runs
SELECT run_id, workflow, workflow_version, tenant, thread_id, status, input, input_ref, result,
       result_ref, error, epoch, owner, lease_expires_at, wake_at, waiting_on, waiting_for, recoveries, queue,
       priority, parent_run_id, created_at, updated_at, budget, bundle
FROM runs
WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
  AND (%(workflow)s::text IS NULL OR workflow = %(workflow)s::text)
  AND (%(thread_id)s::text IS NULL OR thread_id = %(thread_id)s::text)
  AND (%(parent_run_id)s::text IS NULL OR parent_run_id = %(parent_run_id)s::text)
  AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
ORDER BY created_at DESC, run_id COLLATE "C" DESC
LIMIT %(limit)s::bigint

-- name: run_usage
-- What engine.journal.Usage sums, summed here (a read must not load a long
-- run's history for it): the tokens and cost of completed model calls, the
-- tool entries that count as calls (entries with a position only); and the
-- last seq. A detail that is not JSON fails the cast: the store then sums
-- the history itself (PostgreSQL 15 has no test for valid JSON).
SELECT
  COALESCE(SUM(trunc(COALESCE((detail::jsonb #>> '{usage,total_tokens}')::numeric, 0)))
           FILTER (WHERE step_kind = 'model' AND event = 'step.completed' AND position IS NOT NULL), 0)::bigint,
  COALESCE(SUM(COALESCE((detail::jsonb ->> 'cost')::float8, 0))
           FILTER (WHERE step_kind = 'model' AND event = 'step.completed' AND position IS NOT NULL), 0)::float8,
  COUNT(*) FILTER (WHERE step_kind = 'tool' AND position IS NOT NULL
                   AND event IN ('step.completed', 'step.failed', 'step.retried')),
  COALESCE(MAX(seq), 0)
FROM history WHERE run_id = %(run_id)s::text

-- name: select_history
-- A NULL limit means no limit in PostgreSQL.
SELECT run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash, attempt,
       started_at, payload, payload_ref, detail
FROM history WHERE run_id = %(run_id)s::text AND seq > %(after_seq)s::bigint ORDER BY seq
LIMIT %(limit)s::bigint

-- select_history without the payloads: the entries a reader fetches a few
-- payloads of (history_at).
-- name: select_history_headers
SELECT run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash, attempt,
       started_at, NULL::bytea, NULL::text, detail
FROM history WHERE run_id = %(run_id)s::text AND seq > %(after_seq)s::bigint ORDER BY seq

-- Each entry's seq, type, position, kind, name and time, and nothing else:
-- what a graph run's reader lists its checkpoints from (history_index).
-- name: select_history_index
SELECT seq, event, position, step_kind, name, at
FROM history WHERE run_id = %(run_id)s::text AND seq > %(after_seq)s::bigint ORDER BY seq

-- The same for the newest %(last)s entries only (history_index(last=)): a
-- cold reader's first page of a long graph run reads its tail, not every entry.
-- name: select_history_index_last
SELECT seq, event, position, step_kind, name, at FROM (
    SELECT seq, event, position, step_kind, name, at FROM history
    WHERE run_id = %(run_id)s::text AND seq > %(after_seq)s::bigint ORDER BY seq DESC LIMIT %(last)s::bigint
) AS newest ORDER BY seq

-- The entries of a run at the seqs given: what rebuilding a page's model
-- calls needs, and nothing else (modelcalls.needs).
-- name: select_history_at
SELECT run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash, attempt,
       started_at, payload, payload_ref, detail
FROM history WHERE run_id = %(run_id)s::text AND seq = ANY(%(seqs)s::bigint[]) ORDER BY seq

-- A page of a run's model calls (the recorded ones, with a payload), read
-- in the primary key's order after after_seq. A NULL limit means no limit.
-- name: select_model_calls
SELECT run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash, attempt,
       started_at, payload, payload_ref, detail
FROM history
WHERE run_id = %(run_id)s::text AND seq > %(after_seq)s::bigint AND step_kind = 'model'
  AND event = 'step.completed' AND (payload IS NOT NULL OR payload_ref IS NOT NULL)
ORDER BY seq LIMIT %(limit)s::bigint

-- The hot path: one autocommit statement checks the fence, keeps the history
-- gap-free and appends. FOR SHARE locks the run row for the statement's
-- transaction, so a concurrent epoch bump (which takes FOR UPDATE) either
-- waits for this append to commit and then appends after it, or commits
-- first, in which case the lock re-reads the row, sees the new epoch and the
-- fence is empty: nothing is inserted. A racing writer of the same seq hits
-- the primary key instead (reported as LeaseLost).
-- name: insert_event_fenced
WITH fence AS (
    SELECT tenant FROM runs
    WHERE run_id = %(run_id)s::text AND epoch = %(epoch)s::bigint AND status = 'running'
    FOR SHARE
), prev AS (  -- the entry before: its link, and its time (history_monotonic_at's clamp, done here)
    SELECT b.at, b.link FROM history AS b WHERE b.run_id = %(run_id)s::text AND b.seq = %(seq)s::bigint - 1
)
INSERT INTO history (run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash,
                     attempt, started_at, payload, payload_ref, detail, tenant, digest, link)
SELECT %(run_id)s::text, %(seq)s::bigint, %(event)s::text, GREATEST(%(at)s::float8, COALESCE((SELECT at FROM prev), %(at)s::float8)), %(event_epoch)s::bigint,
       %(worker)s::text, %(position)s::bigint, %(step_kind)s::text, %(name)s::text,
       %(input_hash)s::text, %(attempt)s::bigint, %(started_at)s::float8, %(payload)s::bytea,
       %(payload_ref)s::text, %(detail)s::text, fence.tenant, %(digest)s::bytea,
       CASE WHEN (SELECT link FROM prev) = '\x'::bytea THEN '\x'::bytea
            ELSE sha256(COALESCE((SELECT link FROM prev), '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea) || %(audit_head)s::bytea || '\xcb'::bytea
                        || float8send(GREATEST(%(at)s::float8, COALESCE((SELECT at FROM prev), %(at)s::float8))) || %(audit_tail)s::bytea) END
FROM fence
WHERE %(seq)s::bigint = (SELECT COALESCE(MAX(seq), 0) + 1 FROM history WHERE run_id = %(run_id)s::text)
RETURNING at, link

-- The same with the link computed by the client (postgres.PostgresStore._append_one),
-- from the entry before as the client last wrote it: stored only if that entry
-- still holds the link (and a time no later than this one's: the client clamps
-- to it) the client chained from. A stale or wrong cache is refused (no row),
-- never forks the chain: the client then sends insert_event_fenced.
-- name: insert_event_linked
WITH fence AS (
    SELECT tenant FROM runs
    WHERE run_id = %(run_id)s::text AND epoch = %(epoch)s::bigint AND status = 'running'
    FOR SHARE
)
INSERT INTO history (run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash,
                     attempt, started_at, payload, payload_ref, detail, tenant, digest, link)
SELECT %(run_id)s::text, %(seq)s::bigint, %(event)s::text, %(at)s::float8, %(event_epoch)s::bigint,
       %(worker)s::text, %(position)s::bigint, %(step_kind)s::text, %(name)s::text,
       %(input_hash)s::text, %(attempt)s::bigint, %(started_at)s::float8, %(payload)s::bytea,
       %(payload_ref)s::text, %(detail)s::text, fence.tenant, %(digest)s::bytea, %(link)s::bytea
FROM fence
WHERE %(seq)s::bigint = (SELECT COALESCE(MAX(seq), 0) + 1 FROM history WHERE run_id = %(run_id)s::text)
  AND EXISTS (SELECT 1 FROM history AS b WHERE b.run_id = %(run_id)s::text AND b.seq = %(seq)s::bigint - 1
              AND b.link IS NOT DISTINCT FROM %(previous)s::bytea AND b.at <= %(at)s::float8)

-- The same for a batch (the caller checks the seqs are consecutive): all rows
-- or none, still one statement.
-- name: insert_events_fenced
WITH fence AS (
    SELECT tenant FROM runs
    WHERE run_id = %(run_id)s::text AND epoch = %(epoch)s::bigint AND status = 'running'
    FOR SHARE
)
INSERT INTO history (run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash,
                     attempt, started_at, payload, payload_ref, detail, tenant)
SELECT %(run_id)s::text, e.seq, e.event, e.at, e.epoch, e.worker, e.position, e.step_kind, e.name,
       e.input_hash, e.attempt, e.started_at, e.payload, e.payload_ref, e.detail, fence.tenant
FROM fence
CROSS JOIN unnest(%(seqs)s::bigint[], %(events)s::text[], %(ats)s::float8[], %(epochs)s::bigint[],
                  %(workers)s::text[], %(positions)s::bigint[], %(step_kinds)s::text[],
                  %(names)s::text[], %(input_hashes)s::text[], %(attempts)s::bigint[],
                  %(started_ats)s::float8[], %(payloads)s::bytea[], %(payload_refs)s::text[],
                  %(details)s::text[])
     AS e(seq, event, at, epoch, worker, position, step_kind, name, input_hash, attempt,
          started_at, payload, payload_ref, detail)
WHERE %(first_seq)s::bigint = (SELECT COALESCE(MAX(seq), 0) + 1 FROM history
                               WHERE run_id = %(run_id)s::text)

-- Append after the current maximum, for writers that bump the epoch and hold
-- the run row FOR UPDATE. Returns the seq it took.
-- name: append_auto
INSERT INTO history (run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash,
                     attempt, started_at, payload, payload_ref, detail, tenant)
SELECT %(run_id)s::text, COALESCE(MAX(seq), 0) + 1, %(event)s::text, %(at)s::float8,
       %(event_epoch)s::bigint, %(worker)s::text, %(position)s::bigint, %(step_kind)s::text,
       %(name)s::text, %(input_hash)s::text, %(attempt)s::bigint, %(started_at)s::float8,
       %(payload)s::bytea, %(payload_ref)s::text, %(detail)s::text,
       (SELECT tenant FROM runs WHERE run_id = %(run_id)s::text)
FROM history WHERE run_id = %(run_id)s::text
RETURNING seq

-- name: select_claim_state
SELECT status, owner, epoch, recoveries, runnable_at, queue, tenant, priority FROM runs
WHERE run_id = %(run_id)s::text
FOR UPDATE

-- name: quarantine
UPDATE runs SET status = 'quarantined', owner = NULL, epoch = epoch + 1, lease_expires_at = NULL,
       runnable_at = NULL, recoveries = %(recoveries)s::bigint, updated_at = %(now)s::float8,
       error = %(error)s::text
WHERE run_id = %(run_id)s::text
RETURNING run_id, workflow, workflow_version, tenant, thread_id, status, input, input_ref, result,
          result_ref, error, epoch, owner, lease_expires_at, wake_at, waiting_on, waiting_for, recoveries,
          queue, priority, parent_run_id, created_at, updated_at, budget, bundle

-- name: reclaim_owned
UPDATE runs SET runnable_at = %(now)s::float8, lease_expires_at = %(now)s::float8,
       updated_at = %(now)s::float8
WHERE runnable_at IS NOT NULL AND owner = %(worker)s::text AND status = 'running'

-- All leases in one statement; the ids it returns are the ones still held.
-- name: renew_leases
UPDATE runs SET lease_expires_at = %(lease_until)s::float8, runnable_at = %(lease_until)s::float8,
       updated_at = %(now)s::float8
FROM unnest(%(run_ids)s::text[], %(epochs)s::bigint[]) AS lease(run_id, epoch)
WHERE runs.run_id = lease.run_id AND runs.epoch = lease.epoch
  AND runs.owner = %(worker)s::text AND runs.status = 'running'
RETURNING runs.run_id

-- The fence of a multi-statement fenced write: lock the run row first, so the
-- whole transaction runs under the epoch it checked.
-- name: lock_fenced
SELECT 1 FROM runs
WHERE run_id = %(run_id)s::text AND epoch = %(epoch)s::bigint AND status = 'running'
FOR UPDATE

-- A parent about to wait on a child locks the child's row to read its status:
-- the child's own end (finish, cancel, kill, halt) either committed before and
-- is seen here, or waits for this suspension and then wakes the parent. Without
-- the lock, both could miss each other and the parent would sleep forever.
-- name: lock_child_status
SELECT status FROM runs WHERE run_id = %(run_id)s::text FOR SHARE

-- name: suspend
UPDATE runs SET status = %(status)s::text, owner = NULL, lease_expires_at = NULL,
       wake_at = %(wake_at)s::float8, waiting_on = %(waiting_on)s::text,
       waiting_for = %(waiting_for)s::text,
       runnable_at = %(runnable_at)s::float8, updated_at = %(now)s::float8
WHERE run_id = %(run_id)s::text AND epoch = %(epoch)s::bigint AND status = 'running'

-- name: release
UPDATE runs SET status = 'pending', owner = NULL, lease_expires_at = NULL,
       runnable_at = %(now)s::float8, updated_at = %(now)s::float8
WHERE run_id = %(run_id)s::text AND epoch = %(epoch)s::bigint AND status = 'running'

-- The end of a run, after lock_fenced in the same transaction: append the
-- final entry (gap-free, as insert_event_fenced), end the run and wake a parent
-- suspended waiting on it, in one statement. Each part runs only if the one
-- before it wrote (ins -> fin -> wake), so a refused append writes nothing.
-- The row lock is already held (lock_fenced), so the fence needs none, and
-- this statement's snapshot, taken after that lock was granted, sees a parent
-- whose suspension locked this row FOR SHARE before us (see lock_child_status).
-- name: finish_fenced
WITH fence AS (
    SELECT tenant FROM runs
    WHERE run_id = %(run_id)s::text AND epoch = %(epoch)s::bigint AND status = 'running'
), prev AS (  -- the entry before: its link, and its time (history_monotonic_at's clamp, done here)
    SELECT b.at, b.link FROM history AS b WHERE b.run_id = %(run_id)s::text AND b.seq = %(seq)s::bigint - 1
), ins AS (
    INSERT INTO history (run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash,
                         attempt, started_at, payload, payload_ref, detail, tenant, digest, link)
    SELECT %(run_id)s::text, %(seq)s::bigint, %(event)s::text, GREATEST(%(at)s::float8, COALESCE((SELECT at FROM prev), %(at)s::float8)), %(event_epoch)s::bigint,
           %(worker)s::text, %(position)s::bigint, %(step_kind)s::text, %(name)s::text,
           %(input_hash)s::text, %(attempt)s::bigint, %(started_at)s::float8, %(payload)s::bytea,
           %(payload_ref)s::text, %(detail)s::text, fence.tenant, %(digest)s::bytea,
           CASE WHEN (SELECT link FROM prev) = '\x'::bytea THEN '\x'::bytea
            ELSE sha256(COALESCE((SELECT link FROM prev), '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea) || %(audit_head)s::bytea || '\xcb'::bytea
                        || float8send(GREATEST(%(at)s::float8, COALESCE((SELECT at FROM prev), %(at)s::float8))) || %(audit_tail)s::bytea) END
    FROM fence
    WHERE %(seq)s::bigint = (SELECT COALESCE(MAX(seq), 0) + 1 FROM history WHERE run_id = %(run_id)s::text)
    RETURNING run_id
), fin AS (
    UPDATE runs SET status = %(status)s::text, owner = NULL, lease_expires_at = NULL, runnable_at = NULL,
           result = %(result)s::bytea, result_ref = %(result_ref)s::text, error = %(error)s::text,
           updated_at = %(now)s::float8
    FROM ins
    WHERE runs.run_id = ins.run_id AND runs.epoch = %(epoch)s::bigint AND runs.status = 'running'
    RETURNING runs.parent_run_id
), wake AS (
    UPDATE runs AS parent SET runnable_at = %(now)s::float8, updated_at = %(now)s::float8
    FROM fin
    WHERE parent.run_id = fin.parent_run_id AND parent.status = 'suspended'
      AND parent.waiting_on = %(run_id)s::text
)
SELECT (SELECT count(*) FROM ins), (SELECT count(*) FROM fin)

-- name: wake_waiting_parent
UPDATE runs SET runnable_at = %(now)s::float8, updated_at = %(now)s::float8
WHERE run_id = (SELECT parent_run_id FROM runs WHERE run_id = %(child_id)s::text)
  AND status = 'suspended' AND waiting_on = %(child_id)s::text

-- UNION (not UNION ALL) so that even a malformed parent cycle terminates.
-- name: select_live_descendants
WITH RECURSIVE tree(run_id) AS (
    SELECT %(run_id)s::text
    UNION
    SELECT runs.run_id FROM runs JOIN tree ON runs.parent_run_id = tree.run_id
)
SELECT runs.run_id, runs.epoch FROM runs JOIN tree ON runs.run_id = tree.run_id
WHERE runs.status <> ALL(%(terminal)s::text[])
ORDER BY runs.run_id COLLATE "C"

-- Lock a set of runs in one order (byte order of run_id), so two operators
-- locking overlapping sets queue up instead of deadlocking.
-- name: lock_runs
SELECT run_id FROM runs WHERE run_id = ANY(%(run_ids)s::text[])
ORDER BY run_id COLLATE "C"
FOR UPDATE

-- name: lock_run
SELECT run_id, workflow, workflow_version, tenant, thread_id, status, input, input_ref, result,
       result_ref, error, epoch, owner, lease_expires_at, wake_at, waiting_on, waiting_for, recoveries, queue,
       priority, parent_run_id, created_at, updated_at, budget, bundle
FROM runs WHERE run_id = %(run_id)s::text
FOR UPDATE

-- name: cancel
UPDATE runs SET status = 'cancelled', owner = NULL, epoch = epoch + 1, lease_expires_at = NULL,
       runnable_at = NULL, wake_at = NULL, updated_at = %(now)s::float8, error = %(error)s::text
WHERE run_id = %(run_id)s::text
RETURNING run_id, workflow, workflow_version, tenant, thread_id, status, input, input_ref, result,
          result_ref, error, epoch, owner, lease_expires_at, wake_at, waiting_on, waiting_for, recoveries,
          queue, priority, parent_run_id, created_at, updated_at, budget, bundle

-- name: last_failed_position
SELECT position FROM history
WHERE run_id = %(run_id)s::text AND event = 'step.failed' ORDER BY seq DESC LIMIT 1

-- name: retry
UPDATE runs SET status = 'pending', owner = NULL, epoch = epoch + 1, lease_expires_at = NULL,
       runnable_at = %(now)s::float8, wake_at = NULL, waiting_on = NULL, waiting_for = NULL, recoveries = 0,
       error = NULL, updated_at = %(now)s::float8
WHERE run_id = %(run_id)s::text
RETURNING run_id, workflow, workflow_version, tenant, thread_id, status, input, input_ref, result,
          result_ref, error, epoch, owner, lease_expires_at, wake_at, waiting_on, waiting_for, recoveries,
          queue, priority, parent_run_id, created_at, updated_at, budget, bundle

-- name: select_live_of_tenant
SELECT run_id, epoch FROM runs
WHERE tenant = %(tenant)s::text AND status <> ALL(%(terminal)s::text[])
ORDER BY run_id COLLATE "C"
FOR UPDATE

-- name: kill
UPDATE runs SET status = 'killed', owner = NULL, epoch = epoch + 1, lease_expires_at = NULL,
       runnable_at = NULL, updated_at = %(now)s::float8, error = %(error)s::text
WHERE run_id = %(run_id)s::text
RETURNING run_id, workflow, workflow_version, tenant, thread_id, status, input, input_ref, result,
          result_ref, error, epoch, owner, lease_expires_at, wake_at, waiting_on, waiting_for, recoveries,
          queue, priority, parent_run_id, created_at, updated_at, budget, bundle

-- name: reopen
UPDATE runs SET status = 'pending', owner = NULL, epoch = epoch + 1, lease_expires_at = NULL,
       runnable_at = %(now)s::float8, wake_at = NULL, waiting_on = NULL, waiting_for = NULL, error = NULL,
       updated_at = %(now)s::float8
WHERE run_id = %(run_id)s::text
RETURNING run_id, workflow, workflow_version, tenant, thread_id, status, input, input_ref, result,
          result_ref, error, epoch, owner, lease_expires_at, wake_at, waiting_on, waiting_for, recoveries,
          queue, priority, parent_run_id, created_at, updated_at, budget, bundle

-- name: halt
UPDATE runs SET status = 'halted', owner = NULL, epoch = epoch + 1, lease_expires_at = NULL,
       runnable_at = NULL, error = %(error)s::text, updated_at = %(now)s::float8
WHERE run_id = %(run_id)s::text AND epoch = %(fence)s::bigint AND status = 'running'
RETURNING run_id, workflow, workflow_version, tenant, thread_id, status, input, input_ref, result,
          result_ref, error, epoch, owner, lease_expires_at, wake_at, waiting_on, waiting_for, recoveries,
          queue, priority, parent_run_id, created_at, updated_at, budget, bundle

-- name: set_budget
UPDATE runs SET budget = %(budget)s::text, updated_at = %(now)s::float8,
       runnable_at = CASE
           WHEN status = 'suspended' AND wake_at IS NULL AND waiting_on IS NULL AND waiting_for IS NULL THEN %(now)s::float8
           ELSE runnable_at END
WHERE run_id = %(run_id)s::text
RETURNING run_id, workflow, workflow_version, tenant, thread_id, status, input, input_ref, result,
          result_ref, error, epoch, owner, lease_expires_at, wake_at, waiting_on, waiting_for, recoveries,
          queue, priority, parent_run_id, created_at, updated_at, budget, bundle

-- Storing bytes that exist already refreshes when they were last stored
-- (pruning spares what was stored since its cutoff). The update locks the row,
-- so it either happens before a collector's DELETE (which then re-checks the
-- time and keeps the row) or after it (and finds no row: the bytes are sent).
-- name: touch_artifact
-- Only intact bytes are trusted: a row whose data no longer hashes to its ref
-- is not touched, so the bytes are sent and put_artifact rewrites it.
UPDATE artifacts SET touched_at = GREATEST(touched_at, %(now)s::float8)
WHERE ref = %(ref)s::text AND encode(sha256(data), 'hex') = %(ref)s::text

-- New bytes are queued for collection in the same statement: if the writer
-- dies before recording the entry that points to them, nothing would ever
-- reference them, and pruning deletes them once the grace period is over.
-- name: put_artifact
WITH queued AS (
    -- no conflict target: a role with only INSERT on artifact_gc may run it
    INSERT INTO artifact_gc (ref, queued_at) VALUES (%(ref)s::text, %(now)s::float8)
    ON CONFLICT DO NOTHING
)
INSERT INTO artifacts (ref, data, touched_at) VALUES (%(ref)s::text, %(data)s::bytea, %(now)s::float8)
ON CONFLICT (ref) DO UPDATE SET touched_at = GREATEST(artifacts.touched_at, excluded.touched_at),
    data = CASE WHEN encode(sha256(artifacts.data), 'hex') = excluded.ref THEN artifacts.data
                ELSE excluded.data END  -- damaged bytes are replaced by the ones named

-- name: get_artifact
SELECT data FROM artifacts WHERE ref = %(ref)s::text

-- An artifact stored under a name its writer chose (a sealed store's keyed
-- address, cairn.store.sealedartifacts): bytes stored already are kept, only
-- when they were last stored is refreshed (the sealed store checks them: they
-- open only at their name).
-- name: put_artifact_at
WITH queued AS (
    INSERT INTO artifact_gc (ref, queued_at) VALUES (%(ref)s::text, %(now)s::float8)
    ON CONFLICT DO NOTHING
)
INSERT INTO artifacts (ref, data, touched_at) VALUES (%(ref)s::text, %(data)s::bytea, %(now)s::float8)
ON CONFLICT (ref) DO UPDATE SET touched_at = GREATEST(artifacts.touched_at, excluded.touched_at)

-- name: touch_artifact_at
UPDATE artifacts SET touched_at = GREATEST(touched_at, %(now)s::float8) WHERE ref = %(ref)s::text

-- A tenant's role, through the SECURITY DEFINER function of migration 0040.
-- name: store_artifact_at
SELECT store_artifact_at(%(ref)s::text, %(data)s::bytea, %(now)s::float8)

-- Re-encryption: compare-and-set on the bytes read (a collection since then
-- leaves no row: nothing is written). touched_at is kept: re-encrypting is not storing.
-- name: replace_artifact
UPDATE artifacts SET data = %(new)s::bytea WHERE ref = %(ref)s::text AND data = %(old)s::bytea

-- Pruning ------------------------------------------------------------------------
-- Candidate roots of prunable trees, oldest first, one page after the keyset
-- (after_at, after_id). The first status term is the predicate of the
-- runs_finished index, which lets the planner use it.
-- name: select_prune_roots
SELECT r.run_id, r.updated_at FROM runs AS r
WHERE r.status IN ('completed', 'failed', 'cancelled', 'quarantined', 'killed', 'halted')
  AND r.status = ANY(%(statuses)s::text[])
  AND r.updated_at < %(cutoff)s::float8
  AND (%(roots)s::text[] IS NULL OR r.run_id = ANY(%(roots)s::text[]))
  AND (%(after_at)s::float8 IS NULL OR r.updated_at > %(after_at)s::float8
       OR (r.updated_at = %(after_at)s::float8 AND r.run_id COLLATE "C" > %(after_id)s::text COLLATE "C"))
  -- a root: no parent, or a parent that is gone (a NULL parent_run_id matches no run)
  AND NOT EXISTS (SELECT 1 FROM runs AS p WHERE p.run_id = r.parent_run_id)
ORDER BY r.updated_at, r.run_id COLLATE "C"
LIMIT %(page)s::bigint

-- Every member of the trees under the roots, with its root.
-- name: select_trees
WITH RECURSIVE tree(root, run_id) AS (
    SELECT root, root FROM unnest(%(roots)s::text[]) AS root
    UNION
    SELECT tree.root, runs.run_id FROM runs JOIN tree ON runs.parent_run_id = tree.run_id
)
SELECT tree.root, runs.run_id, runs.status, runs.updated_at, runs.tenant, runs.workflow
FROM tree JOIN runs ON runs.run_id = tree.run_id

-- name: queue_artifacts_of_runs
INSERT INTO artifact_gc (ref, queued_at)
SELECT ref, %(now)s::float8 FROM (
    SELECT input_ref AS ref FROM runs WHERE run_id = ANY(%(run_ids)s::text[]) AND input_ref IS NOT NULL
    UNION
    SELECT result_ref FROM runs WHERE run_id = ANY(%(run_ids)s::text[]) AND result_ref IS NOT NULL
    UNION
    SELECT payload_ref FROM history WHERE run_id = ANY(%(run_ids)s::text[]) AND payload_ref IS NOT NULL
    UNION
    SELECT payload_ref FROM mailbox WHERE run_id = ANY(%(run_ids)s::text[]) AND payload_ref IS NOT NULL
    UNION
    SELECT ref FROM run_archives WHERE run_id = ANY(%(run_ids)s::text[])
    UNION
    SELECT ref FROM run_archive_refs WHERE run_id = ANY(%(run_ids)s::text[])
) AS refs
ON CONFLICT (ref) DO NOTHING

-- name: delete_history_of_runs
DELETE FROM history WHERE run_id = ANY(%(run_ids)s::text[])

-- name: delete_mailbox_of_runs
DELETE FROM mailbox WHERE run_id = ANY(%(run_ids)s::text[])

-- name: delete_runs
DELETE FROM runs WHERE run_id = ANY(%(run_ids)s::text[])

-- One page of the collection queue, each ref with whether a row still
-- references it. SKIP LOCKED: concurrent collectors take different pages.
-- name: select_gc_page
SELECT g.ref, g.queued_at,
       EXISTS (SELECT 1 FROM runs WHERE input_ref = g.ref)
       OR EXISTS (SELECT 1 FROM runs WHERE result_ref = g.ref)
       -- an entry whose body retention expired keeps its ref (the audit link covers it), not the body
       OR EXISTS (SELECT 1 FROM history WHERE payload_ref = g.ref
                  AND (payload IS NULL OR substring(payload FROM 1 FOR 2) <> '\x0003'::bytea))
       OR EXISTS (SELECT 1 FROM mailbox WHERE payload_ref = g.ref)
       OR EXISTS (SELECT 1 FROM memory_run WHERE value_ref = g.ref)
       OR EXISTS (SELECT 1 FROM memory_thread_messages WHERE value_ref = g.ref)
       OR EXISTS (SELECT 1 FROM memory_items WHERE value_ref = g.ref)
       OR EXISTS (SELECT 1 FROM run_archives WHERE ref = g.ref)
       OR EXISTS (SELECT 1 FROM run_archive_refs WHERE ref = g.ref) AS referenced
FROM artifact_gc AS g
WHERE %(after_at)s::float8 IS NULL OR g.queued_at > %(after_at)s::float8
      OR (g.queued_at = %(after_at)s::float8 AND g.ref COLLATE "C" > %(after_ref)s::text COLLATE "C")
ORDER BY g.queued_at, g.ref COLLATE "C"
LIMIT %(page)s::bigint
FOR UPDATE OF g SKIP LOCKED

-- Delete unreferenced artifacts not stored since the cutoff; returns the refs
-- that are gone (deleted now, or missing already).
-- name: delete_stale_artifacts
WITH gone AS (
    DELETE FROM artifacts
    WHERE ref = ANY(%(refs)s::text[]) AND touched_at < %(stored_before)s::float8
    RETURNING ref
)
SELECT gone.ref FROM gone
UNION
SELECT queued.ref FROM unnest(%(refs)s::text[]) AS queued(ref)
WHERE NOT EXISTS (SELECT 1 FROM artifacts AS a WHERE a.ref = queued.ref)

-- name: dequeue_artifacts
DELETE FROM artifact_gc WHERE ref = ANY(%(refs)s::text[])

-- Queues and fair claims (see store/admission.py).
--
-- The lanes a claim looks at, each with its best due runs, locked with SKIP
-- LOCKED (rows another claimer is taking are passed over, and FOR UPDATE
-- re-checks each row's newest version). Lanes are (queue, tenant) pairs with
-- a runnable_at, found by a recursive skip through runs_lanes: one index
-- seek per queue and per lane, however many runs wait. Queues are the
-- worker's own, or (%(queues)s NULL) every queue found the same way. Per
-- queue, lanes are enumerated after a cursor position, up to an optional
-- bound, at most `room` of them (see admission.LaneCursor). A lane without
-- due runs still comes back (run_id NULL): the cursor needs to know it was
-- seen. (The lane probes order by every column of runs_lanes, an order no
-- other index gives: the planner must not walk the tenant index, which also
-- holds every finished run.)
-- name: select_lanes
WITH RECURSIVE
    discovered(queue) AS (
        (SELECT queue FROM runs WHERE runnable_at IS NOT NULL AND %(queues)s::text[] IS NULL
         ORDER BY queue LIMIT 1)
        UNION ALL
        SELECT (SELECT r.queue FROM runs AS r
                WHERE r.runnable_at IS NOT NULL AND r.queue > d.queue ORDER BY r.queue LIMIT 1)
        FROM discovered AS d WHERE d.queue IS NOT NULL
    ),
    served(queue) AS (
        SELECT queue FROM discovered WHERE queue IS NOT NULL
        UNION
        SELECT unnest(%(queues)s::text[])
    ),
    lanes(queue, tenant, n, upto, room) AS (
        SELECT s.queue,
               (SELECT r.tenant FROM runs AS r
                WHERE r.runnable_at IS NOT NULL AND r.queue = s.queue AND r.tenant > COALESCE(c.after, '')
                  AND (c.upto IS NULL OR r.tenant <= c.upto)
                ORDER BY r.queue, r.tenant, r.priority DESC, r.runnable_at LIMIT 1),
               1, c.upto, COALESCE(c.room, %(max_lanes)s::bigint)
        FROM served AS s
        LEFT JOIN unnest(%(cursor_queues)s::text[], %(cursor_afters)s::text[], %(cursor_uptos)s::text[],
                         %(cursor_rooms)s::bigint[]) AS c(queue, after, upto, room)
               ON c.queue = s.queue
        UNION ALL
        SELECT l.queue,
               (SELECT r.tenant FROM runs AS r
                WHERE r.runnable_at IS NOT NULL AND r.queue = l.queue AND r.tenant > l.tenant
                  AND (l.upto IS NULL OR r.tenant <= l.upto)
                ORDER BY r.queue, r.tenant, r.priority DESC, r.runnable_at LIMIT 1),
               l.n + 1, l.upto, l.room
        FROM lanes AS l WHERE l.tenant IS NOT NULL AND l.n < l.room
    ),
    -- Runs locked per lane: all of `limit` when one lane has due runs, down
    -- to 2 * limit spread over many lanes (at least 1 each). A claim then
    -- locks about as many rows as it may take, however many lanes it sees;
    -- the plan needs no more (it takes `limit` runs in all, most from the
    -- least loaded lanes, and the next claim goes on from there).
    per_lane(k) AS (
        SELECT GREATEST(1, LEAST(%(limit)s::bigint, CEIL(2.0 * %(limit)s::bigint / GREATEST(count(*), 1))))::bigint
        FROM lanes AS l
        -- a probe per lane (LIMIT keeps the planner from turning it into a
        -- semi-join that reads every runnable run)
        CROSS JOIN LATERAL (
            SELECT 1 FROM runs AS r
            WHERE r.runnable_at IS NOT NULL AND r.runnable_at <= %(now)s::float8
              AND r.queue = l.queue AND r.tenant = l.tenant AND r.workflow = ANY(%(workflows)s::text[])
              AND (r.bundle IS NULL OR %(bundles)s::text[] IS NULL OR r.bundle = ANY(%(bundles)s::text[]))
            ORDER BY r.priority DESC, r.runnable_at
            LIMIT 1
        ) AS due
        WHERE l.tenant IS NOT NULL
    )
SELECT l.queue, l.tenant, c.run_id, c.status, c.priority, c.runnable_at, c.owner, c.epoch, c.recoveries,
       CASE WHEN c.run_id IS NOT NULL THEN
           (SELECT count(*) FROM runs AS x WHERE x.queue = l.queue AND x.tenant = l.tenant AND x.status = 'running')
       END
FROM lanes AS l
LEFT JOIN queues AS q ON q.name = l.queue
LEFT JOIN LATERAL (
    SELECT r.run_id, r.status, r.priority, r.runnable_at, r.owner, r.epoch, r.recoveries FROM runs AS r
    WHERE r.runnable_at IS NOT NULL AND r.runnable_at <= %(now)s::float8
      AND r.queue = l.queue AND r.tenant = l.tenant AND r.workflow = ANY(%(workflows)s::text[])
              AND (r.bundle IS NULL OR %(bundles)s::text[] IS NULL OR r.bundle = ANY(%(bundles)s::text[]))
      -- A queue or tenant already at its concurrency limit offers only
      -- takeovers (admitted at any load), before any row is locked: a
      -- saturated queue with a backlog costs its pollers reads, not locks and
      -- WAL. Read without the queue lock, so possibly stale; the plan, under
      -- the lock, decides. Stale here only delays a run to the next poll.
      AND (r.status = 'running' OR (
          (q.concurrency IS NULL OR q.concurrency >
               COALESCE((SELECT t.running FROM queue_running_totals(ARRAY[l.queue]) AS t), 0))
          AND (q.tenant_concurrency IS NULL OR q.tenant_concurrency >
               (SELECT count(*) FROM runs AS y
                WHERE y.queue = l.queue AND y.tenant = l.tenant AND y.status = 'running'))))
    ORDER BY r.priority DESC, r.runnable_at
    LIMIT (SELECT k FROM per_lane)
    FOR UPDATE SKIP LOCKED
) AS c ON true
WHERE l.tenant IS NOT NULL
ORDER BY l.queue, l.tenant, c.priority DESC, c.runnable_at

-- Limits of the queues a claim may take runs from, locked in name order (no
-- deadlock between claimers): claims of a limited queue are serialised.
-- name: lock_queues
SELECT name, concurrency, tenant_concurrency, rate_limit, rate_period, rate_burst,
       tenant_rate_limit, tenant_rate_period, tenant_rate_burst
FROM queues WHERE name = ANY(%(queues)s::text[])
ORDER BY name
FOR UPDATE

-- Counted after lock_queues, in statements of their own: under READ
-- COMMITTED they see every claim committed by the lock's previous holder.
-- name: queue_running_totals
SELECT queue, running FROM queue_running_totals(%(queues)s::text[])

-- name: lane_running
SELECT queue, tenant, count(*) FROM runs
WHERE status = 'running' AND queue = ANY(%(queues)s::text[])
GROUP BY queue, tenant

-- name: select_buckets
SELECT queue, tenant, tokens, refilled_at FROM queue_buckets WHERE queue = ANY(%(queues)s::text[])


-- name: select_queues
SELECT name, concurrency, tenant_concurrency, rate_limit, rate_period, rate_burst,
       tenant_rate_limit, tenant_rate_period, tenant_rate_burst
FROM queues ORDER BY name

-- name: upsert_queue
INSERT INTO queues (name, concurrency, tenant_concurrency, rate_limit, rate_period, rate_burst,
                    tenant_rate_limit, tenant_rate_period, tenant_rate_burst, updated_at)
VALUES (%(name)s::text, %(concurrency)s::bigint, %(tenant_concurrency)s::bigint, %(rate_limit)s::bigint,
        %(rate_period)s::float8, %(rate_burst)s::bigint, %(tenant_rate_limit)s::bigint,
        %(tenant_rate_period)s::float8, %(tenant_rate_burst)s::bigint, %(now)s::float8)
ON CONFLICT (name) DO UPDATE SET
    concurrency = excluded.concurrency, tenant_concurrency = excluded.tenant_concurrency,
    rate_limit = excluded.rate_limit, rate_period = excluded.rate_period, rate_burst = excluded.rate_burst,
    tenant_rate_limit = excluded.tenant_rate_limit, tenant_rate_period = excluded.tenant_rate_period,
    tenant_rate_burst = excluded.tenant_rate_burst, updated_at = excluded.updated_at

-- name: delete_queue
DELETE FROM queues WHERE name = %(name)s::text

-- A bucket whose rate is gone goes too (a later rate starts full).
-- name: delete_stale_buckets
DELETE FROM queue_buckets
WHERE queue = %(name)s::text
  AND ((tenant = '' AND %(rate_limit)s::bigint IS NULL) OR (tenant <> '' AND %(tenant_rate_limit)s::bigint IS NULL))

-- name: queue_counts
SELECT queue, count(*) FILTER (WHERE status = 'running'), count(*) FILTER (WHERE runnable_at <= %(now)s::float8)
FROM runs WHERE runnable_at IS NOT NULL GROUP BY queue

-- name: tenant_queue_counts
SELECT queue, count(*) FILTER (WHERE status = 'running'), count(*) FILTER (WHERE runnable_at <= %(now)s::float8)
FROM runs WHERE runnable_at IS NOT NULL AND tenant = %(tenant)s GROUP BY queue

-- Set-based claiming: several runs whose rows the claim holds FOR UPDATE, in
-- three statements for the whole batch instead of three per run. Nobody else
-- can append to those runs meanwhile, so the entries need no checks.
-- name: select_histories
SELECT run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash, attempt,
       started_at, payload, payload_ref, detail
FROM history WHERE run_id = ANY(%(run_ids)s::text[]) ORDER BY run_id, seq

-- name: claim_many
UPDATE runs SET status = 'running', owner = %(worker)s::text, epoch = runs.epoch + 1,
       lease_expires_at = %(lease_until)s::float8, runnable_at = %(lease_until)s::float8,
       wake_at = NULL, waiting_on = NULL, waiting_for = NULL, recoveries = c.recoveries, updated_at = %(now)s::float8
FROM unnest(%(run_ids)s::text[], %(recoveries)s::bigint[]) AS c(run_id, recoveries)
WHERE runs.run_id = c.run_id
RETURNING runs.run_id, workflow, workflow_version, tenant, thread_id, status, input, input_ref, result,
          result_ref, error, epoch, owner, lease_expires_at, wake_at, waiting_on, waiting_for, runs.recoveries,
          queue, priority, parent_run_id, created_at, updated_at, budget, bundle

-- name: insert_events_many
INSERT INTO history (run_id, seq, event, at, epoch, worker, detail, tenant)
SELECT e.run_id, e.seq, e.event, e.at, e.epoch, e.worker, e.detail, r.tenant
FROM unnest(%(run_ids)s::text[], %(seqs)s::bigint[], %(events)s::text[], %(ats)s::float8[],
            %(epochs)s::bigint[], %(workers)s::text[], %(details)s::text[])
     AS e(run_id, seq, event, at, epoch, worker, detail)
JOIN runs AS r ON r.run_id = e.run_id

-- Tenancy (migration 0006) --------------------------------------------------------

-- A tenant's role stores bytes only through this SECURITY DEFINER function,
-- which hashes them itself (it returns the reference).
-- name: store_artifact
SELECT store_artifact(%(data)s::bytea, %(now)s::float8)

-- The queue-wide token buckets of a claim: through the SECURITY DEFINER
-- function every role uses, which charges no more than the transaction claimed.
-- name: spend_queue_tokens
SELECT spend_queue_tokens(%(queues)s::text[], %(counts)s::bigint[], %(now)s::float8)

-- The per-tenant token buckets of a claim, likewise (migration 0025: no role
-- but the owner writes a bucket row).
-- name: spend_tenant_tokens
SELECT spend_tenant_tokens(%(queues)s::text[], %(tenants)s::text[], %(counts)s::bigint[], %(now)s::float8)

-- What the connecting role may do: whether it is exempt from row-level
-- security (a superuser, BYPASSRLS, or a member of the tables' owner), and
-- whether it is granted the tenant a scoped store names.
-- name: role_scope
SELECT r.rolsuper OR r.rolbypassrls OR pg_has_role(current_user, c.relowner, 'USAGE'),
       %(tenant)s::text IS NULL
       OR EXISTS (SELECT 1 FROM tenant_grants AS g WHERE g.role = current_user AND g.tenant = %(tenant)s::text)
FROM pg_roles AS r, pg_class AS c
WHERE r.rolname = current_user AND c.oid = 'runs'::regclass

-- Mailboxes (see schema.sql): deliveries to a run, each consumed at most
-- once by the journal entry that records it. Deliveries hold the run row
-- FOR UPDATE, so the next seq and the dedupe check cannot race; row-level
-- security keeps every statement inside the role's tenants.
-- name: message_by_dedupe
SELECT seq FROM mailbox WHERE run_id = %(run_id)s::text AND dedupe = %(dedupe)s::text

-- name: insert_message
INSERT INTO mailbox (run_id, seq, tenant, key, payload, payload_ref, sender, dedupe, sent_at)
SELECT %(run_id)s::text,
       COALESCE((SELECT MAX(m.seq) FROM mailbox AS m WHERE m.run_id = %(run_id)s::text), 0) + 1, r.tenant,
       %(key)s::text, %(payload)s::bytea, %(payload_ref)s::text, %(sender)s::text, %(dedupe)s::text,
       %(now)s::float8
FROM runs AS r WHERE r.run_id = %(run_id)s::text
RETURNING seq

-- A delivery wakes the run if it is parked waiting for exactly this key.
-- name: wake_waiting_for
UPDATE runs SET runnable_at = %(now)s::float8, updated_at = %(now)s::float8
WHERE run_id = %(run_id)s::text AND status = 'suspended' AND waiting_for = %(key)s::text

-- name: next_message
SELECT run_id, seq, key, payload, payload_ref, sender, dedupe, sent_at, taken_at, taken_position
FROM mailbox WHERE run_id = %(run_id)s::text AND key = %(key)s::text AND taken_at IS NULL
ORDER BY seq LIMIT 1

-- name: message_at
SELECT run_id, seq, key, payload, payload_ref, sender, dedupe, sent_at, taken_at, taken_position
FROM mailbox WHERE run_id = %(run_id)s::text AND seq = %(seq)s::bigint AND key = %(key)s::text

-- name: take_message
UPDATE mailbox SET taken_at = %(now)s::float8, taken_position = %(position)s::bigint
WHERE run_id = %(run_id)s::text AND seq = %(seq)s::bigint
  AND (taken_at IS NULL OR taken_position = %(released)s::bigint)

-- name: select_messages
SELECT run_id, seq, key, payload, payload_ref, sender, dedupe, sent_at, taken_at, taken_position
FROM mailbox WHERE run_id = %(run_id)s::text AND seq > %(after_seq)s::bigint
  AND (%(key)s::text IS NULL OR key = %(key)s::text)
ORDER BY seq

-- Bundles (see schema.sql) ---------------------------------------------------------
-- A bundle's id is its content's hash (the CHECK constraint): storing it
-- again changes nothing.
-- name: insert_bundle
INSERT INTO bundles (bundle_id, workflow, version, code, content, created_at)
VALUES (%(bundle_id)s::text, %(workflow)s::text, %(version)s::text, %(code)s::text, %(content)s::bytea,
        %(now)s::float8)
ON CONFLICT (bundle_id) DO NOTHING

-- name: select_bundles
SELECT bundle_id, workflow, version, code, content, created_at, served_at FROM bundles
WHERE %(workflows)s::text[] IS NULL OR workflow = ANY(%(workflows)s::text[])
ORDER BY workflow COLLATE "C", created_at, bundle_id COLLATE "C"

-- name: serve_bundles
UPDATE bundles SET served_at = %(now)s::float8
WHERE bundle_id = ANY(%(bundle_ids)s::text[]) AND (served_at IS NULL OR served_at < %(now)s::float8)

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
UPDATE runs SET bundle = %(bundle)s::text, workflow_version = %(version)s::text, updated_at = %(now)s::float8
WHERE run_id = %(run_id)s::text
RETURNING run_id, workflow, workflow_version, tenant, thread_id, status, input, input_ref, result,
          result_ref, error, epoch, owner, lease_expires_at, wake_at, waiting_on, waiting_for, recoveries,
          queue, priority, parent_run_id, created_at, updated_at, budget, bundle

-- The last seq of a run's history (a migration's fence on the journal its check read).
-- name: max_seq
SELECT COALESCE(MAX(seq), 0) FROM history WHERE run_id = %(run_id)s::text

-- Published events (ctx.set_event): the latest entry of a key, through the
-- partial index history_events.
-- name: latest_event
SELECT run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash, attempt,
       started_at, payload, payload_ref, detail
FROM history WHERE run_id = %(run_id)s::text AND step_kind = 'event' AND name = %(key)s::text
  AND event = 'step.completed'
ORDER BY seq DESC LIMIT 1

-- Approvals (see schema.sql): a request is written by the lease holder with
-- its journal entry (holding the run row), decided once by an operator
-- (holding the run row FOR UPDATE), expired once by the holder when its
-- timeout passed. A request made again at the same position (after a retry
-- voided the entry that made it) keeps its row and its decision; it points
-- at the new entry. Row-level security keeps every statement inside the
-- role's tenants.
-- name: insert_approval
INSERT INTO approvals (run_id, request_id, tenant, position, request_seq, action, type_name, schema,
                       approvers, requested_at, expires_at)
SELECT %(run_id)s::text, %(request_id)s::text, r.tenant, %(position)s::bigint, %(request_seq)s::bigint,
       %(action)s::text, %(type_name)s::text, %(schema)s::text, %(approvers)s::text, %(now)s::float8,
       %(expires_at)s::float8
FROM runs AS r WHERE r.run_id = %(run_id)s::text
ON CONFLICT (run_id, request_id) DO UPDATE SET request_seq = excluded.request_seq,
       position = excluded.position, action = excluded.action, type_name = excluded.type_name,
       schema = excluded.schema, approvers = excluded.approvers, expires_at = excluded.expires_at

-- name: expire_approval
UPDATE approvals SET status = 'expired', decided_at = %(now)s::float8
WHERE run_id = %(run_id)s::text AND request_id = %(request_id)s::text AND status = 'pending'

-- The pending requests a rewind undid (Store.rewind_run): those at or after its cut.
-- name: void_approvals
UPDATE approvals SET status = 'voided', decided_at = %(now)s::float8
WHERE run_id = %(run_id)s::text AND status = 'pending' AND position >= %(from_position)s::bigint

-- name: decide_approval
UPDATE approvals SET status = %(status)s::text, decided_by = %(actor)s::text, decided_at = %(now)s::float8,
       comment = %(comment)s::text, decision_seq = %(decision_seq)s::bigint
WHERE run_id = %(run_id)s::text AND request_id = %(request_id)s::text AND status = 'pending'

-- Approvals with what a reader needs beside the row: the request's journal
-- entry payload (its details), the decision's message payload (its edit)
-- and the run's status. pending keeps only the requests still open: pending,
-- of a run that is not finished. Ids are ordered as bytes, as SQLite and the
-- store's merge of archived runs' approvals order them.
-- name: select_approvals
SELECT a.run_id, a.request_id, a.tenant, a.position, a.request_seq, a.action, a.type_name, a.schema,
       a.approvers, a.requested_at, a.expires_at, a.status, a.decided_by, a.decided_at, a.comment,
       a.decision_seq, h.payload, h.payload_ref, m.payload, m.payload_ref, r.status
FROM approvals AS a
JOIN runs AS r ON r.run_id = a.run_id
LEFT JOIN history AS h ON h.run_id = a.run_id AND h.seq = a.request_seq
LEFT JOIN mailbox AS m ON m.run_id = a.run_id AND m.seq = a.decision_seq
WHERE (%(run_id)s::text IS NULL OR a.run_id = %(run_id)s::text)
  AND (%(request_id)s::text IS NULL OR a.request_id = %(request_id)s::text)
  AND (%(tenant)s::text IS NULL OR a.tenant = %(tenant)s::text)
  AND (NOT %(pending)s::boolean OR (a.status = 'pending' AND r.status <> ALL(%(terminal)s::text[])))
ORDER BY a.requested_at, a.run_id COLLATE "C", a.request_id COLLATE "C"
LIMIT %(limit)s::bigint

-- name: delete_approvals_of_runs
DELETE FROM approvals WHERE run_id = ANY(%(run_ids)s::text[])

-- == The HTTP API: tokens and the tenant's run changes (cairn.server) ==========================

-- name: insert_token
INSERT INTO api_tokens (token_id, tenant, role, name, digest, created_at, created_by, revoked_at)
VALUES (%(token_id)s, %(tenant)s, %(role)s, %(name)s, %(digest)s, %(created_at)s, %(created_by)s, NULL)

-- name: select_token
SELECT token_id, tenant, role, name, digest, created_at, created_by, revoked_at
FROM api_tokens WHERE token_id = %(token_id)s

-- name: list_tokens
SELECT token_id, tenant, role, name, digest, created_at, created_by, revoked_at
FROM api_tokens WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
ORDER BY tenant, created_at, token_id

-- name: revoke_token
UPDATE api_tokens SET revoked_at = %(now)s WHERE token_id = %(token_id)s AND revoked_at IS NULL

-- name: runs_changed
-- A tenant's runs changed after the cursor (updated_at, run_id), in that order.
SELECT run_id, workflow, workflow_version, tenant, thread_id, status, input, input_ref, result,
       result_ref, error, epoch, owner, lease_expires_at, wake_at, waiting_on, waiting_for, recoveries, queue,
       priority, parent_run_id, created_at, updated_at, budget, bundle
FROM runs
WHERE tenant = %(tenant)s
  AND (updated_at, run_id COLLATE "C") > (%(after_at)s::float8, %(after_run_id)s::text COLLATE "C")
  AND updated_at <= %(until)s::float8
ORDER BY updated_at, run_id COLLATE "C"
LIMIT %(limit)s::bigint

-- schedules (store/schedules.py) ---------------------------------------------

-- name: upsert_schedule
-- A worker registers what its code declares: the definition is replaced, the
-- firing state (created_at, last_tick, ...) kept.
INSERT INTO schedules (tenant, name, workflow, cron, timezone, missed, grace, created_at, updated_at,
                       started_role)
VALUES (%(tenant)s::text, %(name)s::text, %(workflow)s::text, %(cron)s::text, %(timezone)s::text,
        %(missed)s::text, %(grace)s::float8, %(now)s::float8, %(now)s::float8, %(started_role)s::text)
ON CONFLICT (tenant, name) DO UPDATE SET
    workflow = excluded.workflow, cron = excluded.cron, timezone = excluded.timezone,
    missed = excluded.missed, grace = excluded.grace, updated_at = excluded.updated_at,
    started_role = excluded.started_role
RETURNING tenant, name, workflow, cron, timezone, missed, grace, created_at, updated_at, last_tick,
          last_run_id, fired_at, fired, started_role

-- name: lock_schedule
-- The schedule row, locked until the tick's transaction ends: workers firing
-- the same tick queue here, and each later one finds last_tick moved up.
SELECT tenant, name, workflow, cron, timezone, missed, grace, created_at, updated_at, last_tick,
       last_run_id, fired_at, fired, started_role
FROM schedules WHERE tenant = %(tenant)s::text AND name = %(name)s::text
FOR UPDATE

-- name: select_schedules
SELECT tenant, name, workflow, cron, timezone, missed, grace, created_at, updated_at, last_tick,
       last_run_id, fired_at, fired, started_role
FROM schedules WHERE %(tenant)s::text IS NULL OR tenant = %(tenant)s::text
ORDER BY tenant, name

-- name: advance_schedule
-- Move last_tick up to the tick (never back); run_id is the run the tick
-- started, if it started one (created 1).
UPDATE schedules SET
    last_tick = %(tick)s::float8,
    last_run_id = CASE WHEN %(created)s::int = 1 THEN %(run_id)s::text ELSE last_run_id END,
    fired_at = CASE WHEN %(created)s::int = 1 THEN %(now)s::float8 ELSE fired_at END,
    fired = fired + %(created)s::int
WHERE tenant = %(tenant)s::text AND name = %(name)s::text
  AND (last_tick IS NULL OR last_tick < %(tick)s::float8)

-- Transactional steps (``Store.transact``): the fence, checked inside the
-- transaction before the user's body runs. FOR KEY SHARE conflicts with the
-- FOR UPDATE every epoch bump takes first (claims, takeovers, operator
-- actions), so no takeover interleaves until the commit; it does not conflict
-- with a lease renewal's UPDATE, so a long body does not starve the renewals.
-- name: transact_fence
SELECT 1 FROM runs
WHERE run_id = %(run_id)s::text AND epoch = %(epoch)s::bigint AND status = 'running'
FOR KEY SHARE

-- After a transactional step's body, in its transaction: the connection's
-- settings (those PostgresStore._configure sets) set again, since a body's
-- set_config(..., false) would outlive the commit on this pooled connection,
-- the role reset to the session's, and whether the body left a temporary
-- relation (pg_temp is searched first: it could shadow runs or history).
-- name: transact_session_check
SELECT EXISTS (SELECT 1 FROM pg_class WHERE relnamespace = pg_my_temp_schema()),
       set_config('search_path', %(search_path)s::text, false),
       set_config('synchronous_commit', %(commit)s::text, false),
       set_config('idle_in_transaction_session_timeout', %(idle)s::text, false),
       set_config('statement_timeout', %(statement)s::text, false),
       set_config('lock_timeout', %(lock)s::text, false),
       set_config('jit', 'off', false),
       set_config('role', 'none', false),
       CASE WHEN %(tenant)s::text IS NULL THEN NULL
            ELSE set_config('cairn.tenant', %(tenant)s::text, false) END

-- Memory tiers (issue 14; store/memsql.py). Expired rows are invisible at
-- once (every read compares expires_at with now); sweep_memory deletes them.
-- Namespace prefixes compare with substr, never LIKE (store/namespaces.py).

-- name: memory_run_tenant
SELECT tenant FROM runs WHERE run_id = %(run_id)s::text

-- name: put_memory_item
-- A new version of the item; an expired one starts over (created_at).
INSERT INTO memory_items (tenant, namespace, key, value, value_ref, metadata, index_text, version,
                          created_at, updated_at, accessed_at, ttl, expires_at, run_id, position,
                          operation_id, actor, tier, subject)
VALUES (%(tenant)s::text, %(namespace)s::text, %(key)s::text, %(value)s::bytea, %(value_ref)s::text, %(metadata)s::jsonb, %(index_text)s::text, 1, %(now)s::float8, %(now)s::float8, %(now)s::float8,
        %(ttl)s::float8, %(expires_at)s::float8, %(run_id)s::text, %(position)s::bigint, %(operation_id)s::text, %(actor)s::text, 'hot',
        COALESCE(%(subject)s::text, (SELECT r.subject FROM runs AS r WHERE r.run_id = %(run_id)s::text)))
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
SELECT r.tenant, %(namespace)s::text, %(key)s::text, %(value)s::bytea, %(value_ref)s::text, %(metadata)s::jsonb, %(index_text)s::text, 1, %(now)s::float8, %(now)s::float8, %(now)s::float8,
        %(ttl)s::float8, %(expires_at)s::float8, %(run_id)s::text, %(position)s::bigint, %(operation_id)s::text, %(actor)s::text, 'hot',
        COALESCE(%(subject)s::text, r.subject)
FROM runs AS r WHERE r.run_id = %(run_id)s::text
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
VALUES (%(tenant)s::text, %(namespace)s::text, %(key)s::text, %(version)s::bigint, %(now)s::float8)
ON CONFLICT (tenant, namespace, key, version) DO NOTHING

-- name: delete_memory_outbox_of_item
DELETE FROM memory_outbox WHERE tenant = %(tenant)s::text AND namespace = %(namespace)s::text AND key = %(key)s::text

-- name: delete_orphan_memory_outbox
-- Outbox rows whose item is gone (deleted, swept): nothing left to embed.
DELETE FROM memory_outbox
WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
  AND NOT EXISTS (SELECT 1 FROM memory_items AS i
                  WHERE i.tenant = memory_outbox.tenant AND i.namespace = memory_outbox.namespace
                    AND i.key = memory_outbox.key)

-- name: delete_memory_item
DELETE FROM memory_items WHERE tenant = %(tenant)s::text AND namespace = %(namespace)s::text AND key = %(key)s::text
RETURNING tenant, namespace, key

-- name: select_memory_item
-- A cold item's value is read through from memory_item_cold (codec, size, value last).
SELECT i.tenant, i.namespace, i.key, i.value, i.value_ref, i.metadata, i.index_text, i.version, i.created_at,
       i.updated_at, i.accessed_at, i.ttl, i.expires_at, i.run_id, i.position, i.operation_id, i.actor, i.tier,
       c.codec, c.size, c.value
FROM memory_items AS i
LEFT JOIN memory_item_cold AS c
       ON i.tier = 'cold' AND c.tenant = i.tenant AND c.namespace = i.namespace AND c.key = i.key
WHERE i.tenant = %(tenant)s::text AND i.namespace = %(namespace)s::text AND i.key = %(key)s::text
  AND (i.expires_at IS NULL OR i.expires_at > %(now)s::float8)

-- name: refresh_memory_item
-- A read under a refresh-on-read policy: the item lives ttl from now.
UPDATE memory_items SET accessed_at = %(now)s::float8,
    expires_at = CASE WHEN ttl IS NULL THEN NULL ELSE %(now)s::float8 + ttl END
WHERE tenant = %(tenant)s::text AND namespace = %(namespace)s::text AND key = %(key)s::text
  AND (expires_at IS NULL OR expires_at > %(now)s::float8)

-- name: list_memory_items
SELECT i.tenant, i.namespace, i.key, i.value, i.value_ref, i.metadata, i.index_text, i.version, i.created_at,
       i.updated_at, i.accessed_at, i.ttl, i.expires_at, i.run_id, i.position, i.operation_id, i.actor, i.tier,
       c.codec, c.size, c.value
FROM memory_items AS i
LEFT JOIN memory_item_cold AS c
       ON i.tier = 'cold' AND c.tenant = i.tenant AND c.namespace = i.namespace AND c.key = i.key
WHERE (%(tenant)s::text IS NULL OR i.tenant = %(tenant)s::text)
  AND substr(i.namespace, 1, length(%(prefix)s::text)) = %(prefix)s::text
  AND (i.expires_at IS NULL OR i.expires_at > %(now)s::float8)
  AND (%(run_id)s::text IS NULL OR i.run_id = %(run_id)s::text)
ORDER BY i.tenant COLLATE "C", i.namespace COLLATE "C", i.key COLLATE "C"
LIMIT %(limit)s::bigint

-- name: delete_memory_items_prefix
DELETE FROM memory_items
WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text) AND substr(namespace, 1, length(%(prefix)s::text)) = %(prefix)s::text
RETURNING tenant, namespace, key

-- name: delete_memory_items_of_run
DELETE FROM memory_items WHERE run_id = %(run_id)s::text AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
RETURNING tenant, namespace, key

-- name: put_memory_run
-- The tenant is the run's, read by the statement (never the caller's).
INSERT INTO memory_run (run_id, key, tenant, value, value_ref, version, created_at, updated_at, position,
                        operation_id, actor)
SELECT run_id, %(key)s::text, tenant, %(value)s::bytea, %(value_ref)s::text, 1, %(now)s::float8, %(now)s::float8, %(position)s::bigint, %(operation_id)s::text, %(actor)s::text
FROM runs WHERE run_id = %(run_id)s::text AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
ON CONFLICT (run_id, key) DO UPDATE SET
    value = excluded.value, value_ref = excluded.value_ref, version = memory_run.version + 1,
    updated_at = excluded.updated_at, position = excluded.position, operation_id = excluded.operation_id,
    actor = excluded.actor
RETURNING version

-- name: delete_memory_run_key
DELETE FROM memory_run WHERE run_id = %(run_id)s::text AND key = %(key)s::text

-- name: select_memory_run
SELECT run_id, tenant, key, value, value_ref, version, created_at, updated_at, position, operation_id, actor
FROM memory_run
WHERE run_id = %(run_id)s::text AND (%(key)s::text IS NULL OR key = %(key)s::text) AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
ORDER BY key COLLATE "C"

-- name: delete_memory_run_of_run
DELETE FROM memory_run WHERE run_id = %(run_id)s::text AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
RETURNING 1

-- name: delete_memory_run_of_tenant
DELETE FROM memory_run WHERE tenant = %(tenant)s::text
RETURNING 1

-- name: drop_expired_memory_messages
-- Appending to an expired thread starts a new one: its old messages go first.
DELETE FROM memory_thread_messages
WHERE tenant = %(tenant)s::text AND thread_id = %(thread_id)s::text
  AND EXISTS (SELECT 1 FROM memory_threads AS t
              WHERE t.tenant = %(tenant)s::text AND t.thread_id = %(thread_id)s::text
                AND t.expires_at IS NOT NULL AND t.expires_at <= %(now)s::float8)

-- name: drop_expired_memory_thread
DELETE FROM memory_threads
WHERE tenant = %(tenant)s::text AND thread_id = %(thread_id)s::text AND expires_at IS NOT NULL AND expires_at <= %(now)s::float8

-- name: reserve_memory_thread
-- Take %(count)s::bigint indexes at the end of the thread; returns the one after them.
-- A write refreshes the thread's retention (ttl from now).
INSERT INTO memory_threads (tenant, thread_id, next_idx, created_at, updated_at, accessed_at, ttl, expires_at)
VALUES (%(tenant)s::text, %(thread_id)s::text, %(count)s::bigint, %(now)s::float8, %(now)s::float8, %(now)s::float8, %(ttl)s::float8,
        CASE WHEN %(ttl)s::float8 IS NULL THEN NULL ELSE %(now)s::float8 + %(ttl)s::float8 END)
ON CONFLICT (tenant, thread_id) DO UPDATE SET
    next_idx = memory_threads.next_idx + %(count)s::bigint, updated_at = excluded.updated_at,
    accessed_at = excluded.accessed_at, ttl = COALESCE(%(ttl)s::float8, memory_threads.ttl),
    expires_at = CASE WHEN COALESCE(%(ttl)s::float8, memory_threads.ttl) IS NULL THEN NULL
                      ELSE %(now)s::float8 + COALESCE(%(ttl)s::float8, memory_threads.ttl) END
RETURNING next_idx

-- name: insert_memory_message
INSERT INTO memory_thread_messages (tenant, thread_id, idx, kind, value, value_ref, created_at, run_id,
                                    position, operation_id, actor, subject)
VALUES (%(tenant)s::text, %(thread_id)s::text, %(idx)s::bigint, %(kind)s::text, %(value)s::bytea, %(value_ref)s::text, %(now)s::float8, %(run_id)s::text, %(position)s::bigint, %(operation_id)s::text,
        %(actor)s::text,
        COALESCE(%(subject)s::text, (SELECT r.subject FROM runs AS r WHERE r.run_id = %(run_id)s::text)))
ON CONFLICT (tenant, thread_id, idx) DO UPDATE SET
    kind = excluded.kind, value = excluded.value, value_ref = excluded.value_ref,
    created_at = excluded.created_at, run_id = excluded.run_id, position = excluded.position,
    operation_id = excluded.operation_id, actor = excluded.actor,
    subject = excluded.subject

-- name: compact_memory_messages
DELETE FROM memory_thread_messages WHERE tenant = %(tenant)s::text AND thread_id = %(thread_id)s::text AND idx < %(upto)s::bigint - 1

-- name: select_memory_thread
SELECT next_idx FROM memory_threads
WHERE tenant = %(tenant)s::text AND thread_id = %(thread_id)s::text AND (expires_at IS NULL OR expires_at > %(now)s::float8)

-- name: refresh_memory_thread
UPDATE memory_threads SET accessed_at = %(now)s::float8,
    expires_at = CASE WHEN ttl IS NULL THEN NULL ELSE %(now)s::float8 + ttl END
WHERE tenant = %(tenant)s::text AND thread_id = %(thread_id)s::text AND (expires_at IS NULL OR expires_at > %(now)s::float8)

-- name: select_memory_messages
-- The window of a live thread: from index %(after)s::bigint + 1, at most %(limit)s::bigint.
SELECT tenant, thread_id, idx, kind, value, value_ref, created_at, run_id, position, operation_id, actor
FROM memory_thread_messages AS m
WHERE tenant = %(tenant)s::text AND thread_id = %(thread_id)s::text AND idx > %(after)s::bigint
  AND EXISTS (SELECT 1 FROM memory_threads AS t
              WHERE t.tenant = m.tenant AND t.thread_id = m.thread_id
                AND (t.expires_at IS NULL OR t.expires_at > %(now)s::float8))
ORDER BY idx
LIMIT %(limit)s::bigint

-- name: select_memory_messages_last
-- The last %(limit)s::bigint messages of a live thread (newest first: the caller reverses).
SELECT tenant, thread_id, idx, kind, value, value_ref, created_at, run_id, position, operation_id, actor
FROM memory_thread_messages AS m
WHERE tenant = %(tenant)s::text AND thread_id = %(thread_id)s::text
  AND EXISTS (SELECT 1 FROM memory_threads AS t
              WHERE t.tenant = m.tenant AND t.thread_id = m.thread_id
                AND (t.expires_at IS NULL OR t.expires_at > %(now)s::float8))
ORDER BY idx DESC
LIMIT %(limit)s::bigint

-- name: list_memory_threads
SELECT tenant, thread_id, next_idx, created_at, updated_at, expires_at FROM memory_threads
WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text) AND (expires_at IS NULL OR expires_at > %(now)s::float8)
ORDER BY tenant COLLATE "C", thread_id COLLATE "C"
LIMIT %(limit)s::bigint

-- name: delete_memory_messages_of_thread
DELETE FROM memory_thread_messages
WHERE thread_id = %(thread_id)s::text AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
RETURNING 1

-- name: delete_memory_thread
DELETE FROM memory_threads WHERE thread_id = %(thread_id)s::text AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)

-- name: delete_memory_messages_of_run
DELETE FROM memory_thread_messages WHERE run_id = %(run_id)s::text AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
RETURNING 1

-- name: delete_memory_messages_of_tenant
DELETE FROM memory_thread_messages WHERE tenant = %(tenant)s::text
RETURNING 1

-- name: delete_memory_threads_of_tenant
DELETE FROM memory_threads WHERE tenant = %(tenant)s::text

-- name: sweep_memory_items
-- Expired items (the sweep: they were invisible since they expired).
DELETE FROM memory_items
WHERE (tenant, namespace, key) IN (SELECT tenant, namespace, key FROM memory_items
                                   WHERE expires_at IS NOT NULL AND expires_at <= %(now)s::float8 LIMIT %(limit)s::bigint)
RETURNING tenant, namespace, key

-- name: sweep_memory_messages
DELETE FROM memory_thread_messages
WHERE (tenant, thread_id) IN (SELECT tenant, thread_id FROM memory_threads
                              WHERE expires_at IS NOT NULL AND expires_at <= %(now)s::float8)
RETURNING 1

-- name: sweep_memory_threads
DELETE FROM memory_threads WHERE expires_at IS NOT NULL AND expires_at <= %(now)s::float8

-- name: select_all_memory_outbox
-- Every outbox row, oldest first (inspection and tests; the embedding
-- worker claims with its own statements).
SELECT tenant, namespace, key, version, created_at, attempts, claimed_by, claimed_until, last_error
FROM memory_outbox ORDER BY id

-- Semantic memory (cairn.store.vectorindex) ---------------------------------------------------
-- The scope of a search, shared by its statements: the tenant's vectors of
-- the namespaces under %(prefix)s, made by %(embedder)s, of the item's
-- current version (a vector of an older version is stale: its item is
-- counted as unindexed instead), not expired, and whose metadata contains
-- %(filter)s (a JSON object of scalars: equality per key). The filter is
-- part of the scan, before ORDER BY ... LIMIT, so it never costs recall.

-- name: search_vectors
-- pgvector's exact cosine distance over the hot vectors that have their
-- pgvector copy (only where migration 0016 added the column; the rest are
-- scored by the client: search_without_pgvector). `pgvector_schema.` stands
-- for the extension's schema, which the store writes in at open (it stays
-- off the search_path). A zero vector has no direction: pgvector says NaN,
-- the client's scorer 1 (similarity 0); so does this.
SELECT v.namespace, v.key, v.version,
       coalesce(nullif(v.vec OPERATOR(pgvector_schema.<=>) %(vec)s::pgvector_schema.vector, 'NaN'::float8),
                1.0) AS distance
FROM memory_vectors AS v
JOIN memory_items AS i ON i.tenant = v.tenant AND i.namespace = v.namespace AND i.key = v.key
WHERE v.tenant = %(tenant)s::text
  AND (%(prefix)s::text = '' OR starts_with(v.namespace, %(prefix)s::text))
  AND (%(embedder)s::text IS NULL OR v.embedder = %(embedder)s::text) AND v.dims = %(dims)s::bigint AND i.version = v.version
  AND (i.expires_at IS NULL OR i.expires_at > %(now)s::float8)
  AND (%(filter)s::jsonb IS NULL OR i.metadata @> %(filter)s::jsonb)
  AND v.tier = 'hot' AND v.vec IS NOT NULL
ORDER BY distance, v.namespace COLLATE "C", v.key COLLATE "C"
LIMIT %(k)s::bigint

-- name: search_without_pgvector
-- The rows in scope search_vectors leaves to the client: cold ones, and hot
-- ones without a pgvector copy.
SELECT v.namespace, v.key, v.version, v.tier, v.scale, v.embedding
FROM memory_vectors AS v
JOIN memory_items AS i ON i.tenant = v.tenant AND i.namespace = v.namespace AND i.key = v.key
WHERE v.tenant = %(tenant)s::text
  AND (%(prefix)s::text = '' OR starts_with(v.namespace, %(prefix)s::text))
  AND (%(embedder)s::text IS NULL OR v.embedder = %(embedder)s::text) AND v.dims = %(dims)s::bigint AND i.version = v.version
  AND (i.expires_at IS NULL OR i.expires_at > %(now)s::float8)
  AND (%(filter)s::jsonb IS NULL OR i.metadata @> %(filter)s::jsonb)
  AND (v.tier = 'cold' OR v.vec IS NULL)

-- name: search_candidates
SELECT v.namespace, v.key, v.version, v.tier, v.scale, v.embedding
FROM memory_vectors AS v
JOIN memory_items AS i ON i.tenant = v.tenant AND i.namespace = v.namespace AND i.key = v.key
WHERE v.tenant = %(tenant)s::text
  AND (%(prefix)s::text = '' OR starts_with(v.namespace, %(prefix)s::text))
  AND (%(embedder)s::text IS NULL OR v.embedder = %(embedder)s::text) AND v.dims = %(dims)s::bigint AND i.version = v.version
  AND (i.expires_at IS NULL OR i.expires_at > %(now)s::float8)
  AND (%(filter)s::jsonb IS NULL OR i.metadata @> %(filter)s::jsonb)
  AND (%(tier)s::text IS NULL OR v.tier = %(tier)s::text)

-- name: count_unindexed
SELECT count(*) FROM (
    SELECT DISTINCT o.namespace, o.key
    FROM memory_outbox AS o
    LEFT JOIN memory_vectors AS v ON v.tenant = o.tenant AND v.namespace = o.namespace AND v.key = o.key
    WHERE o.tenant = %(tenant)s::text
      AND substr(o.namespace, 1, length(%(prefix)s::text)) = %(prefix)s::text
      AND (v.version IS NULL OR v.version < o.version)) AS pending

-- name: claim_outbox
-- SKIP LOCKED: concurrent workers pass over each other's rows.
WITH ready AS (
    SELECT id FROM memory_outbox
    WHERE claimed_until IS NULL OR claimed_until <= %(now)s::float8
    ORDER BY id LIMIT %(limit)s::bigint
    FOR UPDATE SKIP LOCKED)
UPDATE memory_outbox AS o
SET claimed_by = %(token)s::text, claimed_until = %(until)s::float8, attempts = o.attempts + 1
FROM ready WHERE o.id = ready.id
RETURNING o.id, o.tenant, o.namespace, o.key, o.version, o.attempts

-- name: outbox_item
SELECT version, index_text FROM memory_items
WHERE tenant = %(tenant)s::text AND namespace = %(namespace)s::text AND key = %(key)s::text

-- name: outbox_claimed
-- The fence: the row is held until the store's commit, so a re-claim waits
-- for it (and then finds the row gone), or came first and this finds nothing.
SELECT 1 FROM memory_outbox WHERE id = %(id)s::bigint AND claimed_by = %(token)s::text FOR UPDATE

-- name: upsert_vector
INSERT INTO memory_vectors (tenant, namespace, key, version, embedder, dims, tier, embedding, scale,
                            embedded_at)
VALUES (%(tenant)s::text, %(namespace)s::text, %(key)s::text, %(version)s::bigint, %(embedder)s::text,
        %(dims)s::bigint, 'hot', %(embedding)s::bytea, NULL, %(now)s::float8)
ON CONFLICT (tenant, namespace, key) DO UPDATE
SET version = excluded.version, embedder = excluded.embedder, dims = excluded.dims, tier = 'hot',
    embedding = excluded.embedding, scale = NULL, embedded_at = excluded.embedded_at
WHERE memory_vectors.version <= excluded.version

-- name: upsert_vector_with_pgvector
-- upsert_vector where migration 0016 added `vec`: pgvector's copy of the
-- hot vector in the same statement (a second UPDATE wrote the 3 kB row
-- again). `pgvector_schema.`: as in search_vectors.
INSERT INTO memory_vectors (tenant, namespace, key, version, embedder, dims, tier, embedding, scale,
                            embedded_at, vec)
VALUES (%(tenant)s::text, %(namespace)s::text, %(key)s::text, %(version)s::bigint, %(embedder)s::text,
        %(dims)s::bigint, 'hot', %(embedding)s::bytea, NULL, %(now)s::float8,
        %(vec)s::pgvector_schema.vector)
ON CONFLICT (tenant, namespace, key) DO UPDATE
SET version = excluded.version, embedder = excluded.embedder, dims = excluded.dims, tier = 'hot',
    embedding = excluded.embedding, scale = NULL, embedded_at = excluded.embedded_at, vec = excluded.vec
WHERE memory_vectors.version <= excluded.version

-- name: delete_outbox_upto
DELETE FROM memory_outbox WHERE tenant = %(tenant)s::text AND namespace = %(namespace)s::text
  AND key = %(key)s::text AND version <= %(version)s::bigint

-- name: delete_outbox_row
DELETE FROM memory_outbox WHERE id = %(id)s::bigint

-- name: delete_vector
DELETE FROM memory_vectors
WHERE tenant = %(tenant)s::text AND namespace = %(namespace)s::text AND key = %(key)s::text

-- name: fail_outbox
UPDATE memory_outbox SET claimed_by = NULL, claimed_until = %(retry_at)s::float8, last_error = %(error)s::text
WHERE id = %(id)s::bigint AND claimed_by = %(token)s::text

-- name: drop_vectors
DELETE FROM memory_vectors
WHERE tenant = %(tenant)s::text
  AND ((%(key)s::text IS NULL
        AND substr(namespace, 1, length(%(namespace)s::text)) = %(namespace)s::text)
       OR (namespace = %(namespace)s::text AND key = %(key)s::text))

-- name: vectors_to_cool
SELECT v.tenant, v.namespace, v.key, v.version, v.embedding
FROM memory_vectors AS v
JOIN memory_items AS i ON i.tenant = v.tenant AND i.namespace = v.namespace AND i.key = v.key
WHERE v.tier = 'hot' AND i.accessed_at < %(before)s::float8
ORDER BY v.tenant COLLATE "C", v.namespace COLLATE "C", v.key COLLATE "C"
LIMIT %(limit)s::bigint

-- name: cool_vector
UPDATE memory_vectors SET tier = 'cold', embedding = %(embedding)s::bytea, scale = %(scale)s::float8
WHERE tenant = %(tenant)s::text AND namespace = %(namespace)s::text AND key = %(key)s::text
  AND version = %(version)s::bigint AND tier = 'hot'

-- name: cool_vector_with_pgvector
-- cool_vector where migration 0016 added `vec`: pgvector's copy goes in the
-- same UPDATE (a second one wrote the 3 kB row again).
UPDATE memory_vectors SET tier = 'cold', embedding = %(embedding)s::bytea, scale = %(scale)s::float8, vec = NULL
WHERE tenant = %(tenant)s::text AND namespace = %(namespace)s::text AND key = %(key)s::text
  AND version = %(version)s::bigint AND tier = 'hot'

-- name: rewarm_vectors
INSERT INTO memory_outbox (tenant, namespace, key, version, created_at)
SELECT v.tenant, v.namespace, v.key, v.version, %(now)s::float8
FROM memory_vectors AS v
JOIN memory_items AS i ON i.tenant = v.tenant AND i.namespace = v.namespace AND i.key = v.key
WHERE v.tier = 'cold' AND i.accessed_at >= %(since)s::float8 AND i.version = v.version
ON CONFLICT (tenant, namespace, key, version) DO NOTHING
RETURNING 1

-- name: vector_tiers
SELECT tier, count(*), coalesce(sum(octet_length(embedding)), 0)
FROM memory_vectors WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
GROUP BY tier ORDER BY tier

-- name: has_pgvector
-- The schema of the type of memory_vectors.vec (pgvector's, wherever it was
-- created) and whether this role may use it; no row: no pgvector here.
SELECT n.nspname, has_schema_privilege(n.oid, 'USAGE')
FROM pg_attribute AS a
JOIN pg_type AS t ON t.oid = a.atttypid
JOIN pg_namespace AS n ON n.oid = t.typnamespace
WHERE a.attrelid = to_regclass('memory_vectors') AND a.attname = 'vec' AND NOT a.attisdropped

-- Cold tier of item values (store/memsql.py, tier_items; migration memory_cold) ----------------
-- An item's value leaves its hot row once nobody read or wrote it since
-- :before, and comes back when it was touched since; each move is one
-- transaction of these statements (the value is compressed in the client).
-- Values under min_bytes stay hot: their cold row would cost more than they do.

-- name: items_to_cool
-- FOR UPDATE: a put racing the pass waits for it (or the pass for the put).
SELECT tenant, namespace, key, version, value FROM memory_items
WHERE tier = 'hot' AND value IS NOT NULL AND length(value) >= %(min_bytes)s::bigint
  AND accessed_at < %(before)s::float8
  AND (expires_at IS NULL OR expires_at > %(now)s::float8)
ORDER BY accessed_at
LIMIT %(limit)s::bigint
FOR UPDATE SKIP LOCKED

-- name: insert_item_cold
INSERT INTO memory_item_cold (tenant, namespace, key, codec, size, value)
VALUES (%(tenant)s::text, %(namespace)s::text, %(key)s::text, %(codec)s::text, %(size)s::bigint,
        %(value)s::bytea)
ON CONFLICT (tenant, namespace, key) DO UPDATE SET codec = excluded.codec, size = excluded.size,
    value = excluded.value

-- name: cool_item
UPDATE memory_items SET value = NULL, tier = 'cold'
WHERE tenant = %(tenant)s::text AND namespace = %(namespace)s::text AND key = %(key)s::text
  AND version = %(version)s::bigint AND tier = 'hot'
RETURNING 1

-- name: items_to_rewarm
-- Cold items touched (written, or read under refresh-on-read) since :since.
SELECT i.tenant, i.namespace, i.key, i.version, c.codec, c.size, c.value
FROM memory_items AS i
JOIN memory_item_cold AS c ON c.tenant = i.tenant AND c.namespace = i.namespace AND c.key = i.key
WHERE i.tier = 'cold' AND i.accessed_at >= %(since)s::float8
LIMIT %(limit)s::bigint
FOR UPDATE OF i SKIP LOCKED

-- name: rewarm_item
-- The trigger memory_items_cold_rewarmed drops the cold copy.
UPDATE memory_items SET value = %(value)s::bytea, tier = 'hot'
WHERE tenant = %(tenant)s::text AND namespace = %(namespace)s::text AND key = %(key)s::text
  AND version = %(version)s::bigint AND tier = 'cold'

-- name: item_tiers
-- Items and the bytes of their values per tier: inline bytes of hot rows
-- (offloaded values live in the artifact store), compressed bytes of cold ones.
SELECT i.tier, count(*), coalesce(sum(length(i.value)), 0), coalesce(sum(length(c.value)), 0),
       coalesce(sum(c.size), 0)
FROM memory_items AS i
LEFT JOIN memory_item_cold AS c
       ON i.tier = 'cold' AND c.tenant = i.tenant AND c.namespace = i.namespace AND c.key = i.key
WHERE (%(tenant)s::text IS NULL OR i.tenant = %(tenant)s::text)
GROUP BY i.tier ORDER BY i.tier

-- name: select_all_item_cold
-- Every cold copy (inspection and tests: a deletion must leave none behind).
SELECT tenant, namespace, key, codec, size, value FROM memory_item_cold
ORDER BY tenant COLLATE "C", namespace COLLATE "C", key COLLATE "C"

-- A tenant's own share of a queue (migration 0023): the lanes' share rows,
-- locked in key order (after lock_queues, so every claimer takes its locks
-- in the same order), so one tenant's claims of one queue cannot both take
-- its share's last slot. A tenant's role sees and locks its own rows only.
-- name: lane_shares
SELECT s.queue, s.tenant, s.concurrency, s.rate_limit, s.rate_period, s.rate_burst, s.tokens, s.refilled_at
FROM queue_shares AS s
JOIN unnest(%(queues)s::text[], %(tenants)s::text[]) AS l(queue, tenant)
  ON s.queue = l.queue AND s.tenant = l.tenant
ORDER BY s.queue, s.tenant
FOR UPDATE OF s

-- name: select_shares
SELECT queue, tenant, concurrency, rate_limit, rate_period, rate_burst FROM queue_shares
WHERE %(tenant)s::text IS NULL OR tenant = %(tenant)s::text ORDER BY queue, tenant

-- A share replaced keeps its bucket while it has a rate (as a queue's
-- limits do); a share without one forgets it, so a later rate starts full.
-- name: upsert_share
INSERT INTO queue_shares (queue, tenant, concurrency, rate_limit, rate_period, rate_burst, updated_at)
VALUES (%(queue)s::text, %(tenant)s::text, %(concurrency)s::bigint, %(rate_limit)s::bigint,
        %(rate_period)s::float8, %(rate_burst)s::bigint, %(now)s::float8)
ON CONFLICT (queue, tenant) DO UPDATE SET
    concurrency = excluded.concurrency, rate_limit = excluded.rate_limit, rate_period = excluded.rate_period,
    rate_burst = excluded.rate_burst,
    tokens = CASE WHEN excluded.rate_limit IS NULL THEN NULL ELSE queue_shares.tokens END,
    refilled_at = CASE WHEN excluded.rate_limit IS NULL THEN NULL ELSE queue_shares.refilled_at END,
    updated_at = excluded.updated_at

-- What a claim spent of its lanes' share buckets (migration 0024: no more
-- than this transaction claimed).
-- name: spend_share_tokens
SELECT spend_share_tokens(%(queues)s::text[], %(tenants)s::text[], %(counts)s::bigint[], %(now)s::float8)

-- name: delete_share
DELETE FROM queue_shares WHERE queue = %(queue)s::text AND tenant = %(tenant)s::text

-- LangGraph checkpoints (cairn.store.checkpointsql, migration lg). Every
-- statement names its tenant: another tenant's thread is absent. The kinds a
-- saver writes most are stored as NULL (migration 0048): checkpoint_kind and
-- lg_values.kind 'zd1:msgpack', metadata_kind 'msgpack'; every read coalesces them back.
-- Metadata compressed ('zd1:msgpack', since issue 24, 2026-12-06) is stored with the
-- empty kind '' (1 byte, where the text took 12): no serializer type is empty, and rows
-- written before never hold it.

-- name: lg_lock_thread
-- one writer per thread at a time (SQLite has one writer per database); and, for this
-- transaction, index scans over sequential ones (lg_fold_writes)
SELECT pg_advisory_xact_lock(hashtextextended(%(tenant)s || '/' || %(thread_id)s::text, 0)),
       set_config('enable_seqscan', 'off', true)

-- name: lg_put_checkpoint
-- and the parent's pending writes folded into its row, when the put moved them
-- (checkpointsql._lg_fold: folded_id NULL when not), in the same statement
-- (and the folded writes' digests appended to the parent's refs, for lg_read_one: a parent
-- written before migration 0045 keeps NULL there and is read as before)
WITH folded AS (
    UPDATE lg_checkpoints SET writes = %(folded)s::bytea, refs = refs || %(folded_refs)s::bytea
    WHERE %(folded_id)s::bytea IS NOT NULL AND tenant = %(tenant)s AND thread_id = %(thread_id)s::text
      AND ns = %(ns)s::text AND checkpoint_id = %(folded_id)s::bytea AND writes IS NULL
)
INSERT INTO lg_checkpoints (tenant, thread_id, ns, checkpoint_id, parent_id, run_id,
                            checkpoint_kind, checkpoint, metadata_kind, metadata, names, refs)
VALUES (%(tenant)s, %(thread_id)s::text, %(ns)s::text, %(checkpoint_id)s::bytea, %(parent_id)s::bytea, %(run_id)s::text,
        nullif(%(checkpoint_kind)s::text, 'zd1:msgpack'), %(checkpoint)s,
        CASE %(metadata_kind)s::text WHEN 'msgpack' THEN NULL WHEN 'zd1:msgpack' THEN ''
             ELSE %(metadata_kind)s::text END, %(metadata)s, %(names)s::text, %(refs)s::bytea)
ON CONFLICT (tenant, thread_id, ns, checkpoint_id) DO UPDATE SET
    parent_id = excluded.parent_id, run_id = excluded.run_id,
    checkpoint_kind = excluded.checkpoint_kind, checkpoint = excluded.checkpoint,
    metadata_kind = excluded.metadata_kind, metadata = excluded.metadata,
    -- a row already folded keeps its writes, and is read as before (its refs lack theirs)
    names = CASE WHEN lg_checkpoints.writes IS NULL THEN excluded.names END, refs = excluded.refs

-- name: lg_fold_writes
-- a put moves its parent's pending writes out of lg_writes, to fold them into the parent's
-- row (checkpointsql._lg_fold): only a parent that is stored and not folded yet. It walks the
-- thread's keys up to the parent's by the index (the parent's id is matched as an expression,
-- no index bound; lg_lock_thread turns sequential scans off: the planner took one once the
-- table was vacuumed empty), so PostgreSQL marks the keys earlier folds deleted as dead and
-- cleans the page they fill instead of splitting it: the index kept every key ever inserted
-- until a VACUUM, 385 bytes a super-step at 3,000 (tests/langgraph/test_writes_index.py)
DELETE FROM lg_writes
WHERE tenant = %(tenant)s AND thread_id = %(thread_id)s::text AND ns = %(ns)s::text
  AND checkpoint_id <= %(checkpoint_id)s::bytea
  AND (checkpoint_id || ''::bytea) = %(checkpoint_id)s::bytea
  AND EXISTS (SELECT 1 FROM lg_checkpoints AS c
              WHERE c.tenant = %(tenant)s AND c.thread_id = %(thread_id)s::text AND c.ns = %(ns)s::text
                AND c.checkpoint_id = %(checkpoint_id)s::bytea AND c.writes IS NULL)
RETURNING task_id, idx, channel, task_path, kind, refs

-- name: lg_put_value
INSERT INTO lg_values (tenant, thread_id, digest, kind, data)
VALUES (%(tenant)s, %(thread_id)s::text, %(digest)s, nullif(%(kind)s::text, 'zd1:msgpack'), %(data)s)
ON CONFLICT (tenant, thread_id, digest) DO NOTHING

-- name: lg_blob_depth
SELECT depth FROM lg_blobs
WHERE tenant = %(tenant)s AND thread_id = %(thread_id)s::text AND ns = %(ns)s::text AND channel = %(channel)s AND version = %(version)s

-- name: lg_put_values_many
-- a put's new values in one statement (SQLite inserts them one by one)
INSERT INTO lg_values (tenant, thread_id, digest, kind, data)
SELECT %(tenant)s, %(thread_id)s::text, u.digest, nullif(u.kind, 'zd1:msgpack'), u.data
FROM unnest(%(digests)s::bigint[], %(kinds)s::text[], %(datas)s::bytea[]) AS u (digest, kind, data)
ON CONFLICT (tenant, thread_id, digest) DO NOTHING

-- name: lg_put_blobs_many
-- a put's channel versions in one statement: a list naming a base still stored whose
-- chain is below max_depth keeps its base and holds only its added items, else it is whole
-- (the base found by its whole primary key: see lg_page_reads)
INSERT INTO lg_blobs (tenant, thread_id, ns, channel, version, kind, base, depth, refs)
SELECT %(tenant)s, %(thread_id)s::text, %(ns)s::text, u.channel, u.version, u.kind,
       CASE WHEN b.depth + 1 < %(max_depth)s THEN u.base END,
       CASE WHEN b.depth + 1 < %(max_depth)s THEN b.depth + 1 ELSE 0 END,
       CASE WHEN b.depth + 1 < %(max_depth)s THEN u.added ELSE u.refs END
FROM unnest(%(channels)s::text[], %(versions)s::text[], %(kinds)s::text[], %(bases)s::text[],
            %(refs)s::bytea[], %(added)s::bytea[]) AS u (channel, version, kind, base, refs, added)
LEFT JOIN LATERAL (SELECT x.depth FROM lg_blobs AS x
                   WHERE x.tenant = %(tenant)s AND x.thread_id = %(thread_id)s::text AND x.ns = %(ns)s::text
                     AND x.channel = u.channel AND x.version = u.base AND u.base <> u.version
                   LIMIT 1) AS b ON true
ON CONFLICT (tenant, thread_id, ns, channel, version) DO UPDATE SET
    kind = excluded.kind, base = excluded.base, depth = excluded.depth, refs = excluded.refs

-- name: lg_put_writes_many
-- pending writes in one statement, into their checkpoint's row: one more record appended to its
-- folded writes (checkpointsql.fold_writes; unfold_writes reads the records in order, a regular
-- write (idx >= 0) kept as first written, a special one (idx < 0) as last written) and their
-- digests to its refs. A row updated, not a row of lg_writes inserted and then deleted by the
-- fold: those left their key in lg_writes' index until a VACUUM, 385 bytes a super-step at 3,000
-- (0.38 of the logical bytes). A checkpoint not stored (yet) gets rows of lg_writes, as before:
-- a regular write kept as first written, a special one replacing the last.
WITH kept AS (
    UPDATE lg_checkpoints SET writes = coalesce(writes, ''::bytea) || %(record)s::bytea,
                              refs = refs || %(record_refs)s::bytea
    WHERE tenant = %(tenant)s AND thread_id = %(thread_id)s::text AND ns = %(ns)s::text
      AND checkpoint_id = %(checkpoint_id)s::bytea
    RETURNING 1
)
INSERT INTO lg_writes (tenant, thread_id, ns, checkpoint_id, task_id, idx, channel, task_path, kind, refs)
SELECT %(tenant)s, %(thread_id)s::text, %(ns)s::text, %(checkpoint_id)s::bytea, u.task_id, u.idx, u.channel,
       u.task_path, u.kind, u.refs
FROM unnest(%(task_ids)s::text[], %(idxs)s::bigint[], %(channels)s::text[], %(task_paths)s::text[],
            %(kinds)s::text[], %(refs)s::bytea[]) AS u (task_id, idx, channel, task_path, kind, refs)
WHERE NOT EXISTS (SELECT 1 FROM kept)
ON CONFLICT (tenant, thread_id, ns, checkpoint_id, task_id, idx) DO UPDATE SET
    channel = excluded.channel, task_path = excluded.task_path, kind = excluded.kind, refs = excluded.refs
    WHERE excluded.idx < 0

-- name: lg_latest_checkpoint
SELECT thread_id, ns, lg_id_text(checkpoint_id), lg_id_text(parent_id), coalesce(checkpoint_kind, 'zd1:msgpack'), checkpoint,
       CASE metadata_kind WHEN '' THEN 'zd1:msgpack' ELSE coalesce(metadata_kind, 'msgpack') END, metadata
FROM lg_checkpoints
WHERE tenant = %(tenant)s AND thread_id = %(thread_id)s::text AND ns = %(ns)s::text
ORDER BY checkpoint_id DESC LIMIT 1

-- name: lg_checkpoint
SELECT thread_id, ns, lg_id_text(checkpoint_id), lg_id_text(parent_id), coalesce(checkpoint_kind, 'zd1:msgpack'), checkpoint,
       CASE metadata_kind WHEN '' THEN 'zd1:msgpack' ELSE coalesce(metadata_kind, 'msgpack') END, metadata
FROM lg_checkpoints
WHERE tenant = %(tenant)s AND thread_id = %(thread_id)s::text AND ns = %(ns)s::text AND checkpoint_id = %(checkpoint_id)s::bytea

-- name: lg_list_checkpoints
SELECT thread_id, ns, lg_id_text(checkpoint_id), lg_id_text(parent_id), coalesce(checkpoint_kind, 'zd1:msgpack'), checkpoint,
       CASE metadata_kind WHEN '' THEN 'zd1:msgpack' ELSE coalesce(metadata_kind, 'msgpack') END, metadata
FROM lg_checkpoints
WHERE tenant = %(tenant)s AND (%(thread_id)s::text IS NULL OR thread_id = %(thread_id)s::text) AND (%(ns)s::text IS NULL OR ns = %(ns)s::text)
  AND (%(checkpoint_id)s::bytea IS NULL OR checkpoint_id = %(checkpoint_id)s::bytea) AND (%(before)s::bytea IS NULL OR checkpoint_id < %(before)s::bytea)
ORDER BY thread_id COLLATE "C", ns COLLATE "C", checkpoint_id DESC
LIMIT %(limit)s::bigint

-- name: lg_list_thread
-- a page of one thread's namespace, newest first: ids in "C" order, the key's own since
-- migration 0041, so the primary key is read backwards and stops after the page
SELECT thread_id, ns, lg_id_text(checkpoint_id), lg_id_text(parent_id), coalesce(checkpoint_kind, 'zd1:msgpack'), checkpoint,
       CASE metadata_kind WHEN '' THEN 'zd1:msgpack' ELSE coalesce(metadata_kind, 'msgpack') END, metadata
FROM lg_checkpoints
WHERE tenant = %(tenant)s AND thread_id = %(thread_id)s::text AND ns = %(ns)s::text
ORDER BY checkpoint_id DESC
LIMIT %(limit)s::bigint

-- name: lg_list_thread_before
SELECT thread_id, ns, lg_id_text(checkpoint_id), lg_id_text(parent_id), coalesce(checkpoint_kind, 'zd1:msgpack'), checkpoint,
       CASE metadata_kind WHEN '' THEN 'zd1:msgpack' ELSE coalesce(metadata_kind, 'msgpack') END, metadata
FROM lg_checkpoints
WHERE tenant = %(tenant)s AND thread_id = %(thread_id)s::text AND ns = %(ns)s::text
  AND checkpoint_id < %(before)s::bytea
ORDER BY checkpoint_id DESC
LIMIT %(limit)s::bigint

-- name: lg_read_one
-- a checkpoint (checkpoint_id, or the namespace's latest when NULL) with its channel chains,
-- pending writes and their values, in one statement, one round trip (get_state;
-- checkpointsql.lg_read_one), from the columns of migration 0045. Rows by part: 0 the checkpoint,
-- 1 a chain's blob, 2 a row of lg_writes, 3 its folded writes, 4 a value, 5 a held list. A list
-- whose digests start the caller's copy of that channel is held: neither its chain nor its values
-- are sent, only how many bytes of the caller's copy it is. The caller's copies are two scalars
-- (issue 24, 2026-12-07: psycopg dumps a list parameter in Python, ~40 us a read for the two
-- arrays this took before): known_refs, every copy's digests one after the other, in binary (%b:
-- a list of 3,000 items is 24 KB, which psycopg's text format spelled in hex and escaped, 0.5 ms
-- a read), and known, "channel, offset, length, ..." joined by the unit separator.
-- lg_names and lg_digests are spelled out here, not called: declared STRICT, they are never
-- inlined, and each call site planned its function's body at every execution (~0.1 ms a read of
-- the server's CPU). unnest, not generate_series, so the planner expects ~10 rows, not 1,000 (it
-- sized the values' hash table for 40,000 digests: 1.5 MB a read). Statements of at most 4,096
-- bytes once loaded (sqlfiles: psycopg caches the parse of those only).
-- The id is a range of the primary key (one id, or up to the
-- namespace's greatest, read backwards, LIMIT 1): one plan for both, never a filter over the
-- thread's checkpoints, and no bound a database's encoding could refuse. The greatest id is the
-- key's last entry (ORDER BY ... LIMIT 1): max(checkpoint_id COLLATE "C") was an aggregate over
-- the namespace's every key, 1.05 ms at 3,000 checkpoints (EXPLAIN ANALYZE).
WITH RECURSIVE c AS (
    SELECT x.checkpoint_id, lg_id_text(x.parent_id) AS parent_id, coalesce(x.checkpoint_kind, 'zd1:msgpack') AS checkpoint_kind,
           x.checkpoint, CASE x.metadata_kind WHEN '' THEN 'zd1:msgpack'
                       ELSE coalesce(x.metadata_kind, 'msgpack') END AS metadata_kind, x.metadata,
           x.writes, x.names, x.refs
    FROM lg_checkpoints AS x
    WHERE x.tenant = %(tenant)s AND x.thread_id = %(thread_id)s::text AND x.ns = %(ns)s::text
      AND x.checkpoint_id >= coalesce(%(checkpoint_id)s::bytea, ''::bytea)
      AND x.checkpoint_id <= coalesce(%(checkpoint_id)s::bytea,
                                                  (SELECT m.checkpoint_id FROM lg_checkpoints AS m
                                                   WHERE m.tenant = %(tenant)s AND m.thread_id = %(thread_id)s::text
                                                     AND m.ns = %(ns)s::text
                                                   ORDER BY m.checkpoint_id DESC LIMIT 1))
    ORDER BY x.checkpoint_id DESC
    LIMIT 1
),
named (channel, version) AS (  -- lg_names(c.names)
    SELECT u.x, n[u.k + 1] FROM c, string_to_array(c.names, chr(31)) AS n, unnest(n) WITH ORDINALITY AS u (x, k)
    WHERE u.k %% 2 = 1
),
chain (channel, kind, base, depth, refs) AS (
    SELECT b.channel, b.kind, b.base, b.depth, b.refs
    FROM named AS w,
         LATERAL (SELECT x.channel, x.kind, x.base, x.depth, x.refs FROM lg_blobs AS x
                  WHERE x.tenant = %(tenant)s AND x.thread_id = %(thread_id)s::text AND x.ns = %(ns)s::text
                    AND x.channel = w.channel AND x.version = w.version
                  LIMIT 1) AS b
    UNION ALL
    SELECT b.channel, b.kind, b.base, b.depth, b.refs
    FROM chain AS h,
         LATERAL (SELECT x.channel, x.kind, x.base, x.depth, x.refs FROM lg_blobs AS x
                  WHERE x.tenant = %(tenant)s AND x.thread_id = %(thread_id)s::text AND x.ns = %(ns)s::text
                    AND x.channel = h.channel AND x.version = h.base
                  LIMIT 1) AS b
),
held AS (
    -- the list channels whose items the caller holds: its copy starts with the chain's digests
    SELECT l.channel, length(l.whole) AS size
    FROM (SELECT channel, string_agg(refs, ''::bytea ORDER BY depth) AS whole, bool_and(kind = 'list') AS list
          FROM chain GROUP BY channel) AS l
    JOIN (SELECT u.x, a[u.k + 1]::int, a[u.k + 2]::int
          FROM string_to_array(%(known)s::text, chr(31)) AS a, unnest(a) WITH ORDINALITY AS u (x, k)
          WHERE u.k %% 3 = 1) AS k (channel, at, size) ON k.channel = l.channel
    WHERE l.list AND length(l.whole) <= k.size
      AND substring(%(known_refs)b::bytea FROM k.at + 1 FOR length(l.whole)) = l.whole
),
side AS (
    SELECT y.task_id, y.idx, y.channel, y.task_path, y.kind, y.refs
    FROM c, LATERAL (SELECT * FROM lg_writes AS z
                     WHERE z.tenant = %(tenant)s AND z.thread_id = %(thread_id)s::text AND z.ns = %(ns)s::text
                       AND z.checkpoint_id = c.checkpoint_id
                     OFFSET 0) AS y
),
wanted (digest) AS (  -- lg_digests of each refs, each digest once
    SELECT DISTINCT d
    FROM (SELECT refs FROM c UNION ALL SELECT refs FROM side
          UNION ALL SELECT refs FROM chain WHERE channel NOT IN (SELECT channel FROM held)) AS w (r),
         unnest(ARRAY(SELECT get_byte(r, o)::bigint | (get_byte(r, o + 1)::bigint << 8)
                             | (get_byte(r, o + 2)::bigint << 16) | (get_byte(r, o + 3)::bigint << 24)
                             | (get_byte(r, o + 4)::bigint << 32) | (get_byte(r, o + 5)::bigint << 40)
                             | (get_byte(r, o + 6)::bigint << 48) | (get_byte(r, o + 7)::bigint << 56)
                      FROM generate_series(0, length(r) - 8, 8) AS o)) AS d
)
SELECT 0 AS part, lg_id_text(checkpoint_id), parent_id, checkpoint_kind, metadata_kind, names, checkpoint, metadata,
       NULL::bigint AS n
FROM c
UNION ALL
SELECT 1, channel, kind, base, NULL, NULL, refs, NULL, depth FROM chain
WHERE channel NOT IN (SELECT channel FROM held)
UNION ALL
SELECT 5, channel, NULL, NULL, NULL, NULL, NULL, NULL, size FROM held
UNION ALL
SELECT 2, task_id, channel, task_path, kind, NULL, refs, NULL, idx FROM side
UNION ALL
SELECT 3, NULL, NULL, NULL, NULL, NULL, writes, NULL, NULL FROM c WHERE writes IS NOT NULL
UNION ALL
SELECT 4, NULL, v.kind, NULL, NULL, NULL, v.data, NULL, v.digest
FROM wanted AS w,
     LATERAL (SELECT x.digest, coalesce(x.kind, 'zd1:msgpack') AS kind, x.data FROM lg_values AS x
              WHERE x.tenant = %(tenant)s AND x.thread_id = %(thread_id)s::text AND x.digest = w.digest
              LIMIT 1) AS v

-- name: lg_read_page
-- a page of one namespace's checkpoints, newest first (before %(before)s when not NULL, at
-- most %(limit)s), with their channel chains, pending writes and values, in one statement, one
-- round trip (a history page; checkpointsql.lg_read_page): lg_read_one for several rows. Rows
-- by part: 0 a checkpoint, 1 a blob (each once: the page's chains share them), 2 a row of
-- lg_writes, 3 a checkpoint's folded writes, 4 a value (each once), 5 a held list (its start
-- version and how many bytes of the caller's copy it is). The page is a range of the primary
-- key read backwards (up to before, or to the namespace's greatest id), as in lg_read_one.
WITH RECURSIVE c AS (
    SELECT x.checkpoint_id, lg_id_text(x.parent_id) AS parent_id, coalesce(x.checkpoint_kind, 'zd1:msgpack') AS checkpoint_kind,
           x.checkpoint, CASE x.metadata_kind WHEN '' THEN 'zd1:msgpack'
                       ELSE coalesce(x.metadata_kind, 'msgpack') END AS metadata_kind, x.metadata,
           x.writes, x.names, x.refs
    FROM lg_checkpoints AS x
    WHERE x.tenant = %(tenant)s AND x.thread_id = %(thread_id)s::text AND x.ns = %(ns)s::text
      AND x.checkpoint_id <= coalesce(%(before)s::bytea,
                                                  (SELECT m.checkpoint_id FROM lg_checkpoints AS m
                                                   WHERE m.tenant = %(tenant)s AND m.thread_id = %(thread_id)s::text
                                                     AND m.ns = %(ns)s::text
                                                   ORDER BY m.checkpoint_id DESC LIMIT 1))
      AND x.checkpoint_id IS DISTINCT FROM %(before)s::bytea
    ORDER BY x.checkpoint_id DESC
    LIMIT %(limit)s::bigint
),
named (channel, version) AS (
    SELECT DISTINCT n.channel, n.version FROM c, LATERAL lg_names(c.names) AS n
),
chain (channel, start, version, kind, base, depth, refs) AS (
    SELECT w.channel, w.version, w.version, b.kind, b.base, b.depth, b.refs
    FROM named AS w,
         LATERAL (SELECT x.kind, x.base, x.depth, x.refs FROM lg_blobs AS x
                  WHERE x.tenant = %(tenant)s AND x.thread_id = %(thread_id)s::text AND x.ns = %(ns)s::text
                    AND x.channel = w.channel AND x.version = w.version
                  LIMIT 1) AS b
    UNION ALL
    SELECT h.channel, h.start, h.base, b.kind, b.base, b.depth, b.refs
    FROM chain AS h,
         LATERAL (SELECT x.kind, x.base, x.depth, x.refs FROM lg_blobs AS x
                  WHERE x.tenant = %(tenant)s AND x.thread_id = %(thread_id)s::text AND x.ns = %(ns)s::text
                    AND x.channel = h.channel AND x.version = h.base
                  LIMIT 1) AS b
),
held AS (
    -- the list versions whose items the caller holds: its copy starts with the chain's digests
    SELECT l.channel, l.start, length(l.whole) AS size
    FROM (SELECT channel, start, string_agg(refs, ''::bytea ORDER BY depth) AS whole,
                 bool_and(kind = 'list') AS list
          FROM chain GROUP BY channel, start) AS l
    JOIN unnest(%(known_channels)s::text[], %(known_refs)b::bytea[]) AS k (channel, refs) ON k.channel = l.channel
    WHERE l.list AND substring(k.refs FROM 1 FOR length(l.whole)) = l.whole
),
sent AS (
    -- the blobs of the chains not held, each once
    SELECT DISTINCT ON (h.channel, h.version) h.channel, h.version, h.kind, h.base, h.depth, h.refs
    FROM chain AS h
    WHERE NOT EXISTS (SELECT 1 FROM held AS k WHERE k.channel = h.channel AND k.start = h.start)
),
side AS (
    SELECT lg_id_text(c.checkpoint_id) AS at, y.task_id, y.idx, y.channel, y.task_path, y.kind, y.refs
    FROM c, LATERAL (SELECT * FROM lg_writes AS z
                     WHERE z.tenant = %(tenant)s AND z.thread_id = %(thread_id)s::text AND z.ns = %(ns)s::text
                       AND z.checkpoint_id = c.checkpoint_id
                     OFFSET 0) AS y
),
wanted (digest) AS (
    SELECT d FROM c, LATERAL lg_digests(c.refs) AS d
    UNION
    SELECT d FROM sent AS h, LATERAL lg_digests(h.refs) AS d
    UNION
    SELECT d FROM side AS w, LATERAL lg_digests(w.refs) AS d
)
SELECT 0 AS part, lg_id_text(checkpoint_id), parent_id, checkpoint_kind, metadata_kind, names, checkpoint, metadata,
       NULL::bigint AS n
FROM c
UNION ALL
SELECT 1, channel, version, kind, base, NULL, refs, NULL, depth FROM sent
UNION ALL
SELECT 5, channel, start, NULL, NULL, NULL, NULL, NULL, size FROM held
UNION ALL
SELECT 2, task_id, channel, task_path, kind, at, refs, NULL, idx FROM side
UNION ALL
SELECT 3, lg_id_text(checkpoint_id), NULL, NULL, NULL, NULL, writes, NULL, NULL FROM c WHERE writes IS NOT NULL
UNION ALL
SELECT 4, NULL, v.kind, NULL, NULL, NULL, v.data, NULL, v.digest
FROM wanted AS w,
     LATERAL (SELECT x.digest, coalesce(x.kind, 'zd1:msgpack') AS kind, x.data FROM lg_values AS x
              WHERE x.tenant = %(tenant)s AND x.thread_id = %(thread_id)s::text AND x.digest = w.digest
              LIMIT 1) AS v

-- name: lg_page_reads
-- the channel chains and the pending writes of a page of checkpoints (row i of the page:
-- its channels' versions, and its (thread, ns, checkpoint id)) in one statement, one round
-- trip (checkpointsql._lg_page); chains by channel, the oldest first, then writes by task
-- path, task id and index. Each blob is found by its whole primary key (LATERAL ... LIMIT 1:
-- the planner, with the statistics of a freshly filled table, scanned the thread's every blob
-- per chain step: 120 ms at 300 super-steps).
WITH RECURSIVE chain (i, thread_id, ns, channel, kind, base, depth, refs) AS (
    SELECT w.i, w.thread_id, w.ns, b.channel, b.kind, b.base, b.depth, b.refs
    FROM unnest(%(rows)s::bigint[], %(threads)s::text[], %(nss)s::text[], %(channels)s::text[],
                %(versions)s::text[]) AS w (i, thread_id, ns, channel, version),
         LATERAL (SELECT x.channel, x.kind, x.base, x.depth, x.refs FROM lg_blobs AS x
                  WHERE x.tenant = %(tenant)s AND x.thread_id = w.thread_id AND x.ns = w.ns
                    AND x.channel = w.channel AND x.version = w.version
                  LIMIT 1) AS b
    UNION ALL
    SELECT c.i, c.thread_id, c.ns, b.channel, b.kind, b.base, b.depth, b.refs
    FROM chain AS c,
         LATERAL (SELECT x.channel, x.kind, x.base, x.depth, x.refs FROM lg_blobs AS x
                  WHERE x.tenant = %(tenant)s AND x.thread_id = c.thread_id AND x.ns = c.ns
                    AND x.channel = c.channel AND x.version = c.base
                  LIMIT 1) AS b
)
SELECT i, is_write, channel, kind, base, refs, task_id, idx, task_path FROM (
    SELECT i, false AS is_write, channel, kind, base, refs, NULL::text AS task_id, NULL::bigint AS idx,
           NULL::text AS task_path, channel AS s1, ''::text AS s2, depth AS s3
    FROM chain
    UNION ALL
    SELECT w.i, true, x.channel, x.kind, NULL, x.refs, x.task_id, x.idx, x.task_path, x.task_path, x.task_id, x.idx
    FROM unnest(%(wrows)s::bigint[], %(wthreads)s::text[], %(wnss)s::text[], %(wids)s::bytea[])
             AS w (i, thread_id, ns, checkpoint_id),
         LATERAL (SELECT * FROM lg_writes AS y
                  WHERE y.tenant = %(tenant)s AND y.thread_id = w.thread_id AND y.ns = w.ns
                    AND y.checkpoint_id = w.checkpoint_id
                  OFFSET 0) AS x  -- not pulled up: sought by the key, not a join over the tenant's writes
    UNION ALL
    -- the checkpoint's folded writes, read in this statement's snapshot with its rows of lg_writes
    -- (a put folding them between this and the statement that read the checkpoint moves them
    -- from one to the other): a row with NULL task id (checkpointsql.read_writes)
    SELECT f.i, true, NULL, NULL, NULL, z.writes, NULL, NULL, NULL, '', '', NULL
    FROM unnest(%(wrows)s::bigint[], %(wthreads)s::text[], %(wnss)s::text[], %(wids)s::bytea[])
             AS f (i, thread_id, ns, checkpoint_id),
         LATERAL (SELECT y.writes FROM lg_checkpoints AS y
                  WHERE y.tenant = %(tenant)s AND y.thread_id = f.thread_id AND y.ns = f.ns
                    AND y.checkpoint_id = f.checkpoint_id AND y.writes IS NOT NULL
                  LIMIT 1) AS z
) AS r
ORDER BY i, is_write, s1 COLLATE "C", s2 COLLATE "C", s3

-- name: lg_page_values
-- values by (thread, digest), each by its whole primary key (LATERAL ... LIMIT 1: with the
-- statistics of a freshly filled table the planner took "digest = ANY" as a filter over the
-- thread's every value, 4 ms at 3,000 of them, instead of one index seek per digest)
SELECT w.thread_id, v.digest, v.kind, v.data
FROM unnest(%(threads)s::text[], %(digests)s::bigint[]) AS w (thread_id, digest),
     LATERAL (SELECT x.digest, coalesce(x.kind, 'zd1:msgpack') AS kind, x.data FROM lg_values AS x
              WHERE x.tenant = %(tenant)s AND x.thread_id = w.thread_id AND x.digest = w.digest
              LIMIT 1) AS v

-- name: lg_delete_thread_checkpoints
DELETE FROM lg_checkpoints WHERE tenant = %(tenant)s AND thread_id = %(thread_id)s::text

-- name: lg_delete_thread_blobs
DELETE FROM lg_blobs WHERE tenant = %(tenant)s AND thread_id = %(thread_id)s::text

-- name: lg_delete_thread_writes
DELETE FROM lg_writes WHERE tenant = %(tenant)s AND thread_id = %(thread_id)s::text

-- name: lg_delete_thread_values
DELETE FROM lg_values WHERE tenant = %(tenant)s AND thread_id = %(thread_id)s::text

-- name: lg_delete_runs
DELETE FROM lg_checkpoints WHERE tenant = %(tenant)s AND run_id = ANY(%(run_ids)s::text[])
RETURNING thread_id

-- name: lg_delete_older
-- every checkpoint of the thread but the latest of each namespace
DELETE FROM lg_checkpoints
WHERE tenant = %(tenant)s AND thread_id = %(thread_id)s::text
  AND checkpoint_id < (SELECT c.checkpoint_id FROM lg_checkpoints AS c
                       WHERE c.tenant = lg_checkpoints.tenant AND c.thread_id = lg_checkpoints.thread_id
                         AND c.ns = lg_checkpoints.ns ORDER BY c.checkpoint_id DESC LIMIT 1)

-- name: lg_delete_orphan_writes
-- writes of checkpoints not stored (a prune's, delete_for_runs'), but those after their namespace's
-- latest checkpoint: a super-step whose checkpoint's put is still to come, a writer in flight
-- (deleting them collected the values they name, which that writer's saver still took for stored)
DELETE FROM lg_writes
WHERE tenant = %(tenant)s AND thread_id = %(thread_id)s::text
  AND NOT EXISTS (SELECT 1 FROM lg_checkpoints AS c
                  WHERE c.tenant = lg_writes.tenant AND c.thread_id = lg_writes.thread_id
                    AND c.ns = lg_writes.ns AND c.checkpoint_id = lg_writes.checkpoint_id)
  AND NOT coalesce(lg_writes.checkpoint_id > (SELECT c.checkpoint_id FROM lg_checkpoints AS c
                                              WHERE c.tenant = lg_writes.tenant
                                                AND c.thread_id = lg_writes.thread_id
                                                AND c.ns = lg_writes.ns
                                              ORDER BY c.checkpoint_id DESC LIMIT 1), false)

-- name: lg_thread_checkpoints
SELECT ns, lg_id_text(checkpoint_id), coalesce(checkpoint_kind, 'zd1:msgpack'), checkpoint FROM lg_checkpoints
WHERE tenant = %(tenant)s AND thread_id = %(thread_id)s::text

-- name: lg_thread_blobs
SELECT ns, channel, version, base FROM lg_blobs WHERE tenant = %(tenant)s AND thread_id = %(thread_id)s::text

-- name: lg_delete_blob
DELETE FROM lg_blobs
WHERE tenant = %(tenant)s AND thread_id = %(thread_id)s::text AND ns = %(ns)s::text AND channel = %(channel)s AND version = %(version)s

-- name: lg_thread_refs
-- every packed digest list of the thread (and, with their checkpoint id, its folded writes)
SELECT refs, NULL::text FROM lg_blobs WHERE tenant = %(tenant)s AND thread_id = %(thread_id)s::text
UNION ALL
SELECT refs, NULL FROM lg_writes WHERE tenant = %(tenant)s AND thread_id = %(thread_id)s::text
UNION ALL
SELECT writes, lg_id_text(checkpoint_id) FROM lg_checkpoints
WHERE tenant = %(tenant)s AND thread_id = %(thread_id)s::text AND writes IS NOT NULL

-- name: lg_thread_digests
-- every value of the thread, and whether it is a compression dictionary (cairn.lgdictionary)
SELECT digest, kind IS NOT DISTINCT FROM 'lgdict' FROM lg_values
WHERE tenant = %(tenant)s AND thread_id = %(thread_id)s::text

-- name: lg_dictionary
SELECT digest, data FROM lg_values
WHERE tenant = %(tenant)s AND thread_id = %(thread_id)s::text AND digest = %(digest)s AND kind = 'lgdict'

-- name: lg_first_dictionary
SELECT digest, data FROM lg_values
WHERE tenant = %(tenant)s AND thread_id = %(thread_id)s::text AND kind = 'lgdict'
ORDER BY digest LIMIT 1

-- name: lg_delete_value
DELETE FROM lg_values WHERE tenant = %(tenant)s AND thread_id = %(thread_id)s::text AND digest = %(digest)s

-- name: lg_copy_checkpoints
INSERT INTO lg_checkpoints (tenant, thread_id, ns, checkpoint_id, parent_id, run_id,
                            checkpoint_kind, checkpoint, metadata_kind, metadata, writes, names, refs)
SELECT tenant, %(target)s::text, ns, checkpoint_id, parent_id, run_id, checkpoint_kind, checkpoint, metadata_kind, metadata,
       writes, names, refs
FROM lg_checkpoints WHERE tenant = %(tenant)s AND thread_id = %(source)s::text
ON CONFLICT (tenant, thread_id, ns, checkpoint_id) DO NOTHING

-- name: lg_copy_blobs
INSERT INTO lg_blobs (tenant, thread_id, ns, channel, version, kind, base, depth, refs)
SELECT tenant, %(target)s::text, ns, channel, version, kind, base, depth, refs
FROM lg_blobs WHERE tenant = %(tenant)s AND thread_id = %(source)s::text
ON CONFLICT (tenant, thread_id, ns, channel, version) DO NOTHING

-- name: lg_copy_writes
INSERT INTO lg_writes (tenant, thread_id, ns, checkpoint_id, task_id, idx, channel, task_path, kind, refs)
SELECT tenant, %(target)s::text, ns, checkpoint_id, task_id, idx, channel, task_path, kind, refs
FROM lg_writes WHERE tenant = %(tenant)s AND thread_id = %(source)s::text
ON CONFLICT (tenant, thread_id, ns, checkpoint_id, task_id, idx) DO NOTHING

-- name: lg_copy_values
INSERT INTO lg_values (tenant, thread_id, digest, kind, data)
SELECT tenant, %(target)s::text, digest, kind, data
FROM lg_values WHERE tenant = %(tenant)s AND thread_id = %(source)s::text
ON CONFLICT (tenant, thread_id, digest) DO NOTHING

-- name: lg_hold
-- the thread's lock, its holder and the fence in one statement (migrations 0051, 0052): the
-- epoch held and the thread's collection count, or SQLSTATE LGT01 (ThreadTaken) or LGS01
-- (Stale) and nothing after it in the message runs
SELECT held, collections
FROM lg_hold(%(tenant)s, %(thread_id)s::text, %(owner)s::text, %(epoch)s::bigint, %(lease)s::bigint,
             %(collected)s::bigint)

-- name: lg_thread_count
-- the thread's collection count, read by a saver's first write before it reads anything else
-- of the thread (CairnSaver._expecting); no row: checkpointsql.NO_ROW
SELECT collected FROM lg_threads WHERE tenant = %(tenant)s AND thread_id = %(thread_id)s::text

-- name: lg_count_collection
-- a prune or delete_for_runs collected the thread's rows (checkpointsql._lg_collect, migration
-- 0052); a thread nobody holds (a copy_thread target never written) gets a row owned by
-- nobody (checkpointsql.NOBODY, seventh session), so the collection counts there too
INSERT INTO lg_threads (tenant, thread_id, owner, epoch, collected)
VALUES (%(tenant)s, %(thread_id)s::text, '', 0, 1)
ON CONFLICT (tenant, thread_id) DO UPDATE SET collected = lg_threads.collected + 1

-- name: lg_delete_thread_holder
DELETE FROM lg_threads WHERE tenant = %(tenant)s AND thread_id = %(thread_id)s::text

-- == Encryption at rest: data keys (cairn.store.keysql, migration data_keys) ======================
-- name: select_data_keys
SELECT tenant, version, kek_id, wrapped, created_at, subject FROM data_keys
WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
ORDER BY tenant, version

-- name: insert_data_key
INSERT INTO data_keys (tenant, version, kek_id, wrapped, created_at)
VALUES (%(tenant)s::text, %(version)s::bigint, %(kek_id)s::text, %(wrapped)s::bytea, %(created_at)s::float8)
ON CONFLICT (tenant, version) DO NOTHING

-- name: rewrap_data_key
UPDATE data_keys SET kek_id = %(kek_id)s::text, wrapped = %(wrapped)s::bytea
WHERE tenant = %(tenant)s::text AND version = %(version)s::bigint AND kek_id = %(old_kek_id)s::text

-- Re-encryption after a rotation (cairn.store.rekey): pages of a tenant's
-- sealed columns by key, and compare-and-set writes of their new envelopes
-- (a row changed since it was read is left for the next pass: a holder's
-- write always wins). PostgreSQL keeps no spilled payloads (TOAST does).
-- name: rekey_runs_page
SELECT run_id, input, result, error FROM runs
WHERE tenant = %(tenant)s::text AND run_id > %(after)s::text ORDER BY run_id LIMIT %(limit)s::bigint

-- name: rekey_run_set
UPDATE runs SET input = %(input)s::bytea, result = %(result)s::bytea, error = %(error)s::text
WHERE run_id = %(run_id)s::text AND input IS NOT DISTINCT FROM %(old_input)s::bytea
  AND result IS NOT DISTINCT FROM %(old_result)s::bytea AND error IS NOT DISTINCT FROM %(old_error)s::text

-- name: rekey_history_page
SELECT run_id, seq, position, payload, NULL::bytea, detail FROM history
WHERE tenant = %(tenant)s::text
  AND (run_id > %(after_run)s::text OR (run_id = %(after_run)s::text AND seq > %(after_seq)s::bigint))
  AND (payload IS NOT NULL OR detail IS NOT NULL)
ORDER BY run_id, seq LIMIT %(limit)s::bigint

-- name: rekey_history_set
UPDATE history SET payload = %(payload)s::bytea, detail = %(detail)s::text
WHERE run_id = %(run_id)s::text AND seq = %(seq)s::bigint
  AND payload IS NOT DISTINCT FROM %(old_payload)s::bytea AND detail IS NOT DISTINCT FROM %(old_detail)s::text

-- name: rekey_mailbox_page
SELECT run_id, seq, key, payload FROM mailbox
WHERE tenant = %(tenant)s::text
  AND (run_id > %(after_run)s::text OR (run_id = %(after_run)s::text AND seq > %(after_seq)s::bigint))
  AND payload IS NOT NULL
ORDER BY run_id, seq LIMIT %(limit)s::bigint

-- name: rekey_mailbox_set
UPDATE mailbox SET payload = %(payload)s::bytea
WHERE run_id = %(run_id)s::text AND seq = %(seq)s::bigint AND payload = %(old_payload)s::bytea

-- name: rekey_items_page
SELECT namespace, key, value, index_text FROM memory_items
WHERE tenant = %(tenant)s::text
  AND (namespace > %(after_ns)s::text OR (namespace = %(after_ns)s::text AND key > %(after_key)s::text))
  AND (value IS NOT NULL OR index_text IS NOT NULL)
ORDER BY namespace, key LIMIT %(limit)s::bigint

-- name: rekey_item_set
UPDATE memory_items SET value = %(value)s::bytea, index_text = %(index_text)s::text
WHERE tenant = %(tenant)s::text AND namespace = %(namespace)s::text AND key = %(key)s::text
  AND value IS NOT DISTINCT FROM %(old_value)s::bytea
  AND index_text IS NOT DISTINCT FROM %(old_index_text)s::text

-- name: rekey_run_memory_page
SELECT run_id, key, value FROM memory_run
WHERE tenant = %(tenant)s::text
  AND (run_id > %(after_run)s::text OR (run_id = %(after_run)s::text AND key > %(after_key)s::text))
  AND value IS NOT NULL
ORDER BY run_id, key LIMIT %(limit)s::bigint

-- name: rekey_run_memory_set
UPDATE memory_run SET value = %(value)s::bytea
WHERE run_id = %(run_id)s::text AND key = %(key)s::text AND value = %(old_value)s::bytea

-- name: rekey_thread_page
SELECT thread_id, idx, value FROM memory_thread_messages
WHERE tenant = %(tenant)s::text
  AND (thread_id > %(after_thread)s::text
       OR (thread_id = %(after_thread)s::text AND idx > %(after_idx)s::bigint))
  AND value IS NOT NULL
ORDER BY thread_id, idx LIMIT %(limit)s::bigint

-- name: rekey_thread_set
UPDATE memory_thread_messages SET value = %(value)s::bytea
WHERE tenant = %(tenant)s::text AND thread_id = %(thread_id)s::text AND idx = %(idx)s::bigint
  AND value = %(old_value)s::bytea

-- name: rekey_cold_page
SELECT namespace, key, codec, size, value FROM memory_item_cold
WHERE tenant = %(tenant)s::text
  AND (namespace > %(after_ns)s::text OR (namespace = %(after_ns)s::text AND key > %(after_key)s::text))
ORDER BY namespace, key LIMIT %(limit)s::bigint

-- name: rekey_cold_set
UPDATE memory_item_cold SET codec = %(codec)s::text, size = %(size)s::bigint, value = %(value)s::bytea
WHERE tenant = %(tenant)s::text AND namespace = %(namespace)s::text AND key = %(key)s::text
  AND value = %(old_value)s::bytea

-- The artifacts a tenant's rows name, by ref (cairn keys status counts their key versions).
-- name: rekey_artifact_refs_page
SELECT ref FROM (
    SELECT input_ref AS ref FROM runs WHERE tenant = %(tenant)s::text AND input_ref IS NOT NULL
    UNION SELECT result_ref FROM runs WHERE tenant = %(tenant)s::text AND result_ref IS NOT NULL
    UNION SELECT payload_ref FROM history WHERE tenant = %(tenant)s::text AND payload_ref IS NOT NULL
    UNION SELECT payload_ref FROM mailbox WHERE tenant = %(tenant)s::text AND payload_ref IS NOT NULL
    UNION SELECT value_ref FROM memory_items WHERE tenant = %(tenant)s::text AND value_ref IS NOT NULL
    UNION SELECT value_ref FROM memory_run WHERE tenant = %(tenant)s::text AND value_ref IS NOT NULL
    UNION SELECT value_ref FROM memory_thread_messages WHERE tenant = %(tenant)s::text AND value_ref IS NOT NULL
) AS refs
WHERE ref > %(after)s::text ORDER BY ref LIMIT %(limit)s::bigint

-- name: rekey_approvals_page
SELECT run_id, request_id, comment FROM approvals
WHERE tenant = %(tenant)s::text
  AND (run_id > %(after_run)s::text OR (run_id = %(after_run)s::text AND request_id > %(after_request)s::text))
  AND comment IS NOT NULL
ORDER BY run_id, request_id LIMIT %(limit)s::bigint

-- name: rekey_approval_set
UPDATE approvals SET comment = %(comment)s::text
WHERE run_id = %(run_id)s::text AND request_id = %(request_id)s::text AND comment = %(old_comment)s::text

-- Every tenant with runs, memory or LangGraph checkpoints: what turning encryption on for an
-- existing database seals.
-- name: rekey_tenants_page
SELECT tenant FROM (SELECT tenant FROM runs UNION SELECT tenant FROM memory_items
                    UNION SELECT tenant FROM memory_threads UNION SELECT tenant FROM memory_run
                    UNION SELECT tenant FROM lg_values UNION SELECT tenant FROM lg_checkpoints) AS t
WHERE tenant > %(after)s::text ORDER BY tenant LIMIT %(limit)s::bigint

-- name: insert_subject_key
-- A subject's data key (a version above SUBJECT_KEY_BASE): nothing if the version is taken or the
-- subject has a live key already (data_keys_live_subject); the caller reads back which.
INSERT INTO data_keys (tenant, version, kek_id, wrapped, created_at, subject)
VALUES (%(tenant)s::text, %(version)s::bigint, %(kek_id)s::text, %(wrapped)s::bytea, %(created_at)s::float8, %(subject)s::text)
ON CONFLICT DO NOTHING

-- name: erase_subject_keys
-- Crypto-shredding: a subject's keys become tombstones (their versions never reused).
UPDATE data_keys SET kek_id = 'erased', wrapped = ''::bytea
WHERE tenant = %(tenant)s::text AND subject = %(subject)s::text AND kek_id <> 'erased'
RETURNING version

-- name: erase_tenant_subject_keys
-- Crypto-shredding: every subject key of a tenant becomes a tombstone.
UPDATE data_keys SET kek_id = 'erased', wrapped = ''::bytea
WHERE tenant = %(tenant)s::text AND subject IS NOT NULL AND kek_id <> 'erased'
RETURNING version

-- name: delete_data_key
DELETE FROM data_keys WHERE tenant = %(tenant)s::text AND version = %(version)s::bigint

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
SELECT tenant FROM runs WHERE run_id = %(run_id)s::text

-- name: ws_put_objects
-- storing an object again counts as storing it (stored_at: the collector's fence)
INSERT INTO workspace_objects (tenant, oid, data, stored_at)
SELECT %(tenant)s::text, o.oid, o.data, %(now)s
FROM unnest(%(oids)s::text[], %(datas)s::bytea[]) AS o (oid, data)
ON CONFLICT (tenant, oid) DO UPDATE SET stored_at = GREATEST(workspace_objects.stored_at, EXCLUDED.stored_at)

-- name: ws_objects
SELECT oid, data FROM workspace_objects
WHERE tenant = %(tenant)s::text AND oid = ANY (%(oids)s::text[])

-- Re-encryption of a tenant's workspace objects (cairn.store.rekey): at
-- addresses that survive it, so each is rewritten in place, compare-and-set.
-- name: rekey_ws_page
SELECT oid, data FROM workspace_objects WHERE tenant = %(tenant)s::text AND oid > %(after)s::text
ORDER BY oid LIMIT %(limit)s::bigint

-- name: rekey_ws_set
UPDATE workspace_objects SET data = %(data)s::bytea
WHERE tenant = %(tenant)s::text AND oid = %(oid)s::text AND data = %(old_data)s::bytea

-- LangGraph checkpoints (cairn.langgraph.CairnSaver): a tenant's values and checkpoints by key
-- (first: from the start, where a thread id or namespace may be empty), each rewritten in
-- place, compare-and-set. Their rows and digests stay: the places name them.
-- name: rekey_lg_values_page
SELECT thread_id, digest, data FROM lg_values
WHERE tenant = %(tenant)s::text
  AND (%(first)s::boolean OR thread_id > %(after_thread)s::text
       OR (thread_id = %(after_thread)s::text AND digest > %(after_digest)s::bigint))
ORDER BY thread_id, digest LIMIT %(limit)s::bigint

-- name: rekey_lg_value_set
UPDATE lg_values SET data = %(data)s::bytea
WHERE tenant = %(tenant)s::text AND thread_id = %(thread_id)s::text AND digest = %(digest)s::bigint
  AND data = %(old_data)s::bytea

-- name: rekey_lg_checkpoints_page
SELECT thread_id, ns, lg_id_text(checkpoint_id), checkpoint, metadata FROM lg_checkpoints
WHERE tenant = %(tenant)s::text
  AND (%(first)s::boolean OR thread_id > %(after_thread)s::text
       OR (thread_id = %(after_thread)s::text AND ns > %(after_ns)s::text)
       OR (thread_id = %(after_thread)s::text AND ns = %(after_ns)s::text
           AND checkpoint_id > lg_id_key(%(after_id)s::text)))
ORDER BY thread_id, ns, checkpoint_id LIMIT %(limit)s::bigint

-- name: rekey_lg_checkpoint_set
UPDATE lg_checkpoints SET checkpoint = %(checkpoint)s::bytea, metadata = %(metadata)s::bytea
WHERE tenant = %(tenant)s::text AND thread_id = %(thread_id)s::text AND ns = %(ns)s::text
  AND checkpoint_id = lg_id_key(%(checkpoint_id)s::text)
  AND checkpoint = %(old_checkpoint)s::bytea AND metadata = %(old_metadata)s::bytea

-- The audit chain (issue 26; cairn/store/auditlinks.py). Entries written
-- without their link in the transaction in progress (the partial index holds
-- nothing else), each with the stored link before it.
-- name: audit_unlinked
SELECT h.run_id, h.seq, h.event, h.at, h.epoch, h.worker, h.position, h.step_kind, h.name, h.input_hash,
       h.attempt, h.started_at, h.payload, h.payload_ref, h.detail, h.digest,
       (SELECT b.link FROM history AS b WHERE b.run_id = h.run_id AND b.seq = h.seq - 1), h.tenant
FROM history AS h WHERE h.link = '\x'::bytea ORDER BY h.run_id, h.seq

-- name: audit_set_link
-- every entry the transaction left unlinked, in one statement (never
-- executemany: psycopg sends that as a pipeline, and a client frozen in the
-- middle of one leaves its session active, where idle_in_transaction_session_timeout
-- never fires, with its locks held)
UPDATE history AS h SET digest = u.digest, link = u.link
FROM unnest(%(run_ids)s::text[], %(seqs)s::bigint[], %(digests)s::bytea[], %(links)s::bytea[])
     AS u(run_id, seq, digest, link)
WHERE h.run_id = u.run_id AND h.seq = u.seq

-- A page of entries as the audit verifier reads them (after a key, in
-- (run_id, seq) order, compared as the database sorts; one tenant's or one run's).
-- name: audit_entries
SELECT h.run_id, h.seq, h.event, h.at, h.epoch, h.worker, h.position, h.step_kind, h.name, h.input_hash,
       h.attempt, h.started_at, h.payload, h.payload_ref, h.detail, h.digest, h.link, h.tenant
FROM history AS h
WHERE (h.run_id, h.seq) > (%(after_run)s::text, %(after_seq)s::bigint)
  AND (%(tenant)s::text IS NULL OR h.tenant = %(tenant)s::text)
  AND (%(run_id)s::text IS NULL OR h.run_id = %(run_id)s::text)
ORDER BY h.run_id, h.seq LIMIT %(page)s::bigint

-- The audit log's hot entries (``store.auditsql.audit_log_rows``): a
-- tenant's are its hot runs' merged, each run opened only once the merge
-- reaches where its entries start, no index on history by time (it would
-- cost every journaled step). A run's entries are in time order by seq
-- (history_monotonic_at) and none is before its run's created_at. Run ids
-- compare byte-wise (COLLATE "C"), as Python merges them.
-- The hot runs of a tenant with an entry at or after :at (the last one: a
-- primary key probe; an archived run has none), in created order, a page at
-- a time (runs_tenant_created).
-- name: audit_log_runs_oldest
SELECT r.run_id, r.created_at FROM runs AS r
WHERE r.tenant = %(tenant)s::text
  AND r.created_at >= %(after_created)s::float8
  AND (r.created_at > %(after_created)s::float8 OR r.run_id COLLATE "C" > %(after_run)s::text COLLATE "C")
  AND (SELECT h.at FROM history AS h WHERE h.run_id = r.run_id ORDER BY h.seq DESC LIMIT 1) >= %(at)s::float8
ORDER BY r.created_at, r.run_id COLLATE "C" LIMIT %(page)s::bigint

-- Newest first: the tenant's runs created by :at, each with its last
-- entry's time (NULL: archived, no hot entry), ordered by the caller.
-- name: audit_log_runs_newest
SELECT r.run_id, (SELECT h.at FROM history AS h WHERE h.run_id = r.run_id ORDER BY h.seq DESC LIMIT 1)
FROM runs AS r WHERE r.tenant = %(tenant)s::text AND r.created_at <= %(at)s::float8

-- One run's entries past a position, by seq (its time order) from :seq on,
-- a page at a time (the primary key; of a tenant, or any).
-- name: audit_log_run_oldest
SELECT h.run_id, h.seq, h.event, h.at, h.epoch, h.worker, h.detail, h.tenant
FROM history AS h
WHERE h.run_id = %(run_id)s::text AND h.seq > %(seq)s::bigint
  AND (%(tenant)s::text IS NULL OR h.tenant = %(tenant)s::text)
  AND (h.at, h.run_id COLLATE "C", h.seq) > (%(at)s::float8, %(after_run)s::text COLLATE "C", %(after_seq)s::bigint)
ORDER BY h.seq LIMIT %(page)s::bigint

-- name: audit_log_run_newest
SELECT h.run_id, h.seq, h.event, h.at, h.epoch, h.worker, h.detail, h.tenant
FROM history AS h
WHERE h.run_id = %(run_id)s::text AND h.seq < %(seq)s::bigint
  AND (%(tenant)s::text IS NULL OR h.tenant = %(tenant)s::text) AND h.at >= %(since)s::float8
  AND (h.at, h.run_id COLLATE "C", h.seq) < (%(at)s::float8, %(after_run)s::text COLLATE "C", %(after_seq)s::bigint)
ORDER BY h.seq DESC LIMIT %(page)s::bigint

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
UPDATE history SET digest = %(digest)s::bytea
WHERE run_id = %(run_id)s::text AND seq = %(seq)s::bigint AND digest IS NULL

-- name: audit_run_tenants
SELECT run_id, tenant FROM runs
WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text) AND (%(run_id)s::text IS NULL OR run_id = %(run_id)s::text)

-- name: insert_audit_checkpoint
INSERT INTO audit_checkpoints (tenant, id, at, record)
SELECT %(tenant)s::text, COALESCE(MAX(id), 0) + 1, %(at)s::float8, %(record)s::text
FROM audit_checkpoints WHERE tenant = %(tenant)s::text
RETURNING id

-- name: audit_checkpoints
SELECT tenant, id, at, record FROM audit_checkpoints
WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text) ORDER BY tenant, id

-- name: audit_legacy
SELECT run_id, last_seq FROM audit_legacy
-- name: ws_tenants
SELECT DISTINCT tenant FROM workspace_objects ORDER BY tenant

-- name: ws_roots
SELECT DISTINCT h.detail::jsonb ->> 'workspace'
FROM history AS h JOIN runs AS r ON r.run_id = h.run_id
WHERE r.tenant = %(tenant)s::text AND h.detail IS NOT NULL
  AND jsonb_typeof(h.detail::jsonb -> 'workspace') = 'string'

-- name: ws_sealed_detail
SELECT h.run_id FROM history AS h JOIN runs AS r ON r.run_id = h.run_id
WHERE r.tenant = %(tenant)s::text AND h.detail IS NOT NULL AND h.detail::jsonb ? 'sealed'
LIMIT 1

-- name: ws_sealed_entries
SELECT h.run_id, h.seq FROM history AS h JOIN runs AS r ON r.run_id = h.run_id
WHERE r.tenant = %(tenant)s::text AND h.detail IS NOT NULL AND h.detail::jsonb ? 'sealed'
ORDER BY h.run_id, h.seq

-- name: ws_candidates
SELECT oid FROM workspace_objects
WHERE tenant = %(tenant)s::text AND oid > %(after)s::text AND stored_at < %(before)s::float8
ORDER BY oid LIMIT %(limit)s::int

-- name: ws_delete
DELETE FROM workspace_objects
WHERE tenant = %(tenant)s::text AND oid = ANY (%(oids)s::text[]) AND stored_at < %(before)s::float8

-- Erasure (cairn.api.erasure) -------------------------------------------------------------------

-- name: erasure_runs
-- The runs an erasure covers: a tenant's runs of one subject, of one thread, or all of them.
SELECT run_id, status, parent_run_id FROM runs
WHERE tenant = %(tenant)s::text AND (%(subject)s::text IS NULL OR subject = %(subject)s::text) AND (%(thread_id)s::text IS NULL OR thread_id = %(thread_id)s::text)

-- name: delete_memory_items_of_subject
DELETE FROM memory_items WHERE tenant = %(tenant)s::text AND subject = %(subject)s::text
RETURNING tenant, namespace, key

-- name: delete_memory_messages_of_subject
DELETE FROM memory_thread_messages WHERE tenant = %(tenant)s::text AND subject = %(subject)s::text
RETURNING 1

-- name: insert_erasure
INSERT INTO erasures (id, tenant, scope, digest, actor, started_at)
VALUES (%(id)s::text, %(tenant)s::text, %(scope)s::text, %(digest)s::text, %(actor)s::text, %(now)s::float8)

-- name: finish_erasure
UPDATE erasures SET finished_at = %(now)s::float8, counts = %(counts)s::text, actor = %(actor)s::text
WHERE id = %(id)s::text

-- name: select_erasures
-- The erasure records, newest first (of a tenant; an unfinished one of one target).
SELECT id, tenant, scope, digest, actor, started_at, finished_at, counts, runs FROM erasures
WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
  AND (%(scope)s::text IS NULL OR (scope = %(scope)s::text AND digest = %(digest)s::text AND finished_at IS NULL))
ORDER BY started_at DESC, id
LIMIT %(limit)s::bigint

-- name: count_subject_memory
-- What delete_memory_items_of_subject and delete_memory_messages_of_subject would delete (a dry run).
SELECT (SELECT count(*) FROM memory_items WHERE tenant = %(tenant)s::text AND subject = %(subject)s::text)
     + (SELECT count(*) FROM memory_thread_messages WHERE tenant = %(tenant)s::text AND subject = %(subject)s::text)

-- name: note_erasure_runs
UPDATE erasures SET runs = %(runs)s::text WHERE id = %(id)s::text

-- name: select_erasure_runs
-- The runs each erasure deleted (keyed digests, JSON), of a tenant.
SELECT tenant, runs FROM erasures WHERE runs IS NOT NULL AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)

-- Archived runs (issue 26 item 5; cairn/store/archivesql.py): a closed run's
-- rows read whole for its archive, put back whole by a restore, deleted
-- from the hot tables once the archive is recorded.
-- name: archive_mailbox
SELECT run_id, seq, tenant, key, payload, payload_ref, sender, dedupe, sent_at, taken_at, taken_position FROM mailbox WHERE run_id = %(run_id)s ORDER BY seq

-- name: restore_mailbox
INSERT INTO mailbox (run_id, seq, tenant, key, payload, payload_ref, sender, dedupe, sent_at, taken_at, taken_position)
VALUES (%(run_id)s, %(seq)s, %(tenant)s, %(key)s, %(payload)s, %(payload_ref)s, %(sender)s, %(dedupe)s, %(sent_at)s, %(taken_at)s, %(taken_position)s)

-- name: delete_archived_mailbox
DELETE FROM mailbox WHERE run_id = %(run_id)s

-- name: archive_approvals
SELECT run_id, request_id, tenant, position, request_seq, action, type_name, schema, approvers, requested_at, expires_at, status, decided_by, decided_at, comment, decision_seq FROM approvals WHERE run_id = %(run_id)s ORDER BY request_id COLLATE "C"

-- name: restore_approvals
INSERT INTO approvals (run_id, request_id, tenant, position, request_seq, action, type_name, schema, approvers, requested_at, expires_at, status, decided_by, decided_at, comment, decision_seq)
VALUES (%(run_id)s, %(request_id)s, %(tenant)s, %(position)s, %(request_seq)s, %(action)s, %(type_name)s, %(schema)s, %(approvers)s, %(requested_at)s, %(expires_at)s, %(status)s, %(decided_by)s, %(decided_at)s, %(comment)s, %(decision_seq)s)

-- name: delete_archived_approvals
DELETE FROM approvals WHERE run_id = %(run_id)s

-- name: archive_memory_run
SELECT run_id, key, tenant, value, value_ref, version, created_at, updated_at, position, operation_id, actor FROM memory_run WHERE run_id = %(run_id)s ORDER BY key COLLATE "C"

-- name: restore_memory_run
INSERT INTO memory_run (run_id, key, tenant, value, value_ref, version, created_at, updated_at, position, operation_id, actor)
VALUES (%(run_id)s, %(key)s, %(tenant)s, %(value)s, %(value_ref)s, %(version)s, %(created_at)s, %(updated_at)s, %(position)s, %(operation_id)s, %(actor)s)

-- name: delete_archived_memory_run
DELETE FROM memory_run WHERE run_id = %(run_id)s

-- name: restore_history
INSERT INTO history (run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash, attempt, started_at, payload, payload_ref, detail, digest, link, tenant)
VALUES (%(run_id)s, %(seq)s, %(event)s, %(at)s, %(epoch)s, %(worker)s, %(position)s, %(step_kind)s, %(name)s, %(input_hash)s, %(attempt)s, %(started_at)s, %(payload)s, %(payload_ref)s, %(detail)s, %(digest)s, %(link)s, %(tenant)s)

-- name: delete_archived_history
DELETE FROM history WHERE run_id = %(run_id)s

-- name: insert_run_archive
INSERT INTO run_archives (run_id, tenant, ref, entries, last_seq, last_link, hot_bytes, stored_bytes, archived_at, actor,
                          first_at, last_at)
VALUES (%(run_id)s, %(tenant)s, %(ref)s, %(entries)s, %(last_seq)s, %(last_link)s, %(hot_bytes)s, %(stored_bytes)s, %(archived_at)s, %(actor)s,
        %(first_at)s::float8, %(last_at)s::float8)

-- name: run_archive
SELECT run_id, tenant, ref, entries, last_seq, last_link, hot_bytes, stored_bytes, archived_at, actor FROM run_archives WHERE run_id = %(run_id)s

-- name: delete_run_archive
DELETE FROM run_archives WHERE run_id = %(run_id)s

-- name: insert_run_archive_ref
INSERT INTO run_archive_refs (run_id, tenant, ref) VALUES (%(run_id)s, %(tenant)s, %(ref)s)

-- name: delete_run_archive_refs
DELETE FROM run_archive_refs WHERE run_id = %(run_id)s

-- The archive records of the archived runs (of a tenant), by run: a
-- cross-run listing's one read of where each archived run's rows are.
-- name: archived_records
SELECT run_id, tenant, ref, entries, last_seq, last_link, hot_bytes, stored_bytes, archived_at, actor FROM run_archives
WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text) ORDER BY run_id COLLATE "C"

-- The audit log's archived runs of a tenant whose entries reach past a
-- position (an archive's first and last entry time, 0047), a page at a time
-- in the order their first entry comes (oldest first) or their last (newest
-- first), so a page opens only the archives it reaches; both read in the
-- order of run_archives_first_at / _last_at. Archives without a range (made
-- before 0047): audit_log_archives_unranged, opened by every page.
-- name: audit_log_archives_oldest
SELECT run_id, tenant, ref, entries, last_seq, last_link, hot_bytes, stored_bytes, archived_at, actor,
       first_at, last_at
FROM run_archives
WHERE tenant = %(tenant)s::text AND last_at >= %(at)s::float8
  AND (first_at, last_at, run_id COLLATE "C") > (%(after_first)s::float8, %(after_last)s::float8, %(after_run)s::text COLLATE "C")
ORDER BY first_at, last_at, run_id COLLATE "C" LIMIT %(page)s::bigint

-- name: audit_log_archives_newest
SELECT run_id, tenant, ref, entries, last_seq, last_link, hot_bytes, stored_bytes, archived_at, actor,
       first_at, last_at
FROM run_archives
WHERE tenant = %(tenant)s::text AND first_at <= %(at)s::float8 AND last_at >= %(since)s::float8
  AND (last_at, first_at, run_id COLLATE "C") < (%(after_last)s::float8, %(after_first)s::float8, %(after_run)s::text COLLATE "C")
ORDER BY last_at DESC, first_at DESC, run_id COLLATE "C" DESC LIMIT %(page)s::bigint

-- One archived run's range (the log of one run).
-- name: audit_log_archive_range
SELECT first_at, last_at FROM run_archives WHERE run_id = %(run_id)s

-- name: audit_log_archives_unranged
SELECT run_id, tenant, ref, entries, last_seq, last_link, hot_bytes, stored_bytes, archived_at, actor,
       first_at, last_at
FROM run_archives
WHERE tenant = %(tenant)s::text AND first_at IS NULL ORDER BY run_id COLLATE "C"

-- name: audit_log_archive_tenants
WITH RECURSIVE t(tenant) AS (
    SELECT MIN(tenant) FROM run_archives
    UNION ALL
    SELECT (SELECT MIN(a.tenant) FROM run_archives AS a WHERE a.tenant > t.tenant) FROM t WHERE t.tenant IS NOT NULL
)
SELECT tenant FROM t WHERE tenant IS NOT NULL

-- name: archived_runs
SELECT run_id FROM run_archives WHERE (%(tenant)s ::text IS NULL OR tenant = %(tenant)s) ORDER BY run_id COLLATE "C"

-- The closed runs last changed before the cutoff and not archived yet,
-- oldest first (the pruning index: its predicate word for word).
-- name: archivable_runs
SELECT r.run_id FROM runs AS r
WHERE r.updated_at < %(cutoff)s::float8
  AND r.status IN ('completed', 'failed', 'cancelled', 'quarantined', 'killed', 'halted')
  AND NOT EXISTS (SELECT 1 FROM run_archives AS a WHERE a.run_id = r.run_id)
  AND (%(tenant)s::text IS NULL OR r.tenant = %(tenant)s)
ORDER BY r.updated_at, r.run_id COLLATE "C" LIMIT %(limit)s

-- == Retention (issue 26 part 3; cairn.store.retentionsql) ====================================

-- name: retention_policies
SELECT tenant, workflow, data_class, keep, updated_at, updated_by FROM retention_policies
WHERE %(tenant)s::text IS NULL OR tenant = %(tenant)s::text OR tenant = '*'
ORDER BY tenant COLLATE "C", workflow COLLATE "C", data_class COLLATE "C"

-- A policy change and the check of the whole set after it, one at a time
-- (two concurrent changes, each fine alone, could otherwise pass together).
-- name: lock_retention_policies
SELECT pg_advisory_xact_lock(hashtext('cairn.retention_policies'))

-- name: upsert_retention_policy
INSERT INTO retention_policies (tenant, workflow, data_class, keep, updated_at, updated_by)
VALUES (%(tenant)s::text, %(workflow)s::text, %(data_class)s::text, %(keep)s::float8, %(now)s::float8,
        %(actor)s::text)
ON CONFLICT (tenant, workflow, data_class) DO UPDATE
SET keep = excluded.keep, updated_at = excluded.updated_at, updated_by = excluded.updated_by

-- name: delete_retention_policy
DELETE FROM retention_policies
WHERE tenant = %(tenant)s::text AND workflow = %(workflow)s::text AND data_class = %(data_class)s::text
RETURNING tenant

-- Take the controller's lease: renew it (same holder and epoch, the epoch
-- kept), or take it over once it expired (the epoch bumped, so the old
-- holder's fence fails). No row returned: someone else holds it.
-- name: take_retention_lease
INSERT INTO retention_lease (name, holder, epoch, expires_at)
VALUES ('controller', %(holder)s::text, 1, %(until)s::float8)
ON CONFLICT (name) DO UPDATE SET
    epoch = CASE WHEN retention_lease.holder = %(holder)s::text AND retention_lease.epoch = %(epoch)s::bigint
                 THEN retention_lease.epoch ELSE retention_lease.epoch + 1 END,
    holder = excluded.holder, expires_at = excluded.expires_at
WHERE (retention_lease.holder = %(holder)s::text AND retention_lease.epoch = %(epoch)s::bigint)
   OR retention_lease.expires_at <= %(now)s::float8
RETURNING epoch

-- The fence of every deletion: the caller still holds the lease at its
-- epoch. FOR SHARE: a takeover waits until this transaction ends.
-- name: check_retention_fence
SELECT 1 FROM retention_lease
WHERE name = 'controller' AND holder = %(holder)s::text AND epoch = %(epoch)s::bigint
  AND expires_at > %(now)s::float8
FOR SHARE

-- Before a run is deleted: its record (audit), with its last entry's link.
-- name: record_deleted_runs
INSERT INTO retention_deleted (run_id, tenant, workflow, finished_at, last_seq, head, deleted_at, deleted_by)
SELECT r.run_id, r.tenant, r.workflow, r.updated_at,
       COALESCE((SELECT max(h.seq) FROM history AS h WHERE h.run_id = r.run_id), 0),
       (SELECT h.link FROM history AS h WHERE h.run_id = r.run_id ORDER BY h.seq DESC LIMIT 1),
       %(now)s::float8, %(actor)s::text
FROM runs AS r WHERE r.run_id = ANY(%(run_ids)s::text[])
ON CONFLICT (run_id) DO UPDATE SET
    tenant = excluded.tenant, workflow = excluded.workflow, finished_at = excluded.finished_at,
    last_seq = excluded.last_seq, head = excluded.head, deleted_at = excluded.deleted_at,
    deleted_by = excluded.deleted_by

-- name: deleted_runs
SELECT run_id, tenant, workflow, finished_at, last_seq, head, deleted_at, deleted_by FROM retention_deleted
WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text) ORDER BY finished_at, run_id

-- Audit records finished before the latest cutoff, a page at a time.
-- Archived roots (run_archives) whose archive is older than the latest cutoff
-- of class archives: deleted, with their trees, through prune_runs.
-- name: archive_candidates
SELECT a.run_id, r.tenant, r.workflow, a.archived_at FROM run_archives AS a JOIN runs AS r ON r.run_id = a.run_id
WHERE a.archived_at < %(cutoff)s::float8 AND (a.archived_at, a.run_id) > (%(after_at)s::float8, %(after_id)s::text)
  AND NOT EXISTS (SELECT 1 FROM runs AS p WHERE p.run_id = r.parent_run_id)
ORDER BY a.archived_at, a.run_id COLLATE "C" LIMIT %(page)s::bigint

-- name: deleted_run_candidates
SELECT run_id, tenant, workflow, finished_at FROM retention_deleted
WHERE finished_at < %(cutoff)s::float8 AND (finished_at, run_id) > (%(after_at)s::float8, %(after_id)s::text)
ORDER BY finished_at, run_id LIMIT %(page)s::bigint

-- name: forget_deleted_run
DELETE FROM retention_deleted WHERE run_id = %(run_id)s::text AND finished_at = %(finished_at)s::float8
RETURNING run_id

-- Entries of finished runs whose body a class expires, older than the latest
-- cutoff and not expired yet, a page at a time in (run_id, seq) order.
-- name: body_candidates
SELECT h.run_id, h.seq, r.tenant, r.workflow, h.at FROM history AS h JOIN runs AS r ON r.run_id = h.run_id
WHERE r.status IN ('completed', 'failed', 'cancelled', 'quarantined', 'killed', 'halted')
  AND h.at < %(cutoff)s::float8
  AND (h.run_id, h.seq) > (%(after_run)s::text, %(after_seq)s::bigint)
  AND ((%(cls)s::text = 'model-bodies' AND h.event = 'step.completed' AND h.step_kind = 'model'
        AND (h.payload IS NOT NULL OR h.payload_ref IS NOT NULL))
       OR (%(cls)s::text = 'artifacts' AND h.payload_ref IS NOT NULL))
  AND (h.payload IS NULL OR substring(h.payload FROM 1 FOR 2) <> '\x0003'::bytea)
ORDER BY h.run_id, h.seq LIMIT %(page)s::bigint

-- PostgreSQL keeps every payload in its row (TOAST): nothing spilled to drop.
-- name: drop_spilled_body
SELECT 1 WHERE %(run_id)s::text IS NULL AND %(seq)s::bigint IS NULL

-- name: queue_body_artifact
INSERT INTO artifact_gc (ref, queued_at)
SELECT payload_ref, %(now)s::float8 FROM history
WHERE run_id = %(run_id)s::text AND seq = %(seq)s::bigint AND payload_ref IS NOT NULL
ON CONFLICT (ref) DO NOTHING

-- name: expire_body
UPDATE history SET payload = %(marker)s::bytea
WHERE run_id = %(run_id)s::text AND seq = %(seq)s::bigint
  AND (payload IS NULL OR substring(payload FROM 1 FOR 2) <> '\x0003'::bytea)
  AND EXISTS (SELECT 1 FROM runs AS r WHERE r.run_id = history.run_id
              AND r.status IN ('completed', 'failed', 'cancelled', 'quarantined', 'killed', 'halted'))
RETURNING run_id

-- Thread messages older than the latest cutoff, a page at a time.
-- name: message_candidates
SELECT tenant, thread_id, idx, created_at FROM memory_thread_messages
WHERE created_at < %(cutoff)s::float8
  AND (tenant, thread_id, idx) > (%(after_tenant)s::text, %(after_thread)s::text, %(after_idx)s::bigint)
ORDER BY tenant, thread_id, idx LIMIT %(page)s::bigint

-- name: forget_message
DELETE FROM memory_thread_messages
WHERE tenant = %(tenant)s::text AND thread_id = %(thread_id)s::text AND idx = %(idx)s::bigint
  AND created_at < %(cutoff)s::float8
RETURNING idx

-- A thread left without messages, last written before the cutoff.
-- name: forget_empty_thread
DELETE FROM memory_threads
WHERE tenant = %(tenant)s::text AND thread_id = %(thread_id)s::text AND updated_at < %(cutoff)s::float8
  AND NOT EXISTS (SELECT 1 FROM memory_thread_messages AS m
                  WHERE m.tenant = memory_threads.tenant AND m.thread_id = memory_threads.thread_id)

-- Long-term items last written before the latest cutoff, of one class
-- (semantic: with index text), a page at a time.
-- name: item_candidates
SELECT tenant, namespace, key, updated_at FROM memory_items
WHERE updated_at < %(cutoff)s::float8
  AND ((%(semantic)s::boolean AND index_text IS NOT NULL) OR (NOT %(semantic)s::boolean AND index_text IS NULL))
  AND (tenant, namespace, key) > (%(after_tenant)s::text, %(after_namespace)s::text, %(after_key)s::text)
ORDER BY tenant, namespace, key LIMIT %(page)s::bigint

-- name: item_unchanged
SELECT 1 FROM memory_items WHERE tenant = %(tenant)s::text AND namespace = %(namespace)s::text
  AND key = %(key)s::text AND updated_at = %(updated_at)s::float8
-- name: oplog_lock
-- Two transactions appending to one tenant's chain queue here (the head is
-- then read after the other's commit), so neither links from a stale head.
SELECT pg_advisory_xact_lock(hashtextextended('cairn.operator_log/' || %(tenant)s::text, 0))

-- name: oplog_head
SELECT seq, link FROM operator_log WHERE tenant = %(tenant)s::text ORDER BY seq DESC LIMIT 1

-- name: insert_oplog
INSERT INTO operator_log (tenant, seq, at, kind, object_id, action, actor, auth, change, digest, link)
VALUES (%(tenant)s::text, %(seq)s::bigint, %(at)s::float8, %(kind)s::text, %(object_id)s::text,
        %(action)s::text, %(actor)s::text, %(auth)s::text, %(change)s::text, %(digest)s::bytea,
        %(link)s::bytea)

-- name: oplog_entries
SELECT tenant, seq, at, kind, object_id, action, actor, auth, change, digest, link FROM operator_log
WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
  AND (tenant, seq) > (%(after_tenant)s::text, %(after_seq)s::bigint)
ORDER BY tenant, seq LIMIT %(page)s::int

-- The audit log's operator records of a tenant, a page past a position in
-- (at, seq) order (its chain id is the tenant's: api.auditlog turns a cursor
-- into this pair), of a kind of object if given; operator_log_at (0047).
-- name: oplog_log_oldest
SELECT tenant, seq, at, kind, object_id, action, actor, auth, change, digest, link FROM operator_log
WHERE tenant = %(tenant)s::text
  AND (at, seq) > (%(at)s::float8, %(after_seq)s::bigint) AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
ORDER BY at, seq LIMIT %(page)s::bigint

-- name: oplog_log_newest
SELECT tenant, seq, at, kind, object_id, action, actor, auth, change, digest, link FROM operator_log
WHERE tenant = %(tenant)s::text AND at >= %(since)s::float8
  AND (at, seq) < (%(at)s::float8, %(after_seq)s::bigint) AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
ORDER BY at DESC, seq DESC LIMIT %(page)s::bigint

-- name: oplog_tenants
WITH RECURSIVE t(tenant) AS (
    SELECT MIN(tenant) FROM operator_log
    UNION ALL
    SELECT (SELECT MIN(o.tenant) FROM operator_log AS o WHERE o.tenant > t.tenant) FROM t WHERE t.tenant IS NOT NULL
)
SELECT tenant FROM t WHERE tenant IS NOT NULL
