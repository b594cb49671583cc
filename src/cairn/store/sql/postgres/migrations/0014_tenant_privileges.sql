-- The privileges grant_tenant gives a tenant's role, as data: one row per
-- table (or sequence). Until now every migration that added a table redefined
-- grant_tenant with every earlier grant restated, and a migration that forgot
-- one silently took a privilege away from every role granted after it. Now a
-- migration that adds a table adds its row here and calls
-- grant_privileges(name) for the roles granted before it; grant_tenant reads
-- the table. Only the schema's owner may change it (no grant to anyone): the
-- privileges text is SQL that grant_tenant executes.
CREATE TABLE tenant_privileges (
    object_name TEXT PRIMARY KEY,
    object_kind TEXT NOT NULL DEFAULT 'TABLE',
    privileges  TEXT NOT NULL,
    CONSTRAINT tenant_privileges_kind CHECK (object_kind IN ('TABLE', 'SEQUENCE'))
);

INSERT INTO tenant_privileges (object_name, privileges) VALUES
    ('runs', 'SELECT, INSERT, UPDATE'),
    ('history', 'SELECT, INSERT'),
    ('artifacts', 'SELECT'),
    ('schema_migrations', 'SELECT'),
    ('tenant_grants', 'SELECT'),
    ('queues', 'SELECT, UPDATE (updated_at)'),
    ('queue_buckets', 'SELECT, INSERT, UPDATE'),
    ('mailbox', 'SELECT, INSERT, UPDATE'),
    ('approvals', 'SELECT, INSERT, UPDATE'),
    ('api_tokens', 'SELECT, INSERT, UPDATE'),
    ('schedules', 'SELECT, INSERT, UPDATE');

-- Gives every role granted a tenant the privileges of one object (a
-- migration that adds a table calls it for the roles granted before it).
CREATE FUNCTION grant_privileges(name TEXT) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    grantee NAME;
    item tenant_privileges%ROWTYPE;
BEGIN
    SELECT * INTO STRICT item FROM tenant_privileges AS p WHERE p.object_name = name;
    FOR grantee IN SELECT DISTINCT g.role FROM tenant_grants AS g LOOP
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = grantee) THEN
            EXECUTE format('GRANT %s ON %s %I TO %I', item.privileges, item.object_kind, item.object_name,
                           grantee);
        END IF;
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION grant_tenant(grantee NAME, tenant_name TEXT) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    item tenant_privileges%ROWTYPE;
BEGIN
    INSERT INTO tenant_grants (role, tenant) VALUES (grantee, tenant_name) ON CONFLICT DO NOTHING;
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', current_schema(), grantee);
    FOR item IN SELECT * FROM tenant_privileges ORDER BY object_name LOOP
        EXECUTE format('GRANT %s ON %s %I TO %I', item.privileges, item.object_kind, item.object_name,
                       grantee);
    END LOOP;
END
$$;

REVOKE EXECUTE ON FUNCTION grant_privileges(TEXT) FROM PUBLIC;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION grant_privileges(TEXT) SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION grant_tenant(NAME, TEXT) SET search_path = %I, pg_temp', current_schema());
END
$$;
