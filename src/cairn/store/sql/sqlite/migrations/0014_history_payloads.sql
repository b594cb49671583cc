-- History payloads on disk (issue 21): a model call's entry (about 2.4 KB for
-- two 1 KB messages) is larger than a WITHOUT ROWID row keeps in its page
-- (about 1 KB of a 4 KB page), so every such entry took an overflow page of
-- its own: 80 turns of a chat grew the file by 2.2x its message bytes.
--
-- Payloads are now stored packed (cairn/store/rows.py, pack_payload): zlib-
-- compressed from 512 bytes when that saves space, and, if still larger than
-- a history row should hold, in this rowid table (whose leaves hold rows of
-- up to ~4 KB, packed one after another), the history row keeping only a
-- link (X'0002' and the id's digits). The store's queries put the payload
-- back in the link's place. A plain step's small result stays in its row:
-- one B-tree written per step, as before.
CREATE TABLE history_payloads (
    id   INTEGER PRIMARY KEY,
    data BLOB NOT NULL
);

-- Deleting an entry (pruning) deletes the payload it links to.
CREATE TRIGGER history_payload_gone AFTER DELETE ON history WHEN substr(OLD.payload, 1, 2) = X'0002'
BEGIN
    DELETE FROM history_payloads WHERE id = CAST(substr(OLD.payload, 3) AS INTEGER);
END;

-- A stored payload that starts with a NUL byte is now a tag: escape the
-- existing ones (only a payload written through the store API, never the
-- codec's JSON, can start so).
UPDATE history SET payload = CAST(X'0000' || payload AS BLOB) WHERE substr(payload, 1, 1) = X'00';
