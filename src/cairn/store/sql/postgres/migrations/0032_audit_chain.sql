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

-- The canonical bytes of a stored entry: its columns as one MessagePack
-- array, each value in the smallest form of its type (integers by
-- magnitude, floats as 64-bit doubles, text and bytes length-prefixed),
-- exactly as auditlinks.canonical encodes them in Python (msgspec).
CREATE FUNCTION audit_mp_text(v TEXT) RETURNS BYTEA
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN v IS NULL THEN '\xc0'::bytea
                WHEN octet_length(v) < 32 THEN set_byte('\x00'::bytea, 0, 160 + octet_length(v))
                WHEN octet_length(v) < 256 THEN '\xd9'::bytea || set_byte('\x00'::bytea, 0, octet_length(v))
                WHEN octet_length(v) < 65536 THEN '\xda'::bytea || substring(int4send(octet_length(v)) FROM 3)
                ELSE '\xdb'::bytea || int4send(octet_length(v)) END
        || COALESCE(convert_to(v, 'UTF8'), '\x'::bytea)
$$;

CREATE FUNCTION audit_mp_bytes(v BYTEA) RETURNS BYTEA
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN v IS NULL THEN '\xc0'::bytea
                WHEN length(v) < 256 THEN '\xc4'::bytea || set_byte('\x00'::bytea, 0, length(v)) || v
                WHEN length(v) < 65536 THEN '\xc5'::bytea || substring(int4send(length(v)) FROM 3) || v
                ELSE '\xc6'::bytea || int4send(length(v)) || v END
$$;

CREATE FUNCTION audit_mp_int(v BIGINT) RETURNS BYTEA
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN v IS NULL THEN '\xc0'::bytea
                WHEN v >= 0 AND v < 128 THEN set_byte('\x00'::bytea, 0, v::int)
                WHEN v >= -32 AND v < 0 THEN set_byte('\x00'::bytea, 0, (v + 256)::int)
                WHEN v >= 0 AND v < 256 THEN '\xcc'::bytea || set_byte('\x00'::bytea, 0, v::int)
                WHEN v >= 0 AND v < 65536 THEN '\xcd'::bytea || substring(int4send(v::int) FROM 3)
                WHEN v >= 0 AND v < 4294967296 THEN '\xce'::bytea || substring(int8send(v) FROM 5)
                WHEN v >= 0 THEN '\xcf'::bytea || int8send(v)
                WHEN v >= -128 THEN '\xd0'::bytea || set_byte('\x00'::bytea, 0, (v + 256)::int)
                WHEN v >= -32768 THEN '\xd1'::bytea || substring(int4send(v::int) FROM 3)
                WHEN v >= -2147483648 THEN '\xd2'::bytea || int4send(v::int)
                ELSE '\xd3'::bytea || int8send(v) END
$$;

CREATE FUNCTION audit_mp_float(v DOUBLE PRECISION) RETURNS BYTEA
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN v IS NULL THEN '\xc0'::bytea ELSE '\xcb'::bytea || float8send(v) END
$$;

CREATE FUNCTION audit_canonical(h history) RETURNS BYTEA
LANGUAGE sql IMMUTABLE AS $$
    SELECT '\xdc0010'::bytea || audit_mp_text(h.run_id) || audit_mp_int(h.seq) || audit_mp_text(h.tenant)
        || audit_mp_text(h.event) || audit_mp_float(h.at) || audit_mp_int(h.epoch) || audit_mp_text(h.worker)
        || audit_mp_int(h.position) || audit_mp_text(h.step_kind) || audit_mp_text(h.name)
        || audit_mp_text(h.input_hash) || audit_mp_int(h.attempt) || audit_mp_float(h.started_at)
        || audit_mp_bytes(h.payload) || audit_mp_text(h.payload_ref) || audit_mp_text(h.detail)
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
