"""The replay view of a run's history.

Replay runs the workflow function from the top; every journaled call asks the
journal what happened at its position. The journal is derived from the
history (never stored separately), so there is exactly one record of truth.
"""

from __future__ import annotations

from collections.abc import Iterable

from cairn.store.records import EventType, HistoryEvent


class Journal:
    """Final outcomes and retry state of each position, as of one claim."""

    __slots__ = ("outcomes", "retries")

    def __init__(self, history: Iterable[HistoryEvent]) -> None:
        #: position -> the step.completed / step.failed entry that settled it
        self.outcomes: dict[int, HistoryEvent] = {}
        #: position -> the latest step.retried entry (an attempt failed, another is due)
        self.retries: dict[int, HistoryEvent] = {}
        for event in history:
            if event.event is EventType.RUN_RETRIED:
                # An operator retried a failed run: outcomes from the failed
                # position on are void, so the run resumes from its last good step.
                cut = (event.detail or {}).get("from_position")
                if cut is not None:
                    self._forget_from(int(cut))
            elif event.position is None:
                continue
            elif event.event is EventType.STEP_RETRIED:
                self.retries[event.position] = event
            elif event.event in (EventType.STEP_COMPLETED, EventType.STEP_FAILED):
                self.outcomes[event.position] = event

    def _forget_from(self, position: int) -> None:
        for table in (self.outcomes, self.retries):
            for pos in [p for p in table if p >= position]:
                del table[pos]

    def attempts_before(self, position: int) -> int:
        """How many attempts at ``position`` already failed and were retried."""
        retry = self.retries.get(position)
        return retry.attempt or 0 if retry is not None else 0
