"""A checkpoint read is one snapshot, whatever the dialect does to save round
trips: on PostgreSQL the read's statements run outside a transaction
(``checkpointsql._lg_reading``: no BEGIN and COMMIT), so a prune committed
between two of them takes rows the read still wants; such a read is done
again in one snapshot, never handed back with channels or values missing."""

from __future__ import annotations

import threading
from typing import Any

import cairn
from cairn.store.checkpointsql import CheckpointRow, Named, Snapshot, ThreadKey, is_literal, unpack_refs


def _whole(snap: Snapshot, names: Named) -> None:
    """Every channel version the checkpoint names as a row has its chain,
    down to a root, and every value its chains, writes and inline channel
    versions name is there (a literal names no row: LangGraph's ``None``
    of the loop's ``branch:to:step``, since branch lgpgdisk)."""
    assert set(snap.chains) == set(names.versions), (sorted(snap.chains), sorted(names.versions))
    assert names.inline  # the loop's plain channels are inline in its rows
    named = {d for chain in snap.chains.values() for _, refs in chain for d in unpack_refs(refs)}
    named |= {d for w in snap.writes for d in unpack_refs(w.refs)} | set(names.inline)
    named = {d for d in named if not is_literal(d)}
    assert named, "the read names no value row"
    assert named <= set(snap.values), named - set(snap.values)


def test_a_prune_between_a_reads_statements_never_yields_a_partial_checkpoint(app: cairn.App) -> None:
    from cairn.langgraph import CairnSaver
    from tests.langgraph.graphs import counting_loop

    saver = CairnSaver(app, tenant="acme")
    config: Any = {"configurable": {"thread_id": "t"}}
    counting_loop(12, "a").compile(checkpointer=saver).invoke({"log": []}, config)
    ids = [t.config["configurable"]["checkpoint_id"] for t in saver.list(config)]
    middle = ids[len(ids) // 2]
    key = ThreadKey("acme", "t", "")
    seen: list[Named] = []
    untouched = saver._rows.lg_read(key, middle, lambda row: seen.append(saver._versions(row)) or seen[-1])
    assert untouched is not None
    _whole(untouched, seen[-1])  # a read with nothing in between is whole

    pruned: list[bool] = []

    def versions_then_prune(row: CheckpointRow) -> Named:
        """The row's versions; the first time, after the checkpoint row was
        read and before its chains and values are, another saver prunes the
        thread to its latest checkpoint (``middle``'s own rows are deleted)."""
        versions = saver._versions(row)
        if not pruned:  # from another thread: its own connection (SQLite's are per thread)
            other = threading.Thread(target=lambda: CairnSaver(app, tenant="acme").prune(["t"]))
            other.start()
            other.join()
            pruned.append(True)
        return versions

    read = saver._rows.lg_read(key, middle, versions_then_prune)
    assert pruned
    # PostgreSQL: the statements missed the pruned rows and the read was done again
    # in one snapshot, after the prune: the checkpoint is gone. SQLite: the read
    # transaction's snapshot predates the prune: the checkpoint whole, as it was.
    if read is not None:
        _whole(read, seen[-1])
    assert saver.get_tuple({"configurable": {"thread_id": "t", "checkpoint_id": middle}}) is None
    latest = saver.get_tuple(config)
    assert latest is not None
    assert len(latest.checkpoint["channel_values"]["log"]) == 12
