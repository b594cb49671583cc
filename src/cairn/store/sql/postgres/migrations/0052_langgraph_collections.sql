-- How many times a LangGraph thread's values were collected (issue 24, 2026-12-07 fifth
-- session; SQLite's 0032 says why). lg_hold takes the count the writer's memory of the
-- thread was made under (p_collected, NULL: it remembers nothing of it) and refuses a writer
-- whose memory is stale: the thread was collected since, or deleted since the writer held it
-- (SQLSTATE LGS01, the thread's count as the DETAIL, or 'deleted'; nothing after it in the
-- message runs). The saver forgets what it remembered of the thread and sends the whole
-- write again, expecting the count now. lg_hold returns the epoch held and the count
-- (checkpointsql.hold_rule is the same rule in SQLite's client).
ALTER TABLE lg_threads ADD COLUMN collected BIGINT NOT NULL DEFAULT 0;

DROP FUNCTION lg_hold(TEXT, TEXT, TEXT, BIGINT, BIGINT);

CREATE FUNCTION lg_hold(p_tenant TEXT, p_thread TEXT, p_owner TEXT, p_epoch BIGINT, p_lease BIGINT,
                        p_collected BIGINT, OUT held BIGINT, OUT collections BIGINT)
LANGUAGE plpgsql AS $$
DECLARE
    held_owner TEXT;
    held_epoch BIGINT;
    held_collected BIGINT;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(p_tenant || '/' || p_thread, 0)),
            set_config('enable_seqscan', 'off', true);
    SELECT owner, epoch, collected INTO held_owner, held_epoch, held_collected FROM lg_threads
    WHERE tenant = p_tenant AND thread_id = p_thread;
    IF p_lease IS NOT NULL THEN
        IF FOUND AND held_epoch > p_lease THEN
            RAISE EXCEPTION 'LangGraph thread % is held by a later lease', p_thread
                USING ERRCODE = 'LGT01', DETAIL = held_epoch::TEXT;
        END IF;
    ELSIF FOUND AND held_owner <> p_owner AND p_epoch IS NOT NULL THEN
        RAISE EXCEPTION 'LangGraph thread % was taken by another saver', p_thread
            USING ERRCODE = 'LGT01', DETAIL = held_epoch::TEXT;
    END IF;
    collections := coalesce(held_collected, 0);
    IF p_collected IS NOT NULL AND NOT FOUND AND p_epoch IS NOT NULL THEN
        RAISE EXCEPTION 'LangGraph thread % was deleted since this writer last wrote it', p_thread
            USING ERRCODE = 'LGS01', DETAIL = 'deleted';
    END IF;
    IF p_collected IS NOT NULL AND FOUND AND held_collected <> p_collected THEN
        RAISE EXCEPTION 'LangGraph thread % was collected since this writer last wrote it', p_thread
            USING ERRCODE = 'LGS01', DETAIL = held_collected::TEXT;
    END IF;
    IF p_lease IS NOT NULL THEN
        held := p_lease;
        IF FOUND AND held_owner = p_owner AND held_epoch = p_lease THEN
            RETURN;
        END IF;
    ELSIF FOUND THEN
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
