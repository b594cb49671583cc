-- Encryption at rest (issue 25, cairn.store.sealed): each tenant's data keys,
-- one per key version, wrapped by a key-encryption key (KEK) that is never
-- stored here (cairn.security.keyring). The newest version seals new writes;
-- older ones stay to open what they sealed until a re-encryption moves it.
-- Deleting a tenant's rows here makes its sealed data unreadable
-- (crypto-shredding, issue 26).
CREATE TABLE data_keys (
    tenant     TEXT NOT NULL,
    version    INTEGER NOT NULL,
    kek_id     TEXT NOT NULL,
    wrapped    BLOB NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (tenant, version)
) WITHOUT ROWID;
