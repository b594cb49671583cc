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
    size      INTEGER NOT NULL,
    value     BLOB NOT NULL,
    PRIMARY KEY (tenant, namespace, key)
);  -- a rowid table: a value of kilobytes would overflow a WITHOUT ROWID b-tree's pages

CREATE TRIGGER memory_items_cold_gone AFTER DELETE ON memory_items WHEN OLD.tier = 'cold'
BEGIN
    DELETE FROM memory_item_cold WHERE tenant = OLD.tenant AND namespace = OLD.namespace AND key = OLD.key;
END;

CREATE TRIGGER memory_items_cold_rewarmed AFTER UPDATE OF tier ON memory_items
WHEN OLD.tier = 'cold' AND NEW.tier = 'hot'
BEGIN
    DELETE FROM memory_item_cold WHERE tenant = OLD.tenant AND namespace = OLD.namespace AND key = OLD.key;
END;
