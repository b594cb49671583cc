-- The token role a schedule's ticks' runs are started with (issue 28), as
-- the workers last registered it from the app's declaration
-- (App.schedule(role=...)); NULL: none. Shown by cairn schedules and
-- /api/schedules. A tick's run takes its role from the declaration in code,
-- as it takes its workflow and arguments, never from this row: a row a
-- tenant's role edits raises no run's rights (and runs_started_with_checked,
-- 0033, still refuses a tenant's role a run as installation).
ALTER TABLE schedules ADD COLUMN started_role TEXT,
                      ADD CONSTRAINT schedules_started_role
                          CHECK (started_role IN ('viewer', 'operator', 'admin', 'installation'));
