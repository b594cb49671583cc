-- Per-run budget limits (tokens, cost, tool calls, wall time) as JSON text. Usage
-- is not stored here: it is derived from the journal, which is already durable.
ALTER TABLE runs ADD COLUMN budget TEXT;
