-- Wake workers at once when a run may have become claimable, instead of
-- waiting for their next poll. Any write that gives a run a runnable_at while
-- it is not held (a new run, a child, a retry, a release, a parent woken by
-- its child, an operator action, a timer set) notifies channel
-- cairn_runnable with the schema's name as payload; PostgreSQL delivers it at
-- commit and folds duplicates within a transaction. Polling stays as the
-- safety net: a lost notification costs latency, never a stuck run.

CREATE FUNCTION notify_runnable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('cairn_runnable', TG_TABLE_SCHEMA);
    RETURN NULL;
END
$$;

CREATE TRIGGER runs_notify_runnable
    AFTER INSERT OR UPDATE OF runnable_at, status ON runs
    FOR EACH ROW
    WHEN (NEW.runnable_at IS NOT NULL AND NEW.status <> 'running')
    EXECUTE FUNCTION notify_runnable();
