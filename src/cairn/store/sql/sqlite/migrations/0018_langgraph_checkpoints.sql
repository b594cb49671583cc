-- LangGraph checkpoints (issue 24, cairn.langgraph.CairnSaver). A LangGraph
-- thread is not a Cairn run: its checkpoints are written by LangGraph's loop
-- in any process, so they have tables of their own, keyed by the saver's
-- tenant (another tenant's thread is simply absent). Values are content
-- addressed per thread (lg_values, digest = 64 bits of BLAKE2b of the
-- serializer's type and bytes): a channel's version (lg_blobs) and a pending
-- write (lg_writes) hold packed digests (refs, 8 bytes each), so a message
-- written by a node and then appended to the list channel is stored once,
-- and a list that grew stores only its new items (kind 'list' with a base
-- version; depth counts the bases below it). See docs/design.md
-- "LangGraph checkpointer".
CREATE TABLE lg_checkpoints (
    tenant          TEXT NOT NULL,
    thread_id       TEXT NOT NULL,
    ns              TEXT NOT NULL,
    checkpoint_id   TEXT NOT NULL,
    parent_id       TEXT,
    run_id          TEXT,
    checkpoint_kind TEXT NOT NULL,
    checkpoint      BLOB NOT NULL,
    metadata_kind   TEXT NOT NULL,
    metadata        BLOB NOT NULL,
    PRIMARY KEY (tenant, thread_id, ns, checkpoint_id)
) WITHOUT ROWID;

CREATE TABLE lg_blobs (
    tenant    TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    ns        TEXT NOT NULL,
    channel   TEXT NOT NULL,
    version   TEXT NOT NULL,
    kind      TEXT NOT NULL CHECK (kind IN ('value', 'list', 'empty')),
    base      TEXT,
    depth     INTEGER NOT NULL,
    refs      BLOB NOT NULL,
    PRIMARY KEY (tenant, thread_id, ns, channel, version)
) WITHOUT ROWID;

CREATE TABLE lg_writes (
    tenant        TEXT NOT NULL,
    thread_id     TEXT NOT NULL,
    ns            TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    task_id       TEXT NOT NULL,
    idx           INTEGER NOT NULL,
    channel       TEXT NOT NULL,
    task_path     TEXT NOT NULL,
    kind          TEXT NOT NULL CHECK (kind IN ('value', 'list')),
    refs          BLOB NOT NULL,
    PRIMARY KEY (tenant, thread_id, ns, checkpoint_id, task_id, idx)
) WITHOUT ROWID;

CREATE TABLE lg_values (
    tenant    TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    digest    INTEGER NOT NULL,
    kind      TEXT NOT NULL,
    data      BLOB NOT NULL,
    PRIMARY KEY (tenant, thread_id, digest)
);

-- Who writes a thread (fencing): the saver that took it (owner, a random id
-- per CairnSaver) and how many times it changed hands (epoch). A saver takes
-- a thread on its first write to it; a saver that held it and lost it to
-- another is refused every write after (cairn.errors.ThreadTaken), so two
-- processes driving one thread never fork its chain of checkpoints.
CREATE TABLE lg_threads (
    tenant    TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    owner     TEXT NOT NULL,
    epoch     INTEGER NOT NULL,
    PRIMARY KEY (tenant, thread_id)
) WITHOUT ROWID;
