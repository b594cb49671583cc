-- The audit chain (issue 26, cairn/store/auditlinks.py): one SHA-256 link
-- per history entry, link(n) = SHA-256(link(n-1) || the entry's stored row),
-- written by a trigger in the statement that writes the entry, whatever the
-- statement. A separate table, so an erased payload leaves its link in place.
-- No privilege on these tables is granted to tenants' roles: their entries
-- are linked by the trigger, which runs with its owner's rights, and only
-- the owner reads or changes links.
CREATE TABLE audit_links (
    run_id TEXT NOT NULL,
    seq    BIGINT NOT NULL,
    tenant TEXT NOT NULL,
    link   BYTEA NOT NULL,
    PRIMARY KEY (run_id, seq)
);

-- The last link of each pruned run, so that verification can tell a run an
-- operator pruned from one deleted behind Cairn's back.
CREATE TABLE audit_pruned (
    run_id    TEXT PRIMARY KEY,
    tenant    TEXT NOT NULL,
    seq       BIGINT NOT NULL,
    link      BYTEA NOT NULL,
    pruned_at DOUBLE PRECISION NOT NULL
);

-- Signed checkpoints of a tenant's run heads (cairn.api.audit): the record
-- as exported to an anchor, JSON.
CREATE TABLE audit_checkpoints (
    tenant TEXT NOT NULL,
    id     BIGINT NOT NULL,
    at     DOUBLE PRECISION NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (tenant, id)
);

-- The canonical bytes of a stored entry: each column tagged by type and
-- length-prefixed, exactly as auditlinks.canonical encodes them in Python.
CREATE FUNCTION audit_canonical(h history) RETURNS BYTEA
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN h.run_id IS NULL THEN '\x00'::bytea
                ELSE '\x03'::bytea || int4send(octet_length(h.run_id)) || convert_to(h.run_id, 'UTF8') END
        || CASE WHEN h.seq IS NULL THEN '\x00'::bytea ELSE '\x01'::bytea || int8send(h.seq) END
        || CASE WHEN h.tenant IS NULL THEN '\x00'::bytea
                ELSE '\x03'::bytea || int4send(octet_length(h.tenant)) || convert_to(h.tenant, 'UTF8') END
        || CASE WHEN h.event IS NULL THEN '\x00'::bytea
                ELSE '\x03'::bytea || int4send(octet_length(h.event)) || convert_to(h.event, 'UTF8') END
        || CASE WHEN h.at IS NULL THEN '\x00'::bytea ELSE '\x02'::bytea || float8send(h.at) END
        || CASE WHEN h.epoch IS NULL THEN '\x00'::bytea ELSE '\x01'::bytea || int8send(h.epoch) END
        || CASE WHEN h.worker IS NULL THEN '\x00'::bytea
                ELSE '\x03'::bytea || int4send(octet_length(h.worker)) || convert_to(h.worker, 'UTF8') END
        || CASE WHEN h.position IS NULL THEN '\x00'::bytea ELSE '\x01'::bytea || int8send(h.position) END
        || CASE WHEN h.step_kind IS NULL THEN '\x00'::bytea
                ELSE '\x03'::bytea || int4send(octet_length(h.step_kind)) || convert_to(h.step_kind, 'UTF8') END
        || CASE WHEN h.name IS NULL THEN '\x00'::bytea
                ELSE '\x03'::bytea || int4send(octet_length(h.name)) || convert_to(h.name, 'UTF8') END
        || CASE WHEN h.input_hash IS NULL THEN '\x00'::bytea
                ELSE '\x03'::bytea || int4send(octet_length(h.input_hash)) || convert_to(h.input_hash, 'UTF8') END
        || CASE WHEN h.attempt IS NULL THEN '\x00'::bytea ELSE '\x01'::bytea || int8send(h.attempt) END
        || CASE WHEN h.started_at IS NULL THEN '\x00'::bytea ELSE '\x02'::bytea || float8send(h.started_at) END
        || CASE WHEN h.payload IS NULL THEN '\x00'::bytea
                ELSE '\x04'::bytea || int4send(length(h.payload)) || h.payload END
        || CASE WHEN h.payload_ref IS NULL THEN '\x00'::bytea
                ELSE '\x03'::bytea || int4send(octet_length(h.payload_ref)) || convert_to(h.payload_ref, 'UTF8') END
        || CASE WHEN h.detail IS NULL THEN '\x00'::bytea
                ELSE '\x03'::bytea || int4send(octet_length(h.detail)) || convert_to(h.detail, 'UTF8') END
$$;

-- The entries a statement inserted get their links at its end, in the
-- statement's transaction: one trigger call per statement, over its rows in
-- (run_id, seq) order, each run's previous link read once and then carried
-- (a row trigger's read would not see the links written for the rows before
-- it in the same statement).
CREATE FUNCTION audit_link_entries() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    entry history;
    run TEXT := NULL;
    previous BYTEA;
BEGIN
    FOR entry IN SELECT * FROM new_entries ORDER BY run_id, seq LOOP
        IF run IS DISTINCT FROM entry.run_id THEN
            run := entry.run_id;
            previous := NULL;
            SELECT l.link INTO previous FROM audit_links AS l
            WHERE l.run_id = entry.run_id AND l.seq < entry.seq ORDER BY l.seq DESC LIMIT 1;
        END IF;
        previous := sha256(COALESCE(previous, '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea)
                           || audit_canonical(entry));
        INSERT INTO audit_links (run_id, seq, tenant, link) VALUES (entry.run_id, entry.seq, entry.tenant, previous);
    END LOOP;
    RETURN NULL;
END
$$;

CREATE TRIGGER audit_link AFTER INSERT ON history REFERENCING NEW TABLE AS new_entries
    FOR EACH STATEMENT EXECUTE FUNCTION audit_link_entries();

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION audit_link_entries() SET search_path = %I, pg_temp', current_schema());
END
$$;

-- The history already written is linked now, each run from its first entry.
WITH RECURSIVE chain (run_id, seq, tenant, link) AS (
    SELECT h.run_id, h.seq, h.tenant,
           sha256('\x0000000000000000000000000000000000000000000000000000000000000000'::bytea
                  || audit_canonical(h))
    FROM history AS h WHERE h.seq = (SELECT MIN(m.seq) FROM history AS m WHERE m.run_id = h.run_id)
    UNION ALL
    SELECT h.run_id, h.seq, h.tenant, sha256(c.link || audit_canonical(h))
    FROM chain AS c JOIN history AS h ON h.run_id = c.run_id AND h.seq = c.seq + 1
)
INSERT INTO audit_links (run_id, seq, tenant, link) SELECT run_id, seq, tenant, link FROM chain;
