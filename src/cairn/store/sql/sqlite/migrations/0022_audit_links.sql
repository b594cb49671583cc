-- The audit chain (issue 26, cairn/store/auditlinks.py): each history entry
-- carries the digest of its plaintext and its link, written by the store
-- with the entry. Entries already written keep NULL (before the chain); a new
-- entry a statement writes without its link gets the default (empty,
-- pending), and the store links it before its transaction commits, found
-- through the partial index (empty but for a transaction in progress).
ALTER TABLE history ADD COLUMN digest BLOB;
ALTER TABLE history ADD COLUMN link BLOB DEFAULT X'';
UPDATE history SET link = NULL;
CREATE INDEX history_unlinked ON history (run_id, seq) WHERE link = X'';
