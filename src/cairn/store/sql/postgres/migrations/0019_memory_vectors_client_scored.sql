-- The rows of memory_vectors the client scores where pgvector is installed
-- (issue 14): cold ones and hot ones without their pgvector copy yet. A
-- search reads them with search_without_pgvector after pgvector has scored
-- the rest; without this index that read was a second sequential scan of
-- the whole table (measured at 100,000 hot rows: it doubled a search).
-- Partial on the query's own condition, so it holds only those rows; keyed
-- like the primary key, so that a statement on one item's cold vector that
-- the planner sends through it (its condition implies the index's) is still
-- one seek: keyed by (tenant, dims) and with statistics taken while it was
-- empty, cooling 100,000 vectors took 28 ms a statement. Only where
-- migration 0016 added `vec` (without pgvector the client scores every
-- row, with search_candidates).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_attribute
               WHERE attrelid = 'memory_vectors'::regclass AND attname = 'vec' AND NOT attisdropped) THEN
        CREATE INDEX memory_vectors_client_scored ON memory_vectors (tenant, namespace, key)
            WHERE tier = 'cold' OR vec IS NULL;
    END IF;
END
$$;
