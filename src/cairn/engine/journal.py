"""The replay view of a run's history.

Replay runs the workflow function from the top; every journaled call asks the
journal what happened at its position. The journal is derived from the
history (never stored separately), so there is exactly one record of truth.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cairn.store.records import EventType, HistoryEvent

#: Entries that void the journal from a position on (operator retry, logical rewind).
_CUTS = (EventType.RUN_RETRIED, EventType.RUN_REWOUND)
#: Entries that describe where a side-effecting tool call stands.
_OP_EVENTS = (EventType.OP_INTENT, EventType.OP_RECONCILED, EventType.OP_RESOLVED, EventType.STEP_RETRIED)
#: Entries filed under ``outcomes``, ``retries`` or ``intents`` (what ``end`` follows).
_FILED = (EventType.STEP_COMPLETED, EventType.STEP_FAILED, EventType.STEP_RETRIED, EventType.OP_INTENT)


@dataclass(slots=True)
class Usage:
    """What a run has spent so far, summed from its history (so it is as
    durable as the journal and costs no extra write)."""

    tokens: int = 0
    cost: float = 0.0
    tool_calls: int = 0

    def add_model(self, detail: dict[str, Any] | None) -> None:
        detail = detail or {}
        self.tokens += int((detail.get("usage") or {}).get("total_tokens") or 0)
        self.cost += float(detail.get("cost") or 0.0)


class Journal:
    """Final outcomes, retry and side-effect state of each position."""

    __slots__ = ("end", "freed", "intents", "op_state", "outcomes", "retries", "rewinds", "takes", "usage")

    def __init__(self, history: Iterable[HistoryEvent]) -> None:
        #: position -> the step.completed / step.failed entry that settled it
        self.outcomes: dict[int, HistoryEvent] = {}
        #: position -> the latest step.retried entry (an attempt failed, another is due)
        self.retries: dict[int, HistoryEvent] = {}
        #: position -> the latest op.* / step.retried entry of a side-effecting tool
        self.op_state: dict[int, HistoryEvent] = {}
        #: position -> the latest op.intent (what was about to be sent, and with what)
        self.intents: dict[int, HistoryEvent] = {}
        #: details of every logical rewind, oldest first
        self.rewinds: list[dict[str, Any]] = []
        self.usage = Usage()
        #: position -> (wait key, seq) of the mailbox message its live outcome consumed
        self.takes: dict[int, tuple[str, int]] = {}
        #: wait key -> seqs of messages consumed by entries since voided (a
        #: retry, a rewind): available again, before any message not yet taken
        #: (``Execution.next_delivery``). Kept here so a receive need not read
        #: the key's whole mailbox to find them.
        self.freed: dict[str, set[int]] = {}
        #: one past the highest position with an outcome, an intent or a
        #: retry: a call from here on is new (``Execution.begin``'s fast path)
        self.end = 0
        for event in history:
            self.record(event)

    def record(self, event: HistoryEvent) -> None:
        """Take ``event`` into account (replayed history, or a live append)."""
        kind = event.event
        position = event.position
        if kind is EventType.STEP_COMPLETED and position is not None:
            kind_of_step = event.step_kind
            if kind_of_step == "step":
                # the common entry (a step's outcome), which the rules below would
                # only file under ``outcomes``: taken first, it costs a fifth
                if self.takes:
                    self._untake(position)
                self.outcomes[position] = event
                if position >= self.end:
                    self.end = position + 1
                return
            if kind_of_step == "tool":  # a tool's result: what the rules below do for it, in short
                if self.takes:
                    self._untake(position)
                self.outcomes[position] = event
                self.usage.tool_calls += 1
                if position >= self.end:
                    self.end = position + 1
                return
        elif kind is EventType.OP_INTENT and position is not None:
            # every side-effecting call's intent: what the rules below do for it, in short
            self.op_state[position] = event
            self.intents[position] = event
            if position >= self.end:
                self.end = position + 1
            return
        if kind in _CUTS:
            # Outcomes from the cut position on are void, so the run resumes
            # from its last good step (operator retry) or its rewind target.
            detail = event.detail or {}
            cut = detail.get("from_position")
            if cut is not None:
                self._forget_from(int(cut))
            if kind is EventType.RUN_REWOUND:
                self.rewinds.append(detail)
            return
        if position is None:
            return
        self._count(event)
        if kind in (EventType.STEP_COMPLETED, EventType.STEP_FAILED):
            if self.takes:
                self._untake(position)
            self.outcomes[position] = event
            self._take(position, event.detail)
        if kind is EventType.STEP_RETRIED:
            self.retries[position] = event
        if kind in _OP_EVENTS:
            self.op_state[position] = event
        if kind is EventType.OP_INTENT:
            self.intents[position] = event
        if kind in _FILED and position >= self.end:
            self.end = position + 1

    def _count(self, event: HistoryEvent) -> None:
        if event.step_kind == "model" and event.event is EventType.STEP_COMPLETED:
            self.usage.add_model(event.detail)
        elif event.step_kind == "tool" and event.event in (
            EventType.STEP_COMPLETED,
            EventType.STEP_FAILED,
            EventType.STEP_RETRIED,
        ):
            self.usage.tool_calls += 1

    def _take(self, position: int, detail: dict[str, Any] | None) -> None:
        """The outcome at ``position`` consumed a mailbox message (its detail
        names it: ``Execution.take_delivery``)."""
        if not detail or "delivery" not in detail:
            return
        key, seq = str(detail.get("key")), int(detail["delivery"])
        self.takes[position] = (key, seq)
        freed = self.freed.get(key)
        if freed is not None:
            freed.discard(seq)
            if not freed:
                del self.freed[key]

    def _untake(self, position: int) -> None:
        """The outcome at ``position`` is void or replaced: the message it
        consumed, if any, is free again."""
        taken = self.takes.pop(position, None)
        if taken is not None:
            self.freed.setdefault(taken[0], set()).add(taken[1])

    def first_freed(self, key: str) -> int | None:
        """The oldest message for ``key`` that a voided entry had consumed."""
        freed = self.freed.get(key)
        return min(freed) if freed else None

    def _forget_from(self, position: int) -> None:
        for taken in [p for p in self.takes if p >= position]:
            self._untake(taken)
        for table in (self.outcomes, self.retries, self.op_state, self.intents):
            for pos in [p for p in table if p >= position]:
                del table[pos]
        self.end = max(self.outcomes.keys() | self.intents.keys() | self.retries.keys(), default=-1) + 1

    def generation(self, position: int) -> int:
        """How many logical rewinds voided ``position``: each re-executes it as
        a new intended effect (see ``operation_id``). A rewind that cut later
        than ``position`` did not touch it, so the count of a recorded call
        never changes afterwards: stable across crashes and retries."""
        if not self.rewinds:  # nearly every run: asked once per step
            return 0
        return sum(1 for rewind in self.rewinds if int(rewind.get("from_position", position + 1)) <= position)

    def attempts_before(self, position: int) -> int:
        """How many attempts at ``position`` already failed and were retried."""
        retry = self.retries.get(position)
        return retry.attempt or 0 if retry is not None else 0

    def uncertain(self, position: int) -> HistoryEvent | None:
        """The entry that leaves the side effect at ``position`` uncertain: an
        intent (or a reconciliation that did not settle it) with no outcome."""
        state = self.op_state.get(position)
        if state is None or position in self.outcomes:
            return None
        if state.event is EventType.OP_INTENT:
            return state
        if state.event is EventType.OP_RECONCILED and (state.detail or {}).get("outcome") != "done":
            return state
        return None
