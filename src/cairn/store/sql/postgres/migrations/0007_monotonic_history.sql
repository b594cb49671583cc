-- History timestamps are monotonic per run: an entry's ``at`` is never
-- earlier than the run's last entry's, whichever clock its writer read
-- (workers on several machines, a clock stepped back, a writer that read the
-- time before waiting for a lock). A trigger rather than each INSERT: every
-- statement that appends to history is covered, now and later. The look-up
-- is one probe of the primary key (run_id, seq).

CREATE FUNCTION history_monotonic_at() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.at := GREATEST(NEW.at, COALESCE(
        (SELECT h.at FROM history AS h WHERE h.run_id = NEW.run_id ORDER BY h.seq DESC LIMIT 1), NEW.at));
    RETURN NEW;
END
$$;

CREATE TRIGGER history_monotonic_at
    BEFORE INSERT ON history
    FOR EACH ROW
    EXECUTE FUNCTION history_monotonic_at();
