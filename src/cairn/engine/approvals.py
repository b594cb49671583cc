"""Approvals: a run asks people to approve, reject or edit, and waits for
them at no cost (``ctx.request_approval``, protected tools).

A request is two journaled calls:

* ``approval`` at position *p*: the request itself. Its outcome records the
  request id (derived from the run id and *p*, like an operation id, so
  every replay and every worker names the same request), the details, the
  approvers and the deadline (computed once, at the first execution), and
  it is written in one fenced transaction with the pending request row
  (``Execution.request_approval``): a crash leaves both or neither.
* ``decision`` at *p + 1*: what was decided. A decision is delivered into
  the run's mailbox (key ``approval:<request id>``) by the same transaction
  that records it on the request row, and the run consumes the message with
  ``Execution.take_delivery``, which records the decision and the decider
  (the message's sender) as this call's outcome in one fenced write. Until
  then the run is suspended waiting for that key, holding no worker; if the
  deadline passes first, the run records an ``expired`` decision in the same
  transaction that marks the row expired, and only if no decision came
  first (``Execution.expire_approval``). So a decision is applied once, or
  not at all, and never lost: it is either in the mailbox or in the journal.

A decision that is recorded is replayed from the journal: the workflow sees
the very same ``Decision`` after any crash.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import msgspec

from cairn.codec import schemas, values
from cairn.engine import credentials
from cairn.engine.approvalmessages import DecisionRecord, RequestRecord, read_decision
from cairn.engine.credentials import SecretParams
from cairn.engine.execution import Execution, operation_id
from cairn.engine.signals import Suspend
from cairn.engine.steps import input_hash
from cairn.errors import (
    ApprovalExpired,
    ApprovalRejected,
    InvalidArgument,
    InvalidEdit,
    PayloadError,
    SecurityViolation,
)
from cairn.security.secrets import Secret, SecretValue, as_ref
from cairn.store.records import ApprovalRequest, ApprovalStatus, Delivery, approval_key

T = TypeVar("T")

#: What ``approval=`` on a tool may be: always, or a policy of the bound arguments.
ApprovalPolicy = bool | Callable[[dict[str, Any]], bool]


class Protected(Protocol):
    """What ``guard`` reads of a tool's definition: its name and signature,
    its approval settings, the type its arguments are approved as, and its
    secret parameters (pinned: a decision may not change what they name).
    ``engine.tools.ToolDef`` is one; named by this Protocol because the tools
    module imports this one (the approval is part of calling a tool)."""

    @property
    def name(self) -> str: ...

    @property
    def call_signature(self) -> inspect.Signature: ...

    @property
    def approval(self) -> ApprovalPolicy | None: ...

    @property
    def approvers(self) -> tuple[str, ...] | None: ...

    @property
    def approval_timeout(self) -> float | None: ...

    @property
    def arguments_type(self) -> Any: ...

    @property
    def secrets(self) -> SecretParams | None: ...


@dataclass(frozen=True, slots=True)
class Decision(Generic[T]):
    """What was decided on an approval request.

    ``status`` is ``approved``, ``edited`` (approved, with other data),
    ``rejected``, or ``expired`` (the request's timeout passed undecided).
    ``data`` is what to act on: the details as requested when approved, the
    edited value when edited (both of the request's type), ``None``
    otherwise. ``decided_by`` is the decider's identity (``cli:ada@host``),
    ``decided_at`` when the decision was stored (``None`` for an expiry)."""

    status: ApprovalStatus
    data: T | None
    request_id: str
    action: str
    decided_by: str | None = None
    decided_at: float | None = None
    comment: str | None = None

    @property
    def approved(self) -> bool:
        """Whether the action may go ahead (approved as requested, or edited)."""
        return self.status in (ApprovalStatus.APPROVED, ApprovalStatus.EDITED)


def request(
    ex: Execution,
    action: str,
    details: Any,
    *,
    timeout: float | None,
    approvers: Sequence[str] | str | None,
    type_: Any,
    pinned: Sequence[str] = (),
) -> Decision[Any]:
    """Ask for approval of ``action`` on ``details``; return the decision,
    or suspend the run until there is one (or until ``timeout`` seconds
    after the first request: an ``expired`` decision). ``pinned``: fields
    of ``details`` an edit must leave as they are (a protected tool's
    secret references: see ``guard``)."""
    kind = type(details) if type_ is None else type_
    return decision(ex, ask(ex, action, details, timeout=timeout, approvers=approvers, type_=type_,
                            pinned=pinned), kind)


def ask(
    ex: Execution,
    action: str,
    details: Any,
    *,
    timeout: float | None,
    approvers: Sequence[str] | str | None,
    type_: Any,
    pinned: Sequence[str] = (),
) -> RequestRecord:
    """The first half of ``request``: the request, recorded (or replayed),
    not waited for. Several requests asked before the first ``decision``
    are all open at once (a LangGraph super-step's parallel interrupts)."""
    if not isinstance(action, str) or not action:
        raise InvalidArgument("an approval's action must be a non-empty string")
    if timeout is not None and not timeout >= 0:
        raise InvalidArgument(f"an approval's timeout must be a number of seconds >= 0, not {timeout!r}")
    who = _approvers(approvers)
    kind = type(details) if type_ is None else type_
    raw = values.encode(details)  # PayloadError: the details cannot be recorded (nothing is)
    values.decode(raw, kind, what=f"the details of approval {action!r} as {schemas.type_name(kind)}")
    plain = msgspec.json.decode(raw)
    call = ex.begin("approval", action, input_hash((), {"details": plain, "approvers": who}))
    if call.recorded is not None:
        made: RequestRecord = ex.replay(call, RequestRecord)
    else:
        schema = _pinning(schemas.schema_of(kind), {name: plain[name] for name in pinned})
        deadline = None if timeout is None else time.time() + timeout
        request_id = operation_id(ex.run_id, call.position, ex.journal.generation(call.position))
        made = RequestRecord(request_id, action, plain, schemas.type_name(kind),
                        None if who is None else list(who), deadline)
        payload = ex.runtime.payloads.wrap(values.encode(made))
        stored = ApprovalRequest(request_id, action, made.type, schema, who, deadline)
        ex.request_approval(call, payload, stored)
    return made


def _pinning(schema: dict[str, Any], fixed: dict[str, Any]) -> dict[str, Any]:
    """``schema``, and each field of ``fixed`` must keep its value (``const``):
    the schema an edit is checked against where the decision is taken."""
    if not fixed:
        return schema
    body = {key: value for key, value in schema.items() if key != "$defs"}
    pinned: dict[str, Any] = {"allOf": [body, {"properties": {name: {"const": value}
                                                             for name, value in fixed.items()}}]}
    if "$defs" in schema:  # references resolve against the root
        pinned["$defs"] = schema["$defs"]
    return pinned


def _approvers(approvers: Sequence[str] | str | None) -> tuple[str, ...] | None:
    if approvers is None:
        return None
    chosen = (approvers,) if isinstance(approvers, str) else tuple(approvers)
    if not chosen or not all(isinstance(a, str) and a for a in chosen):
        raise InvalidArgument("approvers= names who may decide: one or more non-empty identities or "
                              "user names (omit it to let anyone decide)")
    return chosen


def decision(ex: Execution, made: RequestRecord, kind: Any) -> Decision[Any]:
    """The decision on request ``made`` (``ask``) as ``kind``, or suspend the
    run until there is one (or until the request expires)."""
    call = ex.begin("decision", made.request_id)
    if call.recorded is not None:
        return _decision(ex.replay(call, DecisionRecord), kind)
    key = approval_key(made.request_id)
    message = ex.next_delivery(key)
    if message is not None:
        return _take(ex, call, message, made, kind)
    if made.expires_at is not None and time.time() >= made.expires_at:
        expired = DecisionRecord(ApprovalStatus.EXPIRED.value, made.request_id, made.action)
        if ex.expire_approval(call, ex.runtime.payloads.wrap(values.encode(expired)), made.request_id):
            return _decision(expired, kind)
        message = ex.next_delivery(key)  # a decision came first: it is in the mailbox
        if message is not None:
            return _take(ex, call, message, made, kind)
    raise Suspend("approval", wake_at=made.expires_at, waiting_for=key, detail={
        "request_id": made.request_id, "action": made.action,
        "why": f"waiting for a decision on approval request {made.request_id} ({made.action!r})",
    })


def _take(ex: Execution, call: Any, message: Delivery, made: RequestRecord, kind: Any) -> Decision[Any]:
    what = f"the decision on approval request {made.request_id} of run {ex.run_id!r}"
    raw = ex.runtime.payloads.raw(message.payload, what=what) if message.payload is not None else b"{}"
    body = read_decision(raw, what=what)
    status = ApprovalStatus(body.status)
    data = None
    if status is ApprovalStatus.APPROVED:
        data = made.details
    elif status is ApprovalStatus.EDITED:
        data = body.data
        try:  # checked by the decider against the schema; the type itself has the last word
            values.decode(values.encode(data), kind, what=f"the edit of approval {made.action!r}")
        except PayloadError as exc:
            ex.fail_call(call, InvalidEdit(str(exc)), retryable=False, retry_delay=None)
    recorded = DecisionRecord(status.value, made.request_id, made.action, data, message.sender,
                              message.sent_at, body.comment)
    payload = ex.runtime.payloads.wrap(values.encode(recorded))
    ex.take_delivery(call, message, payload, {"request_id": made.request_id, "decision": status.value})
    return _decision(recorded, kind)


def _decision(recorded: DecisionRecord, kind: Any) -> Decision[Any]:
    status = ApprovalStatus(recorded.status)
    data = None
    if recorded.data is not None or status in (ApprovalStatus.APPROVED, ApprovalStatus.EDITED):
        what = f"the data of approval {recorded.action!r}"
        data = values.decode(values.encode(recorded.data), kind, what=what)
    return Decision(status, data, recorded.request_id, recorded.action, recorded.decided_by,
                    recorded.decided_at, recorded.comment)


# -- protected tools ------------------------------------------------------------------------------


def arguments_type(name: str, signature: inspect.Signature, hints: dict[str, Any]) -> Any:
    """The type of a protected tool's arguments, by name (what an edit of
    them must fit): a Struct with one field per parameter, its annotation
    and default; unknown names are refused. ``TypeError`` for a tool whose
    arguments cannot all be named (``*args``, ``**kwargs``, positional-only)."""
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for param in signature.parameters.values():
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            raise TypeError(f"tool {name!r} needs approval, so its arguments are recorded and approved "
                            f"by name: parameter {param.name!r} cannot be (no *args, **kwargs or "
                            "positional-only)")
        annotation = hints.get(param.name, Any)
        if credentials.wants_value(annotation):
            # what is recorded and approved is the reference, never the value (resolved at the call)
            annotation = Secret if annotation is SecretValue else Secret | None
        if param.default is inspect.Parameter.empty:
            fields.append((param.name, annotation))
        else:
            fields.append((param.name, annotation, param.default))
    arguments: Any = msgspec.defstruct(f"{name}_arguments", fields, module="tool", forbid_unknown_fields=True)
    values.decoder_for(arguments)
    return arguments


def guard(
    ex: Execution, d: Protected, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any] | None:
    """For a protected tool: if its policy asks for approval of these
    arguments, request it (suspending until decided) and return the
    arguments to execute, exactly the approved or edited ones, by name; or
    raise ``ApprovalRejected`` / ``ApprovalExpired``. ``None``: no approval
    needed, execute the call as made."""
    bound = d.call_signature.bind(*args, **kwargs)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    policy = d.approval
    if policy is False or policy is None or (policy is not True and not policy(arguments)):
        return None
    pinned = () if d.secrets is None else tuple(sorted(d.secrets.names))
    decision = request(ex, d.name, arguments, timeout=d.approval_timeout, approvers=d.approvers,
                       type_=d.arguments_type, pinned=pinned)
    if decision.status is ApprovalStatus.EXPIRED:
        raise ApprovalExpired(f"tool {d.name!r} was not executed: its approval request {decision.request_id} "
                              "expired undecided", decision)
    if not decision.approved:
        by = f" by {decision.decided_by}" if decision.decided_by else ""
        why = f": {decision.comment}" if decision.comment else ""
        raise ApprovalRejected(f"tool {d.name!r} was not executed: approval request {decision.request_id} "
                               f"was rejected{by}{why}", decision)
    approved: dict[str, Any] = msgspec.structs.asdict(decision.data)  # type: ignore[arg-type]
    for name in pinned:
        # a reference may come as a Secret or in its JSON form: compare what they name
        if as_ref(approved.get(name)) != as_ref(arguments.get(name)):  # past the decider's check: tampering
            raise SecurityViolation(f"the decision on approval request {decision.request_id} of tool "
                                    f"{d.name!r} changed which secret its parameter {name!r} names")
    return approved
