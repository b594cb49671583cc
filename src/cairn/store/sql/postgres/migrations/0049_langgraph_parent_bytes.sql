-- A checkpoint's parent id in 17 bytes, not 37 (issue 24: storage on
-- PostgreSQL). LangGraph's ids are uuid6 strings: 36 characters of text, 37
-- bytes on disk, in every row of lg_checkpoints. parent_id is no key and no
-- query compares or orders it, so it is stored packed (lg_id_pack): a
-- canonical lowercase UUID as 0x01 and its 16 bytes, any other id as 0x00 and
-- its UTF-8 bytes; every read gives back the text (lg_id_text), the same
-- characters as written (an upper-case UUID is not canonical: it keeps its
-- text). Rows stored before are rewritten here, their ids packed the same.
CREATE FUNCTION lg_id_pack(id TEXT) RETURNS BYTEA
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE WHEN (id COLLATE "C") OPERATOR(pg_catalog.~)
                     '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                THEN '\x01'::pg_catalog.bytea OPERATOR(pg_catalog.||)
                     pg_catalog.decode(pg_catalog.replace(id, '-', ''), 'hex')
                ELSE '\x00'::pg_catalog.bytea OPERATOR(pg_catalog.||) pg_catalog.convert_to(id, 'UTF8') END
$$;

-- the text lg_id_pack packed (anything else, which it never writes, reads as NULL)
CREATE FUNCTION lg_id_text(packed BYTEA) RETURNS TEXT
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE WHEN pg_catalog.length(packed) = 17
                     AND pg_catalog.substr(packed, 1, 1) OPERATOR(pg_catalog.=) '\x01'::pg_catalog.bytea
                THEN pg_catalog.encode(pg_catalog.substr(packed, 2), 'hex')::pg_catalog.uuid::pg_catalog.text
                WHEN pg_catalog.substr(packed, 1, 1) OPERATOR(pg_catalog.=) '\x00'::pg_catalog.bytea
                THEN pg_catalog.convert_from(pg_catalog.substr(packed, 2), 'UTF8') END
$$;

ALTER TABLE lg_checkpoints ALTER COLUMN parent_id TYPE BYTEA USING lg_id_pack(parent_id);
