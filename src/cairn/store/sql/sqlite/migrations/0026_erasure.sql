-- Erasure by subject, thread or tenant (issue 26, cairn.api.erasure).
-- A run's subject (the person or party its data is about) is recorded at its
-- start and never changes; a child has its parent's. Memory written by a run
-- takes the run's subject unless the write names one. A subject's values are
-- sealed with a data key of its own (data_keys.subject: a keyed digest of the
-- subject, never the subject itself); erasing the subject destroys that key
-- (the row kept as a tombstone, kek_id 'erased', so its version is never
-- reused) and deletes its rows. `erasures` records each erasure without
-- personal data: a keyed digest of what was erased, counts, times, actor.
ALTER TABLE runs ADD COLUMN subject TEXT;
CREATE INDEX runs_subject ON runs (tenant, subject) WHERE subject IS NOT NULL;

CREATE TRIGGER runs_subject_fixed
BEFORE UPDATE OF subject ON runs
WHEN NEW.subject IS NOT OLD.subject
BEGIN
    SELECT RAISE(ABORT, 'the subject of a run never changes');
END;

ALTER TABLE memory_items ADD COLUMN subject TEXT;
CREATE INDEX memory_items_subject ON memory_items (tenant, subject) WHERE subject IS NOT NULL;
ALTER TABLE memory_thread_messages ADD COLUMN subject TEXT;
CREATE INDEX memory_thread_messages_subject ON memory_thread_messages (tenant, subject)
    WHERE subject IS NOT NULL;

ALTER TABLE data_keys ADD COLUMN subject TEXT;
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
