-- A list channel's version keeps its packed digests in its own row (issue 24:
-- storage). The Fenwick spine (cairn.langgraph.next_base) gives version j the
-- digests after version j - lowbit(j): 256 of them (2 KB) at j = 256, 1,024 at
-- 1,024. PostgreSQL moved a row past 2 KB to the table's TOAST relation, which
-- then took its pages, its free space and visibility maps and its index: 57 KB
-- of the 802 KB a 300-step thread took, for 2 KB of digests, where the row
-- itself has room in its page. STORAGE MAIN keeps the column in the row until
-- the row would not fit a page; digests are random, so no compression is lost.
ALTER TABLE lg_blobs ALTER COLUMN refs SET STORAGE MAIN;
