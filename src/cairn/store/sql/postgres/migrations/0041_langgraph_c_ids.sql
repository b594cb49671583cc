-- LangGraph checkpoint ids in "C" (byte) order (issue 24: a history page on
-- PostgreSQL). The saver orders a thread's checkpoints by id as "C" strings
-- (LangGraph's ids are time-ordered UUIDs, compared as bytes on SQLite too);
-- under the database's own collation the primary key could not serve that
-- order, so the latest checkpoint and every history page sorted all of the
-- namespace's checkpoints (EXPLAIN ANALYZE at 3,000: a Sort over 3,000 rows
-- for a page of 10). With the column in "C" the key is read backwards and
-- stops after the page. The key is rebuilt; ids are ASCII, so equality is
-- unchanged.
ALTER TABLE lg_checkpoints ALTER COLUMN checkpoint_id TYPE TEXT COLLATE "C";
