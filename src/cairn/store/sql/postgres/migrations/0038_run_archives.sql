-- Archived runs (issue 26 item 5, cairn.store.archive): a closed run's rows
-- (history, mailbox, approvals, run memory) moved out of the hot tables into
-- one compressed (and, with encryption on, sealed) archive object in the
-- artifact store. The run row stays, so listings and `cairn show` find it;
-- ref is the archive object, last_seq/last_link the run's audit head (the
-- verifier reads the entries themselves from the archive).
-- run_archive_refs: the artifacts an archived run's rows reference, kept
-- from collection while it is archived.
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
    actor        TEXT
);
CREATE INDEX run_archives_ref ON run_archives (ref);

CREATE TABLE run_archive_refs (
    run_id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    ref    TEXT NOT NULL,
    PRIMARY KEY (run_id, ref)
);
CREATE INDEX run_archive_refs_ref ON run_archive_refs (ref);

ALTER TABLE run_archives ENABLE ROW LEVEL SECURITY;
ALTER TABLE run_archive_refs ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON run_archives
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))))
    WITH CHECK (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant)))
                AND EXISTS (SELECT 1 FROM runs AS r WHERE r.run_id = run_archives.run_id
                                                      AND r.tenant = run_archives.tenant));
CREATE POLICY tenant_isolation ON run_archive_refs
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))))
    WITH CHECK (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant)))
                AND EXISTS (SELECT 1 FROM runs AS r WHERE r.run_id = run_archive_refs.run_id
                                                      AND r.tenant = run_archive_refs.tenant));

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

-- An archive and the artifacts it references are readable through its row.
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

-- A tenant's role reads its tenants' archives (archiving deletes history
-- rows, which only the owner may: the store archives as the owner).
INSERT INTO tenant_privileges (object_name, object_kind, privileges) VALUES
    ('run_archives', 'TABLE', 'SELECT'),
    ('run_archive_refs', 'TABLE', 'SELECT');
SELECT grant_privileges('run_archives');
SELECT grant_privileges('run_archive_refs');
