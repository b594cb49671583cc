-- The role and token a run was started with (issue 28): per-tool
-- authorization by role (cairn.engine.access) reads them wherever the run
-- is resumed, so a run has the rights it started with, never more. NULL: a
-- run started without a token (the app's own code, the CLI, a schedule):
-- a tool restricted to roles refuses it. Never changed once written: a
-- write that would change either is refused, whoever makes it.
ALTER TABLE runs ADD COLUMN started_role TEXT
    CHECK (started_role IN ('viewer', 'operator', 'admin', 'installation'));
ALTER TABLE runs ADD COLUMN started_token TEXT;

CREATE TRIGGER runs_started_with_fixed
BEFORE UPDATE OF started_role, started_token ON runs
WHEN NEW.started_role IS NOT OLD.started_role OR NEW.started_token IS NOT OLD.started_token
BEGIN
    SELECT RAISE(ABORT, 'the role and token a run was started with never change');
END;
