-- Checkpoint ids packed in the keys of lg_checkpoints and lg_writes (issue
-- 24: storage on PostgreSQL): a canonical UUID (LangGraph's uuid6 ids) in 17
-- bytes, not 37, in the row and in its primary key's entry. lg_id_key (0049)
-- keeps the order of the text (its bytes, the "C" order of 0041), any id of
-- any form among any others, so a thread's checkpoints are read newest first
-- off the key as before; every statement packs the ids it is given and reads
-- them back as text (lg_id_text). Rows stored before are rewritten here.
ALTER TABLE lg_checkpoints ALTER COLUMN checkpoint_id TYPE BYTEA USING lg_id_key(checkpoint_id);
ALTER TABLE lg_writes ALTER COLUMN checkpoint_id TYPE BYTEA USING lg_id_key(checkpoint_id);
