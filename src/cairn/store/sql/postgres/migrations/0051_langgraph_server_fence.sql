-- LangGraph's fence checked in the server (issue 24, 2026-12-07: a super-step in 2 round
-- trips, not 4). A write took the thread's lock, read its holder, and waited for the client
-- to check the fence (checkpointsql._lg_hold) before it sent the closing statements and
-- the COMMIT. lg_hold is that lock, that read and that rule in one statement, so a write is
-- one message with its COMMIT: a refused writer's message stops at lg_hold (SQLSTATE
-- LGT01, the holder's epoch as the DETAIL; the store raises ThreadTaken) and commits
-- nothing. The rule is checkpointsql.hold_rule's, which SQLite keeps in the client; tests
-- (tests/langgraph/test_server_fence.py) hold the two to the same answers.
--
-- Under the thread's lock: a lease holder (p_lease, a run's lease epoch) holds the thread
-- at its lease, refused once a later lease took it; any other holder is refused once
-- another owner took a thread it held (p_epoch: the epoch it last held it at, NULL if it
-- never did), and takes a thread it never held (epoch + 1). Returns the epoch held.
-- SECURITY INVOKER, as the statements it replaces: row-level security confines it to the
-- caller's tenants, and it resolves the caller's tables (the session's search_path).
-- It also turns sequential scans off for the transaction, as lg_lock_thread does
-- (lg_fold_writes walks the writes' index).
CREATE FUNCTION lg_hold(p_tenant TEXT, p_thread TEXT, p_owner TEXT, p_epoch BIGINT, p_lease BIGINT)
RETURNS BIGINT LANGUAGE plpgsql AS $$
DECLARE
    held_owner TEXT;
    held_epoch BIGINT;
    taken BIGINT;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(p_tenant || '/' || p_thread, 0)),
            set_config('enable_seqscan', 'off', true);
    SELECT owner, epoch INTO held_owner, held_epoch FROM lg_threads
    WHERE tenant = p_tenant AND thread_id = p_thread;
    IF p_lease IS NOT NULL THEN
        IF FOUND AND held_epoch > p_lease THEN
            RAISE EXCEPTION 'LangGraph thread % is held by a later lease', p_thread
                USING ERRCODE = 'LGT01', DETAIL = held_epoch::TEXT;
        END IF;
        IF FOUND AND held_owner = p_owner AND held_epoch = p_lease THEN
            RETURN p_lease;
        END IF;
        taken := p_lease;
    ELSIF FOUND THEN
        IF held_owner = p_owner THEN
            RETURN held_epoch;
        END IF;
        IF p_epoch IS NOT NULL THEN
            RAISE EXCEPTION 'LangGraph thread % was taken by another saver', p_thread
                USING ERRCODE = 'LGT01', DETAIL = held_epoch::TEXT;
        END IF;
        taken := held_epoch + 1;
    ELSE
        taken := 1;
    END IF;
    INSERT INTO lg_threads (tenant, thread_id, owner, epoch) VALUES (p_tenant, p_thread, p_owner, taken)
    ON CONFLICT (tenant, thread_id) DO UPDATE SET owner = excluded.owner, epoch = excluded.epoch;
    RETURN taken;
END
$$;

-- A put folds its parent's pending writes still in rows of lg_writes (written before their
-- checkpoint was stored, which LangGraph's loop does whenever a node's writes reach the
-- thread's lock before the put of their checkpoint) into the parent's row, as a record the
-- client builds (checkpointsql.fold_writes). Sent in one message, the put folds the rows it
-- expects (those its store inserted: PostgresStore._lg_operate); the statement moving them
-- passes here how many moved rows were not expected, or expected rows did not move, and
-- any raises LGF01: the message rolls back and the store sends the put again in two
-- messages, folding the rows it read. So what is folded is always exactly what moved.
CREATE FUNCTION lg_fold_as_sent(mismatched BIGINT) RETURNS BIGINT LANGUAGE plpgsql AS $$
BEGIN
    IF mismatched > 0 THEN
        RAISE EXCEPTION 'the pending writes to fold are not those the put sent folded'
            USING ERRCODE = 'LGF01';
    END IF;
    RETURN mismatched;
END
$$;
