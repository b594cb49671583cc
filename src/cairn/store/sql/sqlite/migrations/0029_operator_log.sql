-- The operator log (issue 26, cairn/store/oplog.py): one append-only record
-- per operator mutation of a non-run object (tokens, queues, schedules, keys,
-- bundles, retention policies...), written in the mutation's transaction and
-- hash-chained per tenant with the audit chain's link function. tenant '' is
-- the installation's own objects (queue limits, bundles).
CREATE TABLE operator_log (
    tenant    TEXT NOT NULL,
    seq       INTEGER NOT NULL,
    at        REAL NOT NULL,
    kind      TEXT NOT NULL,
    object_id TEXT NOT NULL,
    action    TEXT NOT NULL,
    actor     TEXT NOT NULL,
    auth      TEXT NOT NULL,
    change    TEXT NOT NULL,
    digest    BLOB NOT NULL,
    link      BLOB NOT NULL,
    PRIMARY KEY (tenant, seq)
) WITHOUT ROWID;
