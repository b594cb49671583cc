-- Published events (ctx.set_event): each is a journal entry of step_kind
-- 'event' named by its key; readers (app.get_event) want the latest one of a
-- key. This partial index holds those entries only, so it costs the step hot
-- path nothing and makes the read one seek however long the history is.
CREATE INDEX history_events ON history (run_id, name, seq) WHERE step_kind = 'event';
