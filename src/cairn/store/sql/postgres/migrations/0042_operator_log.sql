-- The operator log (issue 26, cairn/store/oplog.py): one append-only record
-- per operator mutation of a non-run object (tokens, queues, schedules, keys,
-- bundles, retention policies...), written in the mutation's transaction and
-- hash-chained per tenant with the audit chain's link function. tenant '' is
-- the installation's own objects (queue limits, bundles).
--
-- A tenant's role may read and append its own tenant's records only (row
-- security, INSERT without UPDATE or DELETE): it can neither rewrite nor
-- remove a record, and one it appends behind the store's back with a forged
-- link fails `cairn audit verify`.
CREATE TABLE operator_log (
    tenant    TEXT NOT NULL,
    seq       BIGINT NOT NULL,
    at        DOUBLE PRECISION NOT NULL,
    kind      TEXT NOT NULL,
    object_id TEXT NOT NULL,
    action    TEXT NOT NULL,
    actor     TEXT NOT NULL,
    auth      TEXT NOT NULL,
    change    TEXT NOT NULL,
    digest    BYTEA NOT NULL,
    link      BYTEA NOT NULL,
    PRIMARY KEY (tenant, seq)
);
ALTER TABLE operator_log ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON operator_log
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))))
    WITH CHECK (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))));
INSERT INTO tenant_privileges (object_name, privileges) VALUES ('operator_log', 'SELECT, INSERT');
SELECT grant_privileges('operator_log');
