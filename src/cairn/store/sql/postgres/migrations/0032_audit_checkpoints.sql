-- Signed checkpoints of a tenant's run heads (issue 26, cairn.audit): the
-- Merkle root over every run's last (seq, link), signed with Ed25519, and the
-- record as exported to an anchor (JSON).
CREATE TABLE audit_checkpoints (
    tenant TEXT NOT NULL,
    id     BIGINT NOT NULL,
    at     DOUBLE PRECISION NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (tenant, id)
);
