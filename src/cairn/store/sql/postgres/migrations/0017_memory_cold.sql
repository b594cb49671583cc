-- The cold tier of long-term memory item values (issue 14): the value of an
-- item nobody read or wrote for MemoryPolicy(cold_after=) seconds leaves its
-- hot row (memory_items.value becomes NULL, tier 'cold') for this table,
-- zlib-compressed (`codec`; `size` is the length of the value it restores).
-- One row per cold item, in the same database as the item, so a tiering pass
-- moves each value in one transaction (hot or cold, never lost nor both),
-- and deleting the item deletes its cold copy in the same statement (the
-- triggers below, whoever deletes it: an item, a namespace, a run's items,
-- a tenant, the TTL sweep). Reads join it (read-through); a put makes the
-- item hot again and drops the copy. Metadata and index text stay hot: the
-- search filter and the embedding worker read them in SQL.
CREATE TABLE memory_item_cold (
    tenant    TEXT NOT NULL,
    namespace TEXT NOT NULL,
    key       TEXT NOT NULL,
    codec     TEXT NOT NULL,
    size      BIGINT NOT NULL,
    value     BYTEA NOT NULL,
    PRIMARY KEY (tenant, namespace, key)
);

-- The copy goes with its item, and when the item turns hot again (a put, a
-- rewarm). The invoker's rights: the copy is of the same tenant as its item,
-- which the role could delete (row-level security below).
CREATE FUNCTION memory_drop_cold_copy() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM memory_item_cold
    WHERE tenant = OLD.tenant AND namespace = OLD.namespace AND key = OLD.key;
    RETURN NULL;
END
$$;
CREATE TRIGGER memory_items_cold_gone AFTER DELETE ON memory_items
    FOR EACH ROW WHEN (OLD.tier = 'cold') EXECUTE FUNCTION memory_drop_cold_copy();
CREATE TRIGGER memory_items_cold_rewarmed AFTER UPDATE OF tier ON memory_items
    FOR EACH ROW WHEN (OLD.tier = 'cold' AND NEW.tier = 'hot') EXECUTE FUNCTION memory_drop_cold_copy();

-- Row-level security: the grant rule of memory_items (0015).
ALTER TABLE memory_item_cold ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON memory_item_cold
    USING (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))))
    WITH CHECK (tenant = ANY (ARRAY(
        SELECT g.tenant FROM tenant_grants AS g
        WHERE g.role = current_user
          AND g.tenant = COALESCE(NULLIF(current_setting('cairn.tenant', true), ''), g.tenant))));

-- A tenant's role reads its cold copies (reads join them) and writes them
-- (a tiering pass, a deletion): grant_tenant grants what tenant_privileges
-- lists (0014); the roles granted before get it here.
INSERT INTO tenant_privileges (object_name, object_kind, privileges)
VALUES ('memory_item_cold', 'TABLE', 'SELECT, INSERT, UPDATE, DELETE');

SELECT grant_privileges('memory_item_cold');

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION memory_drop_cold_copy() SET search_path = %I, pg_temp', current_schema());
END
$$;
