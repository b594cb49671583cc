"""Approval requests as people and programs read them (``cairn approvals``,
``app.approvals()``): typed, decoded views of the stored requests.

The store keeps a request's details in the journal entry that made it and
its decision in the mailbox message that delivered it; a view puts them back
together, decoded through the codec (never read from the store directly), so
that what a decider is shown is exactly what the run recorded and will act on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cairn.codec.payloads import PayloadCodec
from cairn.engine.approvalmessages import read_decision, read_request
from cairn.errors import PayloadError
from cairn.store.records import Approval, ApprovalStatus, RunStatus


class _NoEdit:
    """``approve(..., edit=NO_EDIT)``: approve the details as requested
    (``None`` is a value one may edit to)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NO_EDIT"


NO_EDIT: Any = _NoEdit()


@dataclass(frozen=True, slots=True)
class ApprovalView:
    """One approval request: what is asked (``action``, ``details`` as
    plain JSON, the type an edit must fit), who may decide, until when, and
    where it stands (``status``; once decided: who, when, the comment and,
    for an edit, ``edited``)."""

    run_id: str
    request_id: str
    tenant: str
    action: str
    details: Any
    type_name: str
    approvers: tuple[str, ...] | None
    requested_at: float
    expires_at: float | None
    status: ApprovalStatus
    run_status: RunStatus
    position: int
    decided_by: str | None = None
    decided_at: float | None = None
    comment: str | None = None
    edited: Any = None

    @property
    def pending(self) -> bool:
        """Whether it still awaits a decision: pending, and its run not finished."""
        return self.status is ApprovalStatus.PENDING and not self.run_status.terminal


def view(codec: PayloadCodec, approval: Approval) -> ApprovalView:
    """Decode ``approval``'s request and decision payloads into a view
    (``engine.approvalmessages``: the readers the engine's own). A payload
    that cannot be read shows as ``{"unreadable": why}``: a listing must not
    fail for one damaged row."""
    details: Any = None
    if approval.request is not None:
        what = f"approval request {approval.request_id}"
        try:
            details = read_request(codec.raw(approval.request, what=what), what=what).details
        except PayloadError as exc:
            details = {"unreadable": str(exc)}
    edited: Any = None
    if approval.decision is not None and approval.status is ApprovalStatus.EDITED:
        what = f"the decision on approval request {approval.request_id}"
        try:
            edited = read_decision(codec.raw(approval.decision, what=what), what=what).edited
        except PayloadError as exc:
            edited = {"unreadable": str(exc)}
    return ApprovalView(
        run_id=approval.run_id, request_id=approval.request_id, tenant=approval.tenant,
        action=approval.action,
        details=details, type_name=approval.type_name, approvers=approval.approvers,
        requested_at=approval.requested_at, expires_at=approval.expires_at, status=approval.status,
        run_status=approval.run_status, position=approval.position, decided_by=approval.decided_by,
        decided_at=approval.decided_at, comment=approval.comment, edited=edited,
    )
