"""The operation ledger: where each side-effecting tool call of a run stands.

A run's history says everything about its tool calls (intents, results,
reconciliations, operator resolutions), but in entries spread over many
event kinds. This module is the one place that reads them as a ledger: a
typed ``OperationView`` per call, the list of uncertain positions, and what
an operator's "done" / "not done" becomes in the history. ``App``, the
operator façade and ``cairn ops`` all use it, so a rule about what
"uncertain" or "resolved" means exists once.

It builds on the replay ``Journal`` (which decides what replay does) and
adds only what an operator needs to see: arguments, how a call was settled
and by whom.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cairn.codec.payloads import PayloadCodec
from cairn.engine.execution import operation_id
from cairn.engine.journal import Journal
from cairn.errors import InvalidRunState, PayloadError
from cairn.store.records import EventType, HistoryEvent, Payload, RunRecord, RunStatus


class OpStatus(enum.StrEnum):
    """Where a side effect stands."""

    DONE = "done"  #: its result is recorded
    FAILED = "failed"  #: it failed for good
    UNCERTAIN = "uncertain"  #: an intent (or an unsettled reconciliation) and no result
    PENDING = "pending"  #: a retry, a reconciliation or a re-execution is scheduled


class Settled(enum.StrEnum):
    """How a call was settled when the tool itself did not say."""

    RECONCILED_DONE = "reconciled_done"  #: its reconcile function found it applied
    RECONCILED_NOT_FOUND = "reconciled_not_found"  #: ... found it absent: executed again
    OPERATOR_DONE = "operator_done"  #: an operator recorded its result
    OPERATOR_NOT_DONE = "operator_not_done"  #: an operator said it did not happen: executed again


@dataclass(frozen=True, slots=True)
class Resolution:
    """The latest settlement of a call: how, by whom (``None``: the engine,
    or an operator before actors were recorded), and when."""

    how: Settled
    actor: str | None
    at: float


@dataclass(frozen=True, slots=True)
class Decoded:
    """A payload decoded as plain JSON, or why it could not be: one
    unreadable value must not hide the rest of a run."""

    value: Any = None
    error: str | None = None


def decode(codec: PayloadCodec, payload: Payload | None, what: str = "payload") -> Decoded:
    """Decode a stored payload (inline or artifact) as plain JSON, never into
    user types: inspection must work without the workflow code and must not
    trust stored bytes with anything but a JSON parser."""
    if payload is None:
        return Decoded(None)
    try:
        return Decoded(codec.load(payload, Any, what=what))
    except PayloadError as exc:
        return Decoded(error=str(exc))


@dataclass(frozen=True, slots=True)
class OperationView:
    """One tool call of a run, as an operator sees it."""

    position: int
    tool: str
    #: the declared effect (``read``/``idempotent``/``write``); ``None`` for a
    #: call that recorded no intent (its effect is not in the history)
    effect: str | None
    status: OpStatus
    operation_id: str
    #: the number of the latest attempt at this position (1: the first), as
    #: its journal entries count them (``HistoryEvent.attempt``)
    attempt: int
    #: what the latest intent was about to send; ``None`` without an intent
    arguments: Decoded | None
    resolution: Resolution | None
    #: the kind of the latest entry at this position
    last_event: EventType
    #: why it needs an operator, when the run says so (``run.needs_attention``)
    why: str | None = None

    @property
    def uncertain(self) -> bool:
        return self.status is OpStatus.UNCERTAIN


class _LedgerJournal(Journal):
    """The replay journal, plus the latest settlement entry of each position
    (forgotten at a cut, exactly as the journal forgets outcomes)."""

    __slots__ = ("attention", "settlements")

    def __init__(self, history: Iterable[HistoryEvent]) -> None:
        self.settlements: dict[int, HistoryEvent] = {}
        #: position -> detail of the latest ``run.needs_attention`` naming it
        self.attention: dict[int, dict[str, Any]] = {}
        super().__init__(history)

    def record(self, event: HistoryEvent) -> None:
        super().record(event)
        kind = event.event
        detail = event.detail or {}
        if kind in (EventType.RUN_RETRIED, EventType.RUN_REWOUND):
            cut = detail.get("from_position")
            if cut is not None:
                for table in (self.settlements, self.attention):
                    for pos in [p for p in table if p >= int(cut)]:
                        del table[pos]
        elif kind is EventType.RUN_NEEDS_ATTENTION and isinstance(detail.get("position"), int):
            self.attention[int(detail["position"])] = detail
        elif event.position is not None and _settlement(event) is not None:
            self.settlements[event.position] = event


def _settlement(event: HistoryEvent) -> Settled | None:
    detail = event.detail or {}
    if event.event is EventType.STEP_COMPLETED:
        if detail.get("resolved_by") == "operator":
            return Settled.OPERATOR_DONE
        if detail.get("reconciled") == "done":
            return Settled.RECONCILED_DONE
    elif event.event is EventType.OP_RECONCILED and detail.get("outcome") == "not_found":
        return Settled.RECONCILED_NOT_FOUND
    elif event.event is EventType.OP_RESOLVED:
        return Settled.OPERATOR_NOT_DONE
    return None


def _status(journal: Journal, position: int) -> OpStatus:
    outcome = journal.outcomes.get(position)
    if outcome is not None:
        return OpStatus.DONE if outcome.event is EventType.STEP_COMPLETED else OpStatus.FAILED
    if journal.uncertain(position) is not None:
        return OpStatus.UNCERTAIN
    return OpStatus.PENDING


class Ledger:
    """The tool calls of one run, read from its history."""

    def __init__(self, run_id: str, history: Iterable[HistoryEvent]) -> None:
        self.run_id = run_id
        self.journal = _LedgerJournal(history)

    def uncertain_positions(self) -> list[int]:
        """Positions whose side effect may or may not have happened."""
        journal = self.journal
        return sorted(p for p in journal.op_state if journal.uncertain(p) is not None)

    def views(self, codec: PayloadCodec) -> list[OperationView]:
        """Every tool call of the run, by position: those that recorded an
        intent or a retry (side effects), and tools that completed or failed
        without one (reads). Arguments are decoded through ``codec``."""
        journal = self.journal
        positions = set(journal.op_state) | {
            p for p, outcome in journal.outcomes.items() if outcome.step_kind == "tool"}
        return [self._view(position, codec) for position in sorted(positions)]

    def view(self, position: int, codec: PayloadCodec) -> OperationView | None:
        """The tool call at ``position``, if the run made one there."""
        journal = self.journal
        outcome = journal.outcomes.get(position)
        if position in journal.op_state or (outcome is not None and outcome.step_kind == "tool"):
            return self._view(position, codec)
        return None

    def _view(self, position: int, codec: PayloadCodec) -> OperationView:
        journal = self.journal
        state = journal.op_state.get(position)
        outcome = journal.outcomes.get(position)
        # The latest entry: the outcome if there is one (it settles the call), else the op state.
        last = outcome if outcome is not None else state
        assert last is not None
        intent = journal.intents.get(position)
        detail = (state.detail if state is not None else None) or {}
        settled = journal.settlements.get(position)
        resolution = None
        if settled is not None:
            how = _settlement(settled)
            assert how is not None
            resolution = Resolution(how, (settled.detail or {}).get("actor"), settled.at)
        status = _status(journal, position)
        why = journal.attention.get(position, {}).get("why") if status is OpStatus.UNCERTAIN else None
        return OperationView(
            position=position,
            tool=(state.name if state is not None else last.name) or "?",
            effect=(intent.detail or {}).get("effect") if intent is not None else None,
            status=status,
            operation_id=str(detail.get("operation_id")
                             or operation_id(self.run_id, position, journal.generation(position))),
            attempt=last.attempt or 1,
            arguments=decode(codec, intent.payload, f"arguments of #{position} of run {self.run_id!r}")
            if intent is not None else None,
            resolution=resolution,
            last_event=last.event,
            why=why,
        )


def operations(run_id: str, history: Iterable[HistoryEvent], codec: PayloadCodec) -> list[OperationView]:
    """Every tool call of run ``run_id``, read from its ``history``."""
    return Ledger(run_id, history).views(codec)


@dataclass(frozen=True, slots=True)
class ResolutionRequest:
    """What an operator's answer about an uncertain call becomes: the
    arguments of ``Store.resolve_operation``."""

    position: int
    done: bool
    #: the tool's result to record (``done`` only)
    result: Payload | None
    detail: dict[str, Any]


def resolution_request(
    run: RunRecord, ledger: Ledger, position: int, *, done: bool, result: Payload | None
) -> ResolutionRequest:
    """Check that the call at ``position`` waits for an operator and say what
    resolving it records.

    A call waits for an operator when it is uncertain in a run that needs
    attention: in any other run an uncertain call is the engine's to settle
    (reconcile, or wait for the claim that will). The store checks the run's
    status again, atomically with the change; this reading only decides
    which message explains a refusal."""
    uncertain = ledger.uncertain_positions() if run.status is RunStatus.NEEDS_ATTENTION else []
    if not uncertain:
        raise InvalidRunState(f"run {run.run_id!r} is {run.status.value}; it has no operation to resolve")
    if position not in uncertain:
        raise InvalidRunState(f"operation at position {position} of run {run.run_id!r} is not uncertain "
                              f"(uncertain positions: {uncertain})")
    journal = ledger.journal
    tool = journal.op_state[position].name
    intent = journal.intents.get(position)
    recorded = (intent.detail or {}).get("operation_id") if intent is not None else None
    detail = {"name": tool, "step_kind": "tool",
              "operation_id": recorded or operation_id(run.run_id, position, journal.generation(position))}
    return ResolutionRequest(position, done, result if done else None, detail)
