-- The retention controller (issue 26 part 3, cairn.store.retention): the
-- policies per data class, the controller's lease, and the record of each
-- run deleted (its audit record once its history is gone).
--
-- A policy keeps one data class of one tenant's runs (or '*': every tenant
-- without its own) of one workflow (or '*') for `keep` seconds (NULL:
-- forever); the most specific policy that matches decides. `updated_by` is
-- the actor who set it.
CREATE TABLE retention_policies (
    tenant     TEXT NOT NULL CHECK (tenant <> ''),
    workflow   TEXT NOT NULL CHECK (workflow <> ''),
    data_class TEXT NOT NULL,
    keep       REAL CHECK (keep IS NULL OR keep >= 0),
    updated_at REAL NOT NULL,
    updated_by TEXT NOT NULL,
    PRIMARY KEY (tenant, workflow, data_class)
) WITHOUT ROWID;

-- Who enforces the policies now: one controller at a time. Every deletion
-- checks, in its own transaction, that its holder still holds the lease at
-- its epoch (a takeover bumps the epoch), so a stale controller deletes nothing.
CREATE TABLE retention_lease (
    name       TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,
    epoch      INTEGER NOT NULL,
    expires_at REAL NOT NULL
) WITHOUT ROWID;

-- A run deleted (by retention or prune), written in the transaction that
-- deletes it: its tenant, workflow, when it finished, its last entry and that
-- entry's audit link (the head an anchor may have signed), when and by whom.
CREATE TABLE retention_deleted (
    run_id      TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    workflow    TEXT NOT NULL,
    finished_at REAL NOT NULL,
    last_seq    INTEGER NOT NULL,
    head        BLOB,
    deleted_at  REAL NOT NULL,
    deleted_by  TEXT NOT NULL
) WITHOUT ROWID;

CREATE INDEX retention_deleted_finished ON retention_deleted (finished_at);
