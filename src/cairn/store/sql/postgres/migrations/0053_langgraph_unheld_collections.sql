-- LangGraph's fence: a collection of a thread nobody holds counts too (issue 24, 2026-12-07
-- seventh session). lg_count_collection updated the thread's holder row, so a prune or
-- delete_for_runs of a thread with rows and no holder (a copy_thread target never written)
-- counted nothing, and a saver's first write there (which expects the count it read before
-- reading anything of the thread) was not refused by a prune that raced it: it was stored
-- naming what the prune took. The collection now makes the row, owned by nobody (''), and
-- lg_hold reads such a row as held by nobody whose count counts (checkpointsql.hold_rule,
-- NOBODY: tests/langgraph/test_server_fence.py holds the two to the same answers). And a
-- first write expects the count it read before reading anything of the thread, or -1 when
-- the thread had no holder row then (checkpointsql.NO_ROW): a thread whose row was there and
-- is gone (deleted since) refuses it as stale, and it is made again whole.
CREATE OR REPLACE FUNCTION lg_hold(p_tenant TEXT, p_thread TEXT, p_owner TEXT, p_epoch BIGINT, p_lease BIGINT,
                                   p_collected BIGINT, OUT held BIGINT, OUT collections BIGINT)
LANGUAGE plpgsql AS $$
DECLARE
    held_owner TEXT;
    held_epoch BIGINT;
    held_collected BIGINT;
    has_row BOOLEAN;
    holding BOOLEAN;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(p_tenant || '/' || p_thread, 0)),
            set_config('enable_seqscan', 'off', true);
    SELECT owner, epoch, collected INTO held_owner, held_epoch, held_collected FROM lg_threads
    WHERE tenant = p_tenant AND thread_id = p_thread;
    has_row := FOUND;
    -- a row owned by nobody ('') was made by a collection: it counts, nobody holds the thread
    holding := has_row AND held_owner <> '';
    IF p_lease IS NOT NULL THEN
        IF holding AND held_epoch > p_lease THEN
            RAISE EXCEPTION 'LangGraph thread % is held by a later lease', p_thread
                USING ERRCODE = 'LGT01', DETAIL = held_epoch::TEXT;
        END IF;
    ELSIF holding AND held_owner <> p_owner AND p_epoch IS NOT NULL THEN
        RAISE EXCEPTION 'LangGraph thread % was taken by another saver', p_thread
            USING ERRCODE = 'LGT01', DETAIL = held_epoch::TEXT;
    END IF;
    collections := coalesce(held_collected, 0);
    IF p_collected IS NOT NULL AND NOT holding AND p_epoch IS NOT NULL THEN
        RAISE EXCEPTION 'LangGraph thread % was deleted since this writer last wrote it', p_thread
            USING ERRCODE = 'LGS01', DETAIL = 'deleted';
    END IF;
    -- a first write expects the count it read, or -1 if the thread had no holder row then
    IF p_collected IS NOT NULL AND p_collected <> -1 AND NOT has_row AND p_epoch IS NULL THEN
        RAISE EXCEPTION 'LangGraph thread % was deleted since this writer read it', p_thread
            USING ERRCODE = 'LGS01', DETAIL = 'deleted';
    END IF;
    IF p_collected IS NOT NULL AND has_row AND held_collected <> greatest(p_collected, 0) THEN
        RAISE EXCEPTION 'LangGraph thread % was collected since this writer last wrote it', p_thread
            USING ERRCODE = 'LGS01', DETAIL = held_collected::TEXT;
    END IF;
    IF p_lease IS NOT NULL THEN
        held := p_lease;
        IF holding AND held_owner = p_owner AND held_epoch = p_lease THEN
            RETURN;
        END IF;
    ELSIF holding THEN
        IF held_owner = p_owner THEN
            held := held_epoch;
            RETURN;
        END IF;
        held := held_epoch + 1;
    ELSE
        held := 1;
    END IF;
    INSERT INTO lg_threads (tenant, thread_id, owner, epoch) VALUES (p_tenant, p_thread, p_owner, held)
    ON CONFLICT (tenant, thread_id) DO UPDATE SET owner = excluded.owner, epoch = excluded.epoch;
END
$$;
