-- The role and token a run was started with (issue 28): per-tool
-- authorization by role (cairn.engine.access) reads them wherever the run
-- is resumed, so a run has the rights it started with, never more. NULL: a
-- run started without a token (the app's own code, the CLI, a schedule):
-- a tool restricted to roles refuses it.
--
-- A tenant's role may insert and update runs (0014), so the rule is the
-- database's, not the store's: the pair never changes once written (a
-- run started as viewer cannot be made admin by a statement of its own
-- transactional steps, whoever makes it), and a tenant's role cannot record
-- 'installation' (the operator of the whole installation, above every
-- tenant). The owner is not bound by the second rule; it is the installation.
ALTER TABLE runs ADD COLUMN started_role TEXT,
                 ADD COLUMN started_token TEXT,
                 ADD CONSTRAINT runs_started_role
                     CHECK (started_role IN ('viewer', 'operator', 'admin', 'installation'));

CREATE FUNCTION runs_started_with_checked() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND (NEW.started_role IS DISTINCT FROM OLD.started_role
                             OR NEW.started_token IS DISTINCT FROM OLD.started_token) THEN
        RAISE EXCEPTION 'the role and token a run was started with never change'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NEW.started_role = 'installation' AND row_security_active('runs') THEN
        RAISE EXCEPTION 'a tenant''s role cannot start a run as installation'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER runs_started_with_checked
    BEFORE INSERT OR UPDATE OF started_role, started_token ON runs
    FOR EACH ROW EXECUTE FUNCTION runs_started_with_checked();

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION runs_started_with_checked() SET search_path = %I, pg_temp',
                   current_schema());
END
$$;
