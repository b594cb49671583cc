-- How memory_vectors keeps a hot row's vectors (issue 14, pgvector only).
-- A hot row holds its vector twice (1.5 kB each at 384 dimensions), over
-- the 2 kB at which PostgreSQL moves values out of line, and pgvector's type
-- defaults to EXTERNAL: every vector pgvector scans would be a TOAST fetch
-- (measured: no faster than the client's scan). So `vec` stays in the row
-- and the hot `embedding`, which only cooling reads, goes out of line. A
-- migration of its own, not an edit of 0016, so that a database that applied
-- 0016 gets it too; rows written before keep their storage until rewritten
-- (the next embedding or tiering of the item).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_attribute
               WHERE attrelid = 'memory_vectors'::regclass AND attname = 'vec' AND NOT attisdropped) THEN
        ALTER TABLE memory_vectors ALTER COLUMN vec SET STORAGE MAIN,
                                   ALTER COLUMN embedding SET STORAGE EXTERNAL;
    END IF;
END
$$;
