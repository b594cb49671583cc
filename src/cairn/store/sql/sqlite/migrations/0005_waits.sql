-- Runs that wait for something other than a timer or a child: a signal, an
-- approval. waiting_for names it (a wait key such as 'signal:NAME'); a
-- delivery for that key makes the run runnable in the same transaction.
ALTER TABLE runs ADD COLUMN waiting_for TEXT;

-- A run's mailbox: what was delivered to it, in order of arrival (seq), each
-- message consumed at most once, by the journal entry at taken_position.
-- dedupe makes a delivery idempotent (a run that signals another sends its
-- operation id, so a replayed or re-executed send delivers nothing twice).
-- tenant is the receiving run's, read from its row by the INSERT.
CREATE TABLE mailbox (
    run_id         TEXT NOT NULL,
    seq            INTEGER NOT NULL,
    tenant         TEXT NOT NULL,
    key            TEXT NOT NULL,
    payload        BLOB,
    payload_ref    TEXT,
    sender         TEXT,
    dedupe         TEXT,
    sent_at        REAL NOT NULL,
    taken_at       REAL,
    taken_position INTEGER,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

CREATE UNIQUE INDEX mailbox_dedupe ON mailbox (run_id, dedupe) WHERE dedupe IS NOT NULL;
CREATE INDEX mailbox_waiting ON mailbox (run_id, key, seq) WHERE taken_at IS NULL;
CREATE INDEX mailbox_payload_ref ON mailbox (payload_ref) WHERE payload_ref IS NOT NULL;
