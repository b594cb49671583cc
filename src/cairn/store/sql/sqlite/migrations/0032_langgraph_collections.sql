-- How many times a LangGraph thread's values were collected (issue 24, 2026-12-07 fifth
-- session). A saver skips writing what it remembers committing (a value, a list's base
-- version) and builds on what it remembers reading; a prune or delete_for_runs by another
-- saver, in this process or another, may since have collected those rows, and the checkpoint
-- the first saver then put named values no longer stored: unreadable, for every reader. A
-- collection now counts itself here, a write is fenced on the count the saver's memory was
-- made under as on its epoch, and a saver whose count is stale forgets what it remembered of
-- the thread and writes the whole checkpoint (cairn.store.checkpointsql.hold_rule, Stale).
ALTER TABLE lg_threads ADD COLUMN collected INTEGER NOT NULL DEFAULT 0;
