-- Workspace objects (issue 27, cairn.workspace): the blobs, chunk lists and
-- trees of runs' workspace snapshots, content addressed per tenant (oid:
-- BLAKE2b-256 hex of the object's kind and plain bytes; data: its stored,
-- compressed form). Two tenants' identical files are two rows: whether an
-- object exists says nothing across tenants. A snapshot's root id is
-- recorded in the detail of the step's journal entry, not here; an object
-- is written by the run's lease holder (fenced, the tenant read from the
-- run row) before the entry that names its root.
CREATE TABLE workspace_objects (
    tenant    TEXT NOT NULL,
    oid       TEXT NOT NULL,
    data      BYTEA NOT NULL,
    stored_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (tenant, oid)
);
ALTER TABLE workspace_objects ALTER COLUMN data SET STORAGE EXTERNAL;  -- compressed already

-- Row-level security: the grant rule of the memory tables (0015).
ALTER TABLE workspace_objects ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON workspace_objects
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))))
    WITH CHECK (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))));

-- A tenant's role reads and writes its tenants' workspace objects (and
-- deletes them: collection of unreferenced objects).
INSERT INTO tenant_privileges (object_name, object_kind, privileges)
VALUES ('workspace_objects', 'TABLE', 'SELECT, INSERT, DELETE');

SELECT grant_privileges('workspace_objects');
