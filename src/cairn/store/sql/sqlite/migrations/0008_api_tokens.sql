-- Bearer tokens of the HTTP API (cairn serve): each bound to one tenant and
-- one role. Only the SHA-256 of the secret is stored; a token is looked up by
-- its public id and its digest compared in constant time. revoked_at set:
-- refused from then on (kept, so `cairn tokens list` can show who had what).
CREATE TABLE api_tokens (
    token_id    TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    role        TEXT NOT NULL,
    name        TEXT NOT NULL,
    digest      TEXT NOT NULL,
    created_at  REAL NOT NULL,
    created_by  TEXT,
    revoked_at  REAL
) WITHOUT ROWID;

CREATE INDEX api_tokens_tenant ON api_tokens (tenant, created_at);

-- A tenant's run changes in the order they happened: the cursor of the
-- tenant-wide event stream and of the dashboard's live runs list.
CREATE INDEX runs_tenant_updated ON runs (tenant, updated_at, run_id);
