-- History payloads are stored packed (issue 21, cairn/store/rows.py,
-- pack_payload): zlib-compressed from 512 bytes when that saves space, so a
-- model call's entry (about 2.4 KB for two 1 KB messages) stays in its heap
-- row instead of going to TOAST in 2 KB chunks (pglz gives up on text that
-- compresses by less than a quarter). A stored payload that starts with a
-- NUL byte is now a tag: escape the existing ones (only a payload written
-- through the store API, never the codec's JSON, can start so).
UPDATE history SET payload = '\x0000'::bytea || payload WHERE substring(payload FROM 1 FOR 1) = '\x00'::bytea;
