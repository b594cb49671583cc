-- The ids of schedule ticks are reserved for their own tenant (see
-- cairn/store/runids.py). Run ids are one namespace for every tenant and a
-- tick's id is predictable (schedule:<tenant>:<name>:<UTC time>), so a
-- tenant's role could insert a run under a tick id of another tenant (or
-- rename one of its own runs to it) before the tick is due, and the tick
-- would start nothing. An id beginning 'schedule:' must go on with the row's
-- own tenant, percent-encoded as the scheduler encodes it, then ':'. A CHECK
-- binds every role, the owner's included, and costs a prefix test on other
-- ids. NOT VALID: rows written before this migration are not re-checked (a
-- squatter's earlier row must not stop the upgrade; the tick it took was
-- skipped and logged, and every later one is protected).
CREATE FUNCTION url_quote(part TEXT) RETURNS TEXT
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT COALESCE(string_agg(
        CASE WHEN byte BETWEEN 48 AND 57 OR byte BETWEEN 65 AND 90 OR byte BETWEEN 97 AND 122
                  OR byte IN (45, 46, 95, 126)
             THEN chr(byte)
             ELSE '%' || upper(lpad(to_hex(byte), 2, '0')) END, '' ORDER BY i), '')
    FROM (SELECT convert_to(part, 'UTF8') AS bytes) AS encoded,
         LATERAL generate_series(0, length(encoded.bytes) - 1) AS i,
         LATERAL get_byte(encoded.bytes, i) AS byte
$$;

ALTER TABLE runs ADD CONSTRAINT runs_schedule_ids
    CHECK (NOT starts_with(run_id, 'schedule:')
           OR starts_with(run_id, 'schedule:' || url_quote(tenant) || ':')) NOT VALID;
