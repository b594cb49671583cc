"""``/api/approvals`` and ``/api/runs/{id}/approvals/...``: the approvals
inbox and its decisions, over the ``Operator`` acting as the token.

The token's identity is the decider: the store checks it against the
request's approvers (``NotAnApprover``: 403) and records it with the
decision. An edit is checked by the Operator against the JSON Schema the run
recorded with its request; one that does not fit answers 422 with the
validation message and stores nothing. A request is decided once (409 after).
Approvals are the tenant's only: another tenant's run answers 404 like an
unknown one, and the inbox lists the token's tenant.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import msgspec

from cairn.api.approvals import NO_EDIT
from cairn.api.tokens import Role
from cairn.api.views import ApprovalOut, approval_json
from cairn.errors import ApprovalNotFound
from cairn.server.routing import Call, Endpoint

Comment = Annotated[str, msgspec.Meta(max_length=4000)]
RunIdFilter = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")]


class Inbox(msgspec.Struct):
    """``pending`` (default): only requests awaiting a decision; ``false``:
    decided, expired and voided ones too. ``run_id``: one run's."""

    pending: bool = True
    run_id: RunIdFilter | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 100


class RunApprovals(msgspec.Struct):
    """``pending: false`` (default here): every request of the run with its decision."""

    pending: bool = False
    limit: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 100


class Approve(msgspec.Struct, forbid_unknown_fields=True):
    """Approve as requested, or give ``edit``: other data, which must fit
    the request's type (its JSON Schema); ``"edit": null`` is an edit to null."""

    comment: Comment | None = None
    edit: Any | msgspec.UnsetType = msgspec.UNSET


class Reject(msgspec.Struct, forbid_unknown_fields=True):
    comment: Comment | None = None


_PLAIN = re.compile(r"^[^\x00-\x1f\x7f]{1,200}$")


def _request_id(call: Call[Any], run_id: str) -> str:
    """The path's request id; one no request could have (control characters,
    too long) is unknown without asking the store (PostgreSQL refuses NUL)."""
    request_id = call.path["request_id"]
    if not _PLAIN.match(request_id):
        raise ApprovalNotFound(run_id, request_id[:200])
    return request_id


class InboxOut(msgspec.Struct, kw_only=True):
    approvals: list[ApprovalOut]


class RunApprovalsOut(msgspec.Struct, kw_only=True):
    run_id: str
    approvals: list[ApprovalOut]


def inbox(call: Call[Any]) -> Any:
    query: Inbox = call.query
    if query.run_id is not None:
        call.run(query.run_id)  # another tenant's run: 404, as everywhere
    found = call.operator.approvals(tenant=call.principal.tenant, run_id=query.run_id, pending=query.pending,
                                    limit=query.limit)
    return {"approvals": [approval_json(v) for v in found]}


def run_approvals(call: Call[Any]) -> Any:
    record = call.run(call.path["run_id"])
    query: RunApprovals = call.query
    found = call.operator.approvals(tenant=record.tenant, run_id=record.run_id, pending=query.pending,
                                    limit=query.limit)
    return {"run_id": record.run_id, "approvals": [approval_json(v) for v in found]}


def show_approval(call: Call[Any]) -> Any:
    record = call.run(call.path["run_id"])
    return approval_json(call.operator.approval(record.run_id, _request_id(call, record.run_id)))


def approve(call: Call[Any]) -> Any:
    record = call.run(call.path["run_id"])
    body: Approve = call.body
    edit = NO_EDIT if body.edit is msgspec.UNSET else body.edit
    return approval_json(call.operator.approve(record.run_id, _request_id(call, record.run_id),
                                               comment=body.comment, edit=edit))


def reject(call: Call[Any]) -> Any:
    record = call.run(call.path["run_id"])
    body: Reject = call.body
    return approval_json(call.operator.reject(record.run_id, _request_id(call, record.run_id),
                                              comment=body.comment))


ONE = "/api/runs/{run_id}/approvals/{request_id}"

ROUTES = [
    Endpoint("GET", "/api/approvals", Role.VIEWER, "The tenant's approval requests (pending by default)",
             inbox, query=Inbox, tag="approvals", response=InboxOut),
    Endpoint("GET", "/api/runs/{run_id}/approvals", Role.VIEWER, "The run's approval requests",
             run_approvals, query=RunApprovals, tag="approvals", response=RunApprovalsOut),
    Endpoint("GET", ONE, Role.VIEWER, "One approval request, decided or not", show_approval, tag="approvals",
             response=ApprovalOut),
    Endpoint("POST", ONE + "/approve", Role.OPERATOR,
             "Approve a request as it is, or with an edit that fits its schema (422 if it does not)",
             approve, body=Approve, tag="approvals", response=ApprovalOut),
    Endpoint("POST", ONE + "/reject", Role.OPERATOR, "Reject a request", reject, body=Reject,
             tag="approvals", response=ApprovalOut),
]
