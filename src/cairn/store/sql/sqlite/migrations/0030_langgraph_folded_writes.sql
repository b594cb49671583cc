-- A checkpoint's pending writes folded into its row (issue 24: storage). A put
-- moves its parent's rows of lg_writes into the parent's row, one compressed
-- record (cairn.store.checkpointsql.fold_writes), in the put's transaction: a
-- super-step's three rows of lg_writes, each repeating the thread, namespace,
-- checkpoint and task ids in its key, were 464 of the 2,130 bytes a super-step
-- took on SQLite at 300 steps. lg_writes keeps the writes of checkpoints no
-- child was put after yet; rows written before this migration stay there and
-- read as before (a checkpoint's writes are its folded record and its rows).
ALTER TABLE lg_checkpoints ADD COLUMN writes BLOB;

-- The run index holds only checkpoints that have a run id (delete_for_runs
-- looks up given ids, never NULL): a graph invoked without one (LangGraph's
-- default outside its server) spent an index entry a super-step on NULL,
-- 68 of its bytes on SQLite.
DROP INDEX lg_checkpoints_run;
CREATE INDEX lg_checkpoints_run ON lg_checkpoints (tenant, run_id) WHERE run_id IS NOT NULL;
