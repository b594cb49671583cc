-- The serializer kinds a LangGraph saver writes most, stored as NULL (issue 24:
-- storage on PostgreSQL). Every checkpoint of LangGraph's loop is 'zd1:msgpack'
-- (compressed msgpack, cairn.langgraph.ZDICT) with 'msgpack' metadata, and every
-- value of 128 bytes or more is 'zd1:msgpack': 12 + 8 bytes a checkpoint row and
-- 12 a value row, the same text every row (the rows have a null bitmap already,
-- or gain one in their header's padding). The queries write them as NULL
-- (nullif) and read them back (coalesce): cairn.store.sql.postgres queries.sql,
-- "LangGraph checkpoints". Rows written before keep their text and read as
-- before; any other kind is stored as it is.
ALTER TABLE lg_checkpoints ALTER COLUMN checkpoint_kind DROP NOT NULL,
                           ALTER COLUMN metadata_kind DROP NOT NULL;
ALTER TABLE lg_values ALTER COLUMN kind DROP NOT NULL;
