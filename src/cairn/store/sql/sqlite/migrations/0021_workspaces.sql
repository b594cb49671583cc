-- Workspace objects (issue 27, cairn.workspace): the blobs, chunk lists and
-- trees of runs' workspace snapshots, content addressed per tenant (oid:
-- BLAKE2b-256 hex of the object's kind and plain bytes; data: its stored,
-- compressed form). Two tenants' identical files are two rows: whether an
-- object exists says nothing across tenants. A snapshot's root id is
-- recorded in the detail of the step's journal entry, not here; an object
-- is written by the run's lease holder (fenced, the tenant read from the
-- run row) before the entry that names its root. A rowid table: objects
-- are up to a 1 MiB chunk, too large for a WITHOUT ROWID b-tree.
CREATE TABLE workspace_objects (
    tenant    TEXT NOT NULL,
    oid       TEXT NOT NULL,
    data      BLOB NOT NULL,
    stored_at REAL NOT NULL,
    PRIMARY KEY (tenant, oid)
);
