-- The audit log a page at a time (issue 26; cairn/api/auditlog.py): each of
-- its three streams is read past the cursor in (at, run_id, seq) order, a
-- page at a time, so a page's cost does not grow with the tenant's history.
-- The hot history by tenant in log order, run ids byte-wise as the log
-- merges them (a journaled step's insert pays for this one more index;
-- bench/results/auditpage-2026-12-06.txt measures it).
CREATE INDEX history_audit_log ON history (tenant, at, run_id COLLATE "C", seq);
-- Each archive's first and last entry time, so a page opens only the archives
-- whose range reaches past its cursor (NULL: archived before this migration,
-- opened by every page until restored and archived again).
ALTER TABLE run_archives ADD COLUMN first_at DOUBLE PRECISION;
ALTER TABLE run_archives ADD COLUMN last_at DOUBLE PRECISION;
CREATE INDEX run_archives_first_at ON run_archives (tenant, first_at, last_at, run_id COLLATE "C");
CREATE INDEX run_archives_last_at ON run_archives (tenant, last_at, first_at, run_id COLLATE "C");
-- The operator log by tenant in time order.
CREATE INDEX operator_log_at ON operator_log (tenant, at, seq);
