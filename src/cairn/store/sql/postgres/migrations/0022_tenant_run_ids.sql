-- The ids a tenant chooses through the HTTP API live in a namespace of its
-- own, 'tenant:<tenant>:...' (see cairn/store/runids.py): run ids are one
-- key for every tenant, so without it one tenant could learn whether another
-- holds an id (a conflict where it expected a new run) or take the id
-- another's client will ask for. As for the schedule ids of migration 0020, a
-- CHECK binds every role; NOT VALID, so no earlier row stops the upgrade.
ALTER TABLE runs ADD CONSTRAINT runs_tenant_ids
    CHECK (NOT starts_with(run_id, 'tenant:')
           OR starts_with(run_id, 'tenant:' || url_quote(tenant) || ':')) NOT VALID;
