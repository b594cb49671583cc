-- Reserved: migration 0028 belongs to another branch (issue 25's brief). This
-- placeholder keeps the crypt branch's numbering contiguous; it is deleted
-- when that branch's 0028 is merged.
SELECT 1;
