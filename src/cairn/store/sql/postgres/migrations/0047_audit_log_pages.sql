-- The audit log a page at a time (issue 26; cairn/api/auditlog.py): each of
-- its three streams is read past the cursor in (at, run_id, seq) order, a
-- page at a time, so a page's cost does not grow with the tenant's history.
-- (The hot history needs no index of its own: it is read run by run, by
-- primary key, the runs found by runs_tenant_created. An index on history
-- by (tenant, at, run_id, seq) was measured at +5.4 to +7.6 us CPU a store
-- append on SQLite: bench/results/auditpage-2026-12-06.txt.)
-- Each archive's first and last entry time, so a page opens only the archives
-- whose range reaches past its cursor (NULL: archived before this migration,
-- opened by every page until restored and archived again).
ALTER TABLE run_archives ADD COLUMN first_at DOUBLE PRECISION;
ALTER TABLE run_archives ADD COLUMN last_at DOUBLE PRECISION;
CREATE INDEX run_archives_first_at ON run_archives (tenant, first_at, last_at, run_id COLLATE "C");
CREATE INDEX run_archives_last_at ON run_archives (tenant, last_at, first_at, run_id COLLATE "C");
-- The operator log by tenant in time order.
CREATE INDEX operator_log_at ON operator_log (tenant, at, seq);
