-- A checkpoint's parent id in 17 bytes, not 37 (issue 24: storage on
-- PostgreSQL). LangGraph's ids are uuid6 strings: 36 characters of text, 37
-- bytes on disk, in every row of lg_checkpoints. parent_id is no key and no
-- query compares or orders it, so it is stored packed (lg_id_pack): a
-- canonical lowercase UUID as 0x01 and its 16 bytes, any other id as 0x00 and
-- its UTF-8 bytes; every read gives back the text
-- (lg_id_text), the same characters as written (an upper-case UUID is not
-- canonical: it keeps its text). Rows stored before are rewritten here, their
-- ids packed the same. lg_id_key, the packing of a key that must keep the
-- order of its text (0050), is defined here too: lg_id_text reads both.
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

ALTER TABLE lg_checkpoints ALTER COLUMN parent_id TYPE BYTEA USING lg_id_pack(parent_id);
