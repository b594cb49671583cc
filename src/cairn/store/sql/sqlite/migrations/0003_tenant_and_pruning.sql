-- Every history row carries its run's tenant. The store fills it in from the
-- run row inside the very INSERT that writes the entry (callers never pass
-- it), so an entry cannot claim a tenant its run does not have. The table is
-- rebuilt rather than altered so the column can be NOT NULL without a
-- default: a write path that forgot it would fail, not store a blank tenant.
--
-- Artifacts keep no tenant: they are content-addressed files shared by every
-- tenant (identical bytes are stored once).

CREATE TABLE history_new (
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
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

-- Backfill from the runs. Runs are never deleted before this migration, so
-- every entry has its run; '' would mark one that somehow had none.
INSERT INTO history_new (run_id, seq, tenant, event, at, epoch, worker, position, step_kind, name,
                         input_hash, attempt, started_at, payload, payload_ref, detail)
SELECT h.run_id, h.seq, COALESCE((SELECT r.tenant FROM runs AS r WHERE r.run_id = h.run_id), ''),
       h.event, h.at, h.epoch, h.worker, h.position, h.step_kind, h.name, h.input_hash, h.attempt,
       h.started_at, h.payload, h.payload_ref, h.detail
FROM history AS h;

DROP TABLE history;
ALTER TABLE history_new RENAME TO history;

-- Pruning (SQLiteStore.prune_runs). Finished runs by age: a partial index, so
-- it is written once per run (when it ends), never by claims, renewals or
-- steps. The predicate lists the terminal statuses; queries repeat it word for
-- word so SQLite can use the index.
CREATE INDEX runs_finished ON runs (updated_at)
    WHERE status IN ('completed', 'failed', 'cancelled', 'quarantined', 'killed', 'halted');

-- "Does any row still reference this artifact?" Only rows with a reference
-- (payloads above the inline limit) are in these indexes.
CREATE INDEX runs_input_ref ON runs (input_ref) WHERE input_ref IS NOT NULL;
CREATE INDEX runs_result_ref ON runs (result_ref) WHERE result_ref IS NOT NULL;
CREATE INDEX history_payload_ref ON history (payload_ref) WHERE payload_ref IS NOT NULL;

-- Artifacts referenced by pruned runs, waiting to be collected: a file is
-- deleted once nothing references it and it was not stored again recently
-- (see prune_runs). Kept in the database so a crash loses no candidate.
CREATE TABLE artifact_gc (
    ref       TEXT PRIMARY KEY,
    queued_at REAL NOT NULL
) WITHOUT ROWID;
