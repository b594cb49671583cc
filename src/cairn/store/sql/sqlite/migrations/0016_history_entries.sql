-- The history as it reads: an entry's payload spilled to history_payloads
-- (0014) put back in its link's place, written once for every statement that
-- reads entries (a simple view: SQLite flattens it into the query, so each
-- keeps its own index and order).
CREATE VIEW history_entries AS
SELECT run_id, seq, event, at, epoch, worker, position, step_kind, name, input_hash, attempt,
       started_at,
       CASE WHEN substr(payload, 1, 2) = X'0002'
            THEN (SELECT p.data FROM history_payloads AS p WHERE p.id = CAST(substr(payload, 3) AS INTEGER))
            ELSE payload END AS payload,
       payload_ref, detail
FROM history;
