-- Approvals: a run asks people to approve, reject or edit an action
-- (ctx.request_approval, protected tools). The lease holder writes a request
-- in the same fenced transaction as the journal entry that records it (the
-- entry at request_seq carries its details); a decision updates the row once
-- (status leaves 'pending' exactly once) and delivers itself into the run's
-- mailbox (the message at decision_seq carries the comment and the edit), in
-- one transaction. approvers and schema are JSON; expires_at NULL: no timeout.
CREATE TABLE approvals (
    run_id       TEXT NOT NULL,
    request_id   TEXT NOT NULL,
    tenant       TEXT NOT NULL,
    position     INTEGER NOT NULL,
    request_seq  INTEGER NOT NULL,
    action       TEXT NOT NULL,
    type_name    TEXT NOT NULL,
    schema       TEXT,
    approvers    TEXT,
    requested_at REAL NOT NULL,
    expires_at   REAL,
    status       TEXT NOT NULL DEFAULT 'pending',
    decided_by   TEXT,
    decided_at   REAL,
    comment      TEXT,
    decision_seq INTEGER,
    PRIMARY KEY (run_id, request_id)
) WITHOUT ROWID;

CREATE INDEX approvals_pending ON approvals (tenant, requested_at) WHERE status = 'pending';
