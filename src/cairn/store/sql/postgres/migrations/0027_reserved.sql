-- Reserved: 0027 belongs to another branch (pgclaims). This placeholder only
-- keeps the numbering 1..n on the lgsaver branch; delete it when merging the
-- branch that brings the real 0027.
SELECT 1;
