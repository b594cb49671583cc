-- Reserved: migration 0027 belongs to another branch (issue 26's brief). This
-- placeholder keeps the audit branch's numbering contiguous; it is deleted
-- when that branch's 0027 is merged.
SELECT 1;
