-- A LangGraph checkpoint read in one statement (issue 24: get_state took three
-- round trips, 2.26 ms at 3,000 super-steps: the row, then its channel chains
-- and writes, then their values). The server cannot read the checkpoint
-- (compressed msgpack, maybe sealed), so the row now also says, in columns it
-- can read, what else the read needs (cairn.store.checkpointsql.lg_read_one):
--   names: the channel versions stored as rows of lg_blobs, "channel<US>version"
--          pairs joined by the unit separator (U+001F); NULL when a name holds it;
--   refs:  packed digests (8 bytes each, little-endian) of the values the row
--          itself names: its inline channels, then, once a put folds them, its
--          pending writes'.
-- Rows written before have NULL in both and are read as before (three statements).
ALTER TABLE lg_checkpoints ADD COLUMN names TEXT, ADD COLUMN refs BYTEA;

-- What lg_read_one reads of a row (cairn.store.checkpointsql): lg_names, the
-- channel versions of names; lg_digests, the digests packed in refs
-- (checkpointsql.unpack_refs: signed 64-bit little-endian; the last byte
-- shifted by 56 wraps into the sign, no overflow). STRICT keeps them from
-- being inlined, so the planner takes ROWS as their size: inlined, it took
-- generate_series's default of 1,000 rows a call, costed the read at 4e8 and
-- JIT-compiled it (1.4 s). Builtins are named with their schema.
CREATE FUNCTION lg_names(names TEXT) RETURNS TABLE (channel TEXT, version TEXT)
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE ROWS 2 AS $$
    SELECT n[2 * k - 1], n[2 * k]
    FROM pg_catalog.string_to_array(names, pg_catalog.chr(31)) AS n,
         pg_catalog.generate_series(1, pg_catalog.cardinality(n) / 2) AS k
$$;

CREATE FUNCTION lg_digests(refs BYTEA) RETURNS SETOF BIGINT
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE ROWS 4 AS $$
    SELECT (pg_catalog.get_byte(refs, o)::bigint
            | (pg_catalog.get_byte(refs, o + 1)::bigint << 8)
            | (pg_catalog.get_byte(refs, o + 2)::bigint << 16)
            | (pg_catalog.get_byte(refs, o + 3)::bigint << 24)
            | (pg_catalog.get_byte(refs, o + 4)::bigint << 32)
            | (pg_catalog.get_byte(refs, o + 5)::bigint << 40)
            | (pg_catalog.get_byte(refs, o + 6)::bigint << 48)
            | (pg_catalog.get_byte(refs, o + 7)::bigint << 56))
    FROM pg_catalog.generate_series(0, pg_catalog.length(refs) - 8, 8) AS o
$$;
