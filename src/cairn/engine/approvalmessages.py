"""The three messages of an approval, written and read here only.

* ``RequestRecord``: what a run asked (the recorded outcome of its
  ``approval`` call, also stored as the request row's payload, so the inbox
  shows exactly what the run will act on).
* ``DecisionMessage``: what a decider delivers into the run's mailbox
  (the sender and the time are the message's own, never in the body).
* ``DecisionRecord``: what the run recorded once it took the decision (the
  outcome of its ``decision`` call, what replay rebuilds the ``Decision`` from).

The engine writes and reads them (``engine.approvals``), the operator writes
decisions and the views read requests and decisions (``cairn.api``): all
through these types and functions, never by a key of a decoded dict, so a
field renamed here is renamed everywhere, and mypy sees every reader.
"""

from __future__ import annotations

from typing import Any

import msgspec

from cairn.codec import values
from cairn.store.records import ApprovalStatus


class RequestRecord(msgspec.Struct, frozen=True):
    """An approval request: its id, the action, the details (plain JSON),
    the name of the type an edit must fit, who may decide, until when."""

    request_id: str
    action: str
    details: Any
    type: str
    approvers: list[str] | None = None
    expires_at: float | None = None


class DecisionMessage(msgspec.Struct, frozen=True):
    """A decision as delivered: ``status`` (an ``ApprovalStatus`` value), the
    comment and, for an edit, the edited data (plain JSON)."""

    status: str
    comment: str | None = None
    data: Any = None

    @property
    def edited(self) -> Any:
        """The edited data; ``None`` unless the decision is an edit."""
        return self.data if self.status == ApprovalStatus.EDITED.value else None


class DecisionRecord(msgspec.Struct, frozen=True):
    """A decision as the run recorded it: the delivered status, comment and
    data (the details as requested when approved) with who decided and when
    (``None`` for an expiry, which no one decided)."""

    status: str
    request_id: str
    action: str
    data: Any = None
    decided_by: str | None = None
    decided_at: float | None = None
    comment: str | None = None


def decision_message(status: ApprovalStatus, comment: str | None, edited: Any = None) -> bytes:
    """The body a decision delivers to the run (``edited`` only kept for an edit:
    an approval as requested carries no data, the run has the details)."""
    data = edited if status is ApprovalStatus.EDITED else None
    return values.encode(DecisionMessage(status.value, comment, data))


def read_request(data: bytes, *, what: str) -> RequestRecord:
    """A stored request (``PayloadError`` naming ``what`` if it is not one)."""
    found: RequestRecord = values.decode(data, RequestRecord, what=what)
    return found


def read_decision(data: bytes, *, what: str) -> DecisionMessage:
    """A delivered decision (``PayloadError`` naming ``what`` if it is not one)."""
    found: DecisionMessage = values.decode(data, DecisionMessage, what=what)
    return found


__all__ = ["DecisionMessage", "DecisionRecord", "RequestRecord", "decision_message", "read_decision",
           "read_request"]
