-- The audit chain (issue 26, cairn/store/auditlinks.py): one SHA-256 link
-- per history entry, link(n) = SHA-256(link(n-1) || the entry's stored row),
-- written by a TEMP trigger each write connection carries, in the statement
-- that writes the entry. A separate table, so the hot path's insert into
-- history is unchanged and an erased payload leaves its link in place.
CREATE TABLE audit_links (
    run_id TEXT NOT NULL,
    seq    INTEGER NOT NULL,
    tenant TEXT NOT NULL,
    link   BLOB NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

-- The last link of each pruned run, so that verification can tell a run an
-- operator pruned from one deleted behind Cairn's back.
CREATE TABLE audit_pruned (
    run_id    TEXT PRIMARY KEY,
    tenant    TEXT NOT NULL,
    seq       INTEGER NOT NULL,
    link      BLOB NOT NULL,
    pruned_at REAL NOT NULL
) WITHOUT ROWID;

-- Signed checkpoints of a tenant's run heads (cairn.api.audit): the record
-- as exported to an anchor, JSON.
CREATE TABLE audit_checkpoints (
    tenant TEXT NOT NULL,
    id     INTEGER NOT NULL,
    at     REAL NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (tenant, id)
) WITHOUT ROWID;

-- The history already written is linked now, each run from its first entry
-- (cairn_audit_link is registered on every connection the store opens).
WITH RECURSIVE chain (run_id, seq, tenant, link) AS (
    SELECT h.run_id, h.seq, h.tenant,
           cairn_audit_link(NULL, h.run_id, h.seq, h.tenant, h.event, h.at, h.epoch, h.worker, h.position,
                            h.step_kind, h.name, h.input_hash, h.attempt, h.started_at,
                            CASE WHEN substr(h.payload, 1, 2) = X'0002'
                                 THEN (SELECT p.data FROM history_payloads AS p
                                       WHERE p.id = CAST(substr(h.payload, 3) AS INTEGER))
                                 ELSE h.payload END,
                            h.payload_ref, h.detail)
    FROM history AS h WHERE h.seq = (SELECT MIN(m.seq) FROM history AS m WHERE m.run_id = h.run_id)
    UNION ALL
    SELECT h.run_id, h.seq, h.tenant,
           cairn_audit_link(c.link, h.run_id, h.seq, h.tenant, h.event, h.at, h.epoch, h.worker, h.position,
                            h.step_kind, h.name, h.input_hash, h.attempt, h.started_at,
                            CASE WHEN substr(h.payload, 1, 2) = X'0002'
                                 THEN (SELECT p.data FROM history_payloads AS p
                                       WHERE p.id = CAST(substr(h.payload, 3) AS INTEGER))
                                 ELSE h.payload END,
                            h.payload_ref, h.detail)
    FROM chain AS c JOIN history AS h ON h.run_id = c.run_id AND h.seq = c.seq + 1
)
INSERT INTO audit_links (run_id, seq, tenant, link) SELECT run_id, seq, tenant, link FROM chain;
