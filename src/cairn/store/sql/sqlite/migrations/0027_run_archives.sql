-- Archived runs (issue 26 item 5, cairn.store.archive): a closed run's rows
-- (history, mailbox, approvals, run memory) moved out of the hot tables into
-- one compressed (and, with encryption on, sealed) archive object in the
-- artifact store. The run row stays, so listings and `cairn show` find it;
-- ref is the archive object, last_seq/last_link the run's audit head (the
-- verifier reads the entries themselves from the archive).
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
    actor        TEXT
) WITHOUT ROWID;
CREATE INDEX run_archives_ref ON run_archives (ref);

-- The artifacts an archived run's rows reference (payload refs), so the
-- artifact collector keeps them while the run is archived.
CREATE TABLE run_archive_refs (
    run_id TEXT NOT NULL,
    ref    TEXT NOT NULL,
    PRIMARY KEY (run_id, ref)
) WITHOUT ROWID;
CREATE INDEX run_archive_refs_ref ON run_archive_refs (ref);

-- An archived run cannot be mutated, whoever writes: its run row does not
-- change (restore it first); every store write of its other rows is fenced
-- on a running run or changes the run row (per-row insert triggers cost
-- 15-20 us a journaled step). Deleting it (pruning)
-- deletes its archive rows; prune_runs queues the archive object first.
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
