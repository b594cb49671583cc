"""Whether a run's starting workspace import finished (``api.wsimport``).

The importer creates the run already held by it (``create_claimed_run``,
worker ``IMPORT_NAME``), stores the tree's objects, then records the root
at ``IMPORT_POSITION``. A crash of the importing process in between leaves
a run whose history shows the importer's claim and no import entry. Such a
run must never run: its first body would find an empty directory where
the user asked for a repository's tree. So the executor fails it, with a
message saying why, before its workflow code is called
(``executor._run_to_end``). Here, not in ``engine.workspace``, because
``engine.execution`` reads it and ``engine.workspace`` imports that.
"""

from __future__ import annotations

from collections.abc import Sequence

from cairn.store.records import EventType, HistoryEvent

#: the journal position of an imported starting workspace (below every call's)
IMPORT_POSITION = -1
#: the name of the import's journal entry and the worker that holds the run while importing
IMPORT_NAME = "workspace.import"


def unfinished_import(history: Sequence[HistoryEvent]) -> bool:
    """Whether the importer claimed the run but never recorded its tree.

    The importer's claim is the run's second entry (``create_claimed_run``
    writes created, claimed, started), so a run not created by an import
    costs a look at three entries: every claim asks."""
    if not any(e.event is EventType.LEASE_CLAIMED and e.worker == IMPORT_NAME for e in history[:3]):
        return False
    return not any(e.event is EventType.STEP_COMPLETED and e.position == IMPORT_POSITION
                   and e.name == IMPORT_NAME for e in history)


__all__ = ["IMPORT_NAME", "IMPORT_POSITION", "unfinished_import"]
