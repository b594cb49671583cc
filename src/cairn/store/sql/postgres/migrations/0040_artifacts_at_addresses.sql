-- Artifacts at addresses that survive re-encryption (issue 25). With
-- encryption at rest an artifact is stored under a keyed hash of its
-- content, one key per tenant (cairn.store.sealedartifacts), not under the
-- hash of its sealed bytes: re-encrypting it after a key rotation rewrites
-- its bytes in place, and every row naming it (history.payload_ref, which
-- the audit chain's links cover, among them) stays as it is. The bytes are
-- authenticated by their envelope, bound to that name, not by the name.
--
-- A tenant's role stores such an artifact only through this function, which
-- adds a name never taken and otherwise only refreshes when the bytes were
-- last stored: a role cannot overwrite an artifact. Rewriting one
-- (re-encryption) is the owner's alone. "at" is capped as in store_artifact.
CREATE FUNCTION store_artifact_at(name TEXT, content BYTEA, at DOUBLE PRECISION) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
DECLARE
    stamp DOUBLE PRECISION := LEAST(at, extract(epoch FROM clock_timestamp()));
BEGIN
    IF name IS NULL OR name !~ '^[0-9a-f]{64}$' THEN
        RAISE EXCEPTION 'malformed artifact name' USING ERRCODE = '22023';
    END IF;
    INSERT INTO artifact_gc (ref, queued_at) VALUES (name, stamp) ON CONFLICT (ref) DO NOTHING;
    INSERT INTO artifacts (ref, data, touched_at) VALUES (name, content, stamp)
    ON CONFLICT (ref) DO UPDATE SET touched_at = GREATEST(artifacts.touched_at, excluded.touched_at);
END
$$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION store_artifact_at(TEXT, BYTEA, DOUBLE PRECISION) SET search_path = %I, pg_temp',
                   current_schema());
END
$$;
