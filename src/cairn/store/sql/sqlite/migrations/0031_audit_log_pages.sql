-- The audit log a page at a time (issue 26; cairn/api/auditlog.py): each of
-- its three streams is read past the cursor in (at, run_id, seq) order, a
-- page at a time, so a page's cost does not grow with the tenant's history.
-- The hot history by tenant in log order (a journaled step's insert pays for
-- this one more index; bench/results/auditpage-2026-12-06.txt measures it).
CREATE INDEX history_audit_log ON history (tenant, at, run_id, seq);
-- Each archive's first and last entry time, so a page opens only the archives
-- whose range reaches past its cursor (NULL: archived before this migration,
-- opened by every page until restored and archived again).
ALTER TABLE run_archives ADD COLUMN first_at REAL;
ALTER TABLE run_archives ADD COLUMN last_at REAL;
CREATE INDEX run_archives_first_at ON run_archives (tenant, first_at, last_at);
CREATE INDEX run_archives_last_at ON run_archives (tenant, last_at, first_at);
-- The operator log by tenant in time order.
CREATE INDEX operator_log_at ON operator_log (tenant, at, seq);
