"""Named fault-injection points on the commit boundaries that matter.

Crash tests need to kill a worker at an exact instant, e.g. after a tool
changed the outside world but before its result was recorded. Code calls
``fault_point("name")`` there; it does nothing unless ``$CAIRN_FAULTS`` names
that point, in which case the process SIGKILLs itself: a real death, not an
exception that cleanup code could catch.

``CAIRN_FAULTS="tool.after_effect"`` fires on the first hit,
``"tool.after_effect@3"`` on the third; several points are comma-separated.
The variable is read once, at import, so the check costs one set lookup.
"""

from __future__ import annotations

import os
import signal
import threading

#: The points Cairn defines (documented so tests can name them). The engine's
#: mark what the outside world has seen; the store's (``store.<transition>.*``)
#: mark its commit boundaries: ``before_commit`` dies with the transaction
#: open (it must roll back), ``after_commit`` dies once it is durable but
#: before the caller learns of it.
POINTS = frozenset(
    {
        "step.before_record",  # a step body returned; its result is not yet recorded
        "tool.after_intent",  # the intent is durable; the tool has not run
        "tool.after_effect",  # the tool changed the world; its result is not yet recorded
        "tool.after_record",  # the tool's result is recorded
        "context.after_summary",  # a compaction's summary is recorded; the compaction entry is not yet
        "signal.after_deliver",  # ctx.signal delivered to the other run; the send is not yet recorded
        "transaction.after_body",  # a transactional step's body ran its SQL; nothing of it is committed
        "store.transact.before_append",  # the body returned; its record is not yet appended
        "indexer.after_claim",  # the embedding worker leased outbox rows; nothing is embedded yet
        "indexer.after_embed",  # the vectors are computed; none is stored yet
        "memory.tier_items.mid_move",  # an item's cold copy is written, its hot value not yet cleared
        "retention.delete.before_commit",  # a retention batch's rows are deleted, not yet committed
        "retention.after_batch",  # a retention batch is committed; the pass's next one not yet begun
        "langgraph.after_checkpoint",  # a LangGraph run's root checkpoint is stored; its journal entry is not
        # a LangGraph checkpoint's rows are written, not yet committed (PostgreSQL sends its
        # checkpoint row with the COMMIT, issue 24, 2026-12-07: its values, versions and fold)
        "langgraph.put.before_commit",
        "langgraph.after_writes",  # a LangGraph task's writes are stored; its super-step's checkpoint is not
        "erase.after_shred",  # an erasure destroyed the subject's keys; its rows are not deleted yet
        "archive.stored",  # a run's archive object is stored; nothing in the database names it yet
        "archive.deleted",  # a run's hot rows are deleted in the archiving transaction, not committed
        "archive.restored",  # an archived run's rows are back in the restoring transaction, not committed
        "workspace.import.after_objects",  # a git import's objects are stored; its root is not yet recorded
        *(
            f"store.{transition}.{moment}"
            for transition in ("claim", "finish", "suspend", "start_child", "append", "take_delivery",
                               "deliver", "request_approval", "expire_approval", "fire_schedule", "transact",
                               "store_embeddings")
            for moment in ("before_commit", "after_commit")
        ),
    }
)


def _parse(spec: str) -> dict[str, int]:
    armed: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, nth = item.partition("@")
        if name not in POINTS:
            raise ValueError(f"unknown fault point {name!r} in CAIRN_FAULTS (known: {sorted(POINTS)})")
        armed[name] = int(nth) if nth else 1
    return armed


_ARMED = _parse(os.environ.get("CAIRN_FAULTS", ""))
#: Whether any point is armed in this process: per-step paths test it
#: before calling ``fault_point`` at all (a call costs more than the check).
ARMED = bool(_ARMED)
_hits: dict[str, int] = {}
_lock = threading.Lock()


def arm(spec: str) -> None:
    """Replace this process's fault plan by ``spec`` (``CAIRN_FAULTS``'s
    syntax), its hit counts from zero: for a process forked from one that
    imported Cairn before its plan was known (the crash tests' pre-loaded
    worker parent), where the plan read at import is not the child's."""
    global _ARMED, ARMED
    armed = _parse(spec)
    with _lock:
        _hits.clear()
        _ARMED, ARMED = armed, bool(armed)


def fault_point(name: str) -> None:
    """SIGKILL this process if ``name`` is armed and this is the chosen hit."""
    if not _ARMED or name not in _ARMED:
        return
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        fire = _hits[name] == _ARMED[name]
    if fire:
        os.kill(os.getpid(), signal.SIGKILL)
