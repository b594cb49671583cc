-- Schedules (issue 11, item 6). Declared in code; what must outlive every
-- worker is kept here, one row per (tenant, name): the definition the
-- workers last registered (so `cairn schedules` needs no application code)
-- and last_tick, the latest tick fired or passed over. A tick fires in the
-- transaction that moves last_tick up to it and creates its run (an id
-- derived from tenant, name and tick), so it fires once however many workers
-- race for it; last_tick never goes back. Ticks are UTC epoch seconds.
CREATE TABLE schedules (
    tenant      TEXT NOT NULL,
    name        TEXT NOT NULL,
    workflow    TEXT NOT NULL,
    cron        TEXT NOT NULL,
    timezone    TEXT NOT NULL,
    missed      TEXT NOT NULL,
    grace       REAL NOT NULL,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL,
    last_tick   REAL,
    last_run_id TEXT,
    fired_at    REAL,
    fired       INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, name)
) WITHOUT ROWID;
