"""Every object as JSON, in one shape for ``cairn ... --json``, the HTTP API
(and its OpenAPI document) and the dashboard: a run, a run in detail, a
history entry, a journal entry, a tool call (operation), an approval
request, a model call. A script that reads one reads the other.

Payloads are read through the payload codec (so encryption at rest applies)
and decoded as plain JSON, never into user types (``api.ledger.decode``):
neither the CLI nor the server needs workflow code to show a run, and stored
bytes are trusted with nothing but a JSON parser. A value that cannot be
decoded is shown as its error, so one damaged entry hides nothing else.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Protocol

import msgspec
from msgspec import UNSET, UnsetType

from cairn.api.approvals import ApprovalView
from cairn.api.ledger import Decoded, OperationView, OpStatus, Settled, decode
from cairn.api.operator import Operator, RunOperations
from cairn.codec.payloads import PayloadCodec
from cairn.engine import modelcalls
from cairn.errors import CairnError, StoreError
from cairn.graph import diff as diffs
from cairn.graph.diff import Change
from cairn.graph.reader import Checkpoint
from cairn.graph.travel import lineage_of
from cairn.models.base import ModelRecord
from cairn.store.records import JOURNAL_EVENTS, ApprovalStatus, EventType, HistoryEvent, RunRecord, RunStatus

#: Model calls of a history rebuilt as sent and received, by ``seq``: each
#: entry stores only the messages its run had not journaled yet, so it is
#: shown through ``modelcalls.records``, never as the compact entry.
ModelCalls = dict[int, Decoded]


# -- the shapes -------------------------------------------------------------------------------
# Each object is a msgspec Struct, built here and nowhere else; ``*_json`` turns it into plain JSON
# values. The OpenAPI document takes its schemas from the same Structs (``Endpoint(response=...)``),
# so the document cannot drift from what is answered. (A history entry, the one object answered by
# the thousand, is built as its dict directly: see ``event_json``.) A field that is only sometimes there is
# ``UNSET`` (left out), never ``None`` (which is a value: a step may return null).


class RunOut(msgspec.Struct, kw_only=True):
    """A run's fields, without its payloads (times as Unix seconds, like the store)."""

    run_id: str
    workflow: str
    version: str
    status: RunStatus
    tenant: str
    thread_id: str | None
    queue: str
    priority: int
    parent_run_id: str | None
    owner: str | None
    epoch: int
    recoveries: int
    lease_expires_at: float | None
    wake_at: float | None
    waiting_on: str | None
    waiting_for: str | None
    error: dict[str, Any] | None
    budget: dict[str, Any] | None
    created_at: float
    updated_at: float


class UsageOut(msgspec.Struct, kw_only=True):
    """What a run has spent (summed by the store)."""

    tokens: int
    cost: float
    tool_calls: int


class JournalEntryOut(msgspec.Struct, kw_only=True):
    """One attempt recorded in a run's journal (``status``: completed,
    failed, retried, intent, reconciled, resolved); ``result`` for a
    completed one, ``arguments`` for a side effect's intent, each with
    ``*_error`` when it cannot be decoded."""

    position: int
    kind: str | None
    name: str | None
    attempt: int | None
    status: str
    worker: str | None
    duration_ms: float | None
    result: Any | UnsetType = UNSET
    result_error: str | UnsetType = UNSET
    arguments: Any | UnsetType = UNSET
    arguments_error: str | UnsetType = UNSET
    detail: dict[str, Any] | UnsetType = UNSET


class ApprovalOut(msgspec.Struct, kw_only=True):
    """One approval request: what is asked, who may decide, until when,
    where it stands (``pending``: still awaiting a decision, its run not
    finished) and, once decided, by whom, when, why and (an edit) ``edited``."""

    run_id: str
    request_id: str
    tenant: str
    action: str
    details: Any
    type: str
    approvers: list[str] | None
    requested_at: float
    expires_at: float | None
    status: ApprovalStatus
    run_status: RunStatus
    position: int
    decided_by: str | None
    decided_at: float | None
    comment: str | None
    edited: Any
    pending: bool


class LineageOut(msgspec.Struct, kw_only=True):
    """Where a run was replayed (``edited: false``) or forked (``true``)
    from: super-step ``step`` of run ``run_id``."""

    run_id: str
    step: int
    edited: bool


class RunDetailOut(RunOut, kw_only=True):
    """A run with its input, result, usage, bundle, what it waits for and,
    when asked (``cairn show --json`` always; the API with ``?journal=true``),
    its journal. ``attention``: the detail of its latest ``run.needs_attention``
    entry while it needs attention; ``approvals``: the requests it awaits;
    ``waiting``: why a runnable run is not running, when no worker serves its
    bundle."""

    bundle: str | None
    input: Any
    input_error: str | UnsetType = UNSET
    result: Any
    result_error: str | UnsetType = UNSET
    usage: UsageOut
    history_length: int
    attention: dict[str, Any] | None
    approvals: list[ApprovalOut]
    waiting: str | None
    journal: list[JournalEntryOut] | UnsetType = UNSET
    #: a graph run's replay or fork: where it comes from
    forked_from: LineageOut | UnsetType = UNSET
    #: the token role and token id it was started with, from its row: what
    #: tools restricted by role (``cairn.ToolAccess(role=...)``) allow it,
    #: wherever it runs (``null``: started without a token role)
    started_role: str | None
    started_token: str | None
    #: who started it, as its ``run.created`` entry records (actor, how
    #: authenticated, tenant, role); ``null`` for a run older than that record
    started_by: dict[str, Any] | None


class EventOut(msgspec.Struct, kw_only=True):
    """One history entry. A journal entry (one with a ``position``) has its
    kind, name, attempt and start; an entry with a payload has its
    ``result`` (``arguments`` for an ``op.intent``), with ``*_error`` when
    it cannot be decoded; ``detail`` as recorded."""

    seq: int
    event: EventType
    at: float
    epoch: int
    worker: str | None
    position: int | UnsetType = UNSET
    kind: str | UnsetType | None = UNSET
    name: str | UnsetType | None = UNSET
    attempt: int | UnsetType | None = UNSET
    started_at: float | UnsetType | None = UNSET
    arguments: Any | UnsetType = UNSET
    arguments_error: str | UnsetType = UNSET
    result: Any | UnsetType = UNSET
    result_error: str | UnsetType = UNSET
    detail: dict[str, Any] | UnsetType = UNSET


class ResolutionOut(msgspec.Struct, kw_only=True):
    """How a tool call was last settled when the tool did not say, by whom, when."""

    how: Settled
    actor: str | None
    at: float


class OperationOut(msgspec.Struct, kw_only=True):
    """One tool call of a run and where it stands. ``attempt``: the number
    of the latest attempt at its position (1: the first); ``arguments``: what
    its latest intent was about to send (null without an intent, so for
    a read tool)."""

    position: int
    tool: str
    effect: str | None
    status: OpStatus
    operation_id: str
    attempt: int
    last_event: EventType
    why: str | None
    uncertain: bool
    resolution: ResolutionOut | None
    arguments: Any
    arguments_error: str | UnsetType = UNSET


class ResolveCommandsOut(msgspec.Struct, kw_only=True):
    """The shell commands that settle an uncertain call (``cairn ops --json``)."""

    position: int
    done: str
    not_done: str


class OperationsOut(msgspec.Struct, kw_only=True):
    """A run's tool calls; ``needs_resolution``: the positions an operator
    must settle; ``resolve`` (``cairn ops --json`` only): the commands that do."""

    run_id: str
    status: RunStatus
    operations: list[OperationOut]
    needs_resolution: list[int]
    resolve: list[ResolveCommandsOut] | UnsetType = UNSET


def plain(shape: msgspec.Struct) -> dict[str, Any]:
    """A shape as plain JSON values (what the CLI prints and the API answers)."""
    out: dict[str, Any] = msgspec.to_builtins(shape)
    return out


def run_of(record: RunRecord) -> RunOut:
    return RunOut(**_run_fields(record))


def _run_fields(record: RunRecord) -> dict[str, Any]:
    return {
        "run_id": record.run_id, "workflow": record.workflow, "version": record.workflow_version,
        "status": record.status, "tenant": record.tenant, "thread_id": record.thread_id,
        "queue": record.queue, "priority": record.priority, "parent_run_id": record.parent_run_id,
        "owner": record.owner, "epoch": record.epoch, "recoveries": record.recoveries,
        "lease_expires_at": record.lease_expires_at, "wake_at": record.wake_at,
        "waiting_on": record.waiting_on, "waiting_for": record.waiting_for, "error": record.error,
        "budget": record.budget, "created_at": record.created_at, "updated_at": record.updated_at,
    }


def run_json(record: RunRecord) -> dict[str, Any]:
    """A run's fields, without its payloads (``cairn runs --json``, ``GET /api/runs``)."""
    return plain(run_of(record))


def model_records(codec: PayloadCodec, history: list[HistoryEvent]) -> dict[int, ModelRecord] | str:
    """The run's model calls rebuilt, by ``seq``, or why they cannot be (a
    damaged entry must not hide the rest of the run)."""
    if not any(e.step_kind == "model" for e in history):
        return {}
    try:
        return modelcalls.records(history, codec)
    except (CairnError, ValueError) as exc:
        return f"cannot rebuild model calls: {exc}"


def model_calls(codec: PayloadCodec, history: list[HistoryEvent]) -> ModelCalls:
    """``model_records`` as decoded values (the error on each model call's entry)."""
    records = model_records(codec, history)
    if isinstance(records, str):
        return {e.seq: Decoded(error=records) for e in history
                if e.step_kind == "model" and e.event is EventType.STEP_COMPLETED}
    return {seq: Decoded(msgspec.to_builtins(record)) for seq, record in records.items()}


class Reads(Protocol):
    """The reads of one run's journal a page of model calls needs (``App``)."""

    def history(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[HistoryEvent]: ...

    def history_at(self, run_id: str, seqs: Collection[int]) -> list[HistoryEvent]: ...


def model_records_of(reads: Reads, codec: PayloadCodec, run_id: str,
                     entries: Sequence[HistoryEvent]) -> dict[int, ModelRecord] | str:
    """The model calls among ``entries`` (a page of ``run_id``'s history),
    rebuilt from the entries they name as needed, read by seq: a page deep
    in a long run reads about as much as it shows, not the journal before
    it. Entries written before they named their needs are rebuilt from the
    journal's start, as before. An error names why they cannot be."""
    calls = [e for e in entries if modelcalls.is_model_call(e)]
    if not calls:
        return {}
    try:
        needed = modelcalls.needs(calls, codec)
        if needed is None:
            found = modelcalls.records(reads.history(run_id, 0, max(e.seq for e in calls)), codec)
        else:
            have = {e.seq for e in calls}
            found = modelcalls.rebuild_some(calls, reads.history_at(run_id, needed - have), codec)
    except (CairnError, ValueError) as exc:
        return f"cannot rebuild model calls: {exc}"
    return {e.seq: found[e.seq] for e in calls if e.seq in found}


def model_calls_of(reads: Reads, codec: PayloadCodec, run_id: str,
                   entries: Sequence[HistoryEvent]) -> ModelCalls:
    """``model_records_of`` as decoded values (the error on each model call's entry)."""
    records = model_records_of(reads, codec, run_id, entries)
    if isinstance(records, str):
        return {e.seq: Decoded(error=records) for e in entries if modelcalls.is_model_call(e)}
    return {seq: Decoded(msgspec.to_builtins(record)) for seq, record in records.items()}


def result_of(codec: PayloadCodec, event: HistoryEvent, models: ModelCalls) -> Decoded:
    """What a journal entry recorded: a model call rebuilt, anything else decoded."""
    found = models.get(event.seq)
    return found if found is not None else decode(codec, event.payload)


def put_decoded(decoded: Decoded, out: dict[str, Any], key: str) -> None:
    """``out[key]`` is the value, and ``out[key + "_error"]`` why it is missing."""
    out[key] = decoded.value
    if decoded.error is not None:
        out[f"{key}_error"] = decoded.error


def _decoded(decoded: Decoded, key: str) -> dict[str, Any]:
    """A decoded value as the fields of a shape: ``key``, and ``key_error`` when it could not be."""
    out: dict[str, Any] = {}
    put_decoded(decoded, out, key)
    return out


# -- history entries ------------------------------------------------------------------------------


def event_json(codec: PayloadCodec, event: HistoryEvent, models: ModelCalls | None = None) -> dict[str, Any]:
    """One history entry (``cairn events --json``, the API's journal pages and
    event streams), in the shape of ``EventOut``. Built as a dict, not through
    the struct: pages of a thousand entries and every stream event pass here,
    and ``to_builtins`` would copy each decoded payload once more (a 1,000-entry
    page took about a third longer, on a busy machine); ``tests/server/test_shapes.py``
    validates real pages against ``EventOut``'s schema."""
    out: dict[str, Any] = {"seq": event.seq, "event": event.event.value, "at": event.at, "epoch": event.epoch,
                           "worker": event.worker}
    if event.position is not None:
        out.update(position=event.position, kind=event.step_kind, name=event.name, attempt=event.attempt,
                   started_at=event.started_at)
    if event.payload is not None:
        key = "arguments" if event.event is EventType.OP_INTENT else "result"
        put_decoded(result_of(codec, event, models or {}), out, key)
    if event.detail is not None:
        out["detail"] = event.detail
    return out


_JOURNAL_STATUS = {
    EventType.STEP_COMPLETED: "completed",
    EventType.STEP_FAILED: "failed",
    EventType.STEP_RETRIED: "retried",
}


def journal_status(event: HistoryEvent) -> str:
    """``completed``/``failed``/``retried``, or the last word of any other journal event."""
    return _JOURNAL_STATUS.get(event.event, event.event.value.rsplit(".", 1)[-1])


def _settled_for_the_tool(event: HistoryEvent) -> bool:
    """A result the tool did not return: recorded by an operator, or found by reconciling."""
    detail = event.detail or {}
    return detail.get("resolved_by") == "operator" or detail.get("reconciled") == "done"


def journal_entry(codec: PayloadCodec, event: HistoryEvent, models: ModelCalls) -> JournalEntryOut:
    """One journal entry of ``cairn show``: its detail only where it says
    something (a completed step's detail is its bookkeeping, unless it was
    settled for the tool)."""
    duration = event.at - event.started_at if event.started_at is not None else None
    fields: dict[str, Any] = {}
    if event.event is EventType.STEP_COMPLETED:
        fields.update(_decoded(result_of(codec, event, models), "result"))
    elif event.event is EventType.OP_INTENT:
        fields.update(_decoded(decode(codec, event.payload), "arguments"))
    if event.position is None:
        raise ValueError(f"history entry {event.seq} ({event.event.value}) is not a journal entry")
    settled = _settled_for_the_tool(event)
    if event.detail is not None and (event.event is not EventType.STEP_COMPLETED or settled):
        fields["detail"] = event.detail
    return JournalEntryOut(
        position=event.position, kind=event.step_kind, name=event.name, attempt=event.attempt,
        status=journal_status(event), worker=event.worker,
        duration_ms=round(duration * 1000, 3) if duration is not None else None, **fields)


def attention(history: list[HistoryEvent]) -> dict[str, Any] | None:
    """The detail of the latest ``run.needs_attention`` entry (position, tool,
    operation id, arguments, why), if any."""
    entry = next((e for e in reversed(history) if e.event is EventType.RUN_NEEDS_ATTENTION), None)
    return entry.detail or {} if entry is not None else None


# -- a run in detail ------------------------------------------------------------------------------


def pending_approvals(operator: Operator, run_id: str, *, inspecting: bool = False) -> list[ApprovalView]:
    """The pending approvals of one run. ``inspecting`` (the CLI's read-only
    commands, which never migrate: the schema may predate approvals): none if
    they cannot be read, rather than no answer at all. The server's database
    is migrated, so there a failure is the store's, and raised."""
    try:
        return operator.approvals(run_id=run_id)
    except StoreError:
        if not inspecting:
            raise
        return []


def run_detail(
    operator: Operator, record: RunRecord, *, journal: bool, inspecting: bool = False
) -> dict[str, Any]:
    """A run in detail (``cairn show --json``; ``GET /api/runs/{id}``, with
    its journal if ``journal``; ``inspecting``: see ``pending_approvals``).
    Usage and length are summed by the store; the history is read only for
    the journal, or for what a run that needs attention is stuck on (such a
    run is parked: it grows no more)."""
    codec = operator.codec
    usage = operator.usage(record.run_id)
    needs_history = journal or record.status is RunStatus.NEEDS_ATTENTION
    history = operator.history(record.run_id) if needs_history else []
    result = decode(codec, record.result, "the result") if record.status is RunStatus.COMPLETED else Decoded()
    fields = {**_decoded(decode(codec, record.input, "the input"), "input"), **_decoded(result, "result")}
    if journal:
        models = model_calls(codec, history)
        fields["journal"] = [journal_entry(codec, e, models) for e in history
                             if e.event in JOURNAL_EVENTS and e.position is not None]
    return plain(RunDetailOut(
        **_run_fields(record), **fields, bundle=record.bundle,
        usage=UsageOut(tokens=usage.tokens, cost=usage.cost, tool_calls=usage.tool_calls),
        history_length=usage.last_seq,
        attention=attention(history) if record.status is RunStatus.NEEDS_ATTENTION else None,
        approvals=[approval_of(v) for v in pending_approvals(operator, record.run_id, inspecting=inspecting)],
        waiting=operator.waiting_for_worker(record), **_origin(operator, record)))


def _origin(operator: Operator, record: RunRecord) -> dict[str, Any]:
    """Where the run comes from: its lineage (a graph run's replay or fork)
    and who started it with which rights."""
    first = operator.history(record.run_id, 0, 1)
    created = first[0] if first and first[0].event is EventType.RUN_CREATED else None
    started = operator.started_with(record.run_id)
    by = (created.detail or {}).get("started_by") if created is not None else None
    found: dict[str, Any] = {"started_role": started.role, "started_token": started.token,
                             "started_by": by if isinstance(by, dict) else None}
    lineage = lineage_of(created)
    if lineage is not None:
        found["forked_from"] = LineageOut(**lineage.to_json())
    return found


# -- graph runs' checkpoints (time travel) -------------------------------------------------------


class CheckpointOut(msgspec.Struct, kw_only=True):
    """One super-step of a graph run: the tasks that ran in it (a node
    once per task), the nodes the next one runs (empty: the graph reached
    END), when it committed, its history entry and the step before it."""

    run_id: str
    step: int
    nodes: list[str]
    next: list[str]
    at: float
    seq: int
    parent: int | None
    #: why the checkpoint cannot be read (a damaged row); ``None``: it can
    error: str | None = None


class CheckpointPageOut(msgspec.Struct, kw_only=True):
    """Newest first; ``next_before``: the ``before`` of the next page (``None``: this is the last)."""

    run_id: str
    checkpoints: list[CheckpointOut]
    next_before: int | None


class StateOut(msgspec.Struct, kw_only=True):
    """The state after super-step ``step`` of a graph run, as plain JSON."""

    run_id: str
    step: int
    state: dict[str, Any]


class StateChangeOut(msgspec.Struct, kw_only=True):
    """One difference (``cairn.graph.diff``): ``path`` from the state's root
    (keys and list indexes), ``kind`` (added, removed, replaced, appended,
    inserted, deleted) and the old and new values (``null`` where the kind has none)."""

    path: list[str | int]
    kind: str
    old: Any
    new: Any


class DiffOut(msgspec.Struct, kw_only=True):
    """What changed from ``step_a`` of ``run_id`` to ``step_b`` of ``other_run``."""

    run_id: str
    step_a: int
    other_run: str
    step_b: int
    changes: list[StateChangeOut]


class DivergenceOut(msgspec.Struct, kw_only=True):
    """The first super-step where two graph runs' states differ (``None``: they never do)."""

    run_a: str
    run_b: str
    step: int | None


def checkpoint_json(checkpoint: Checkpoint) -> dict[str, Any]:
    """One checkpoint (``cairn graph history --json``, ``GET /api/runs/{id}/checkpoints``)."""
    return plain(CheckpointOut(run_id=checkpoint.run_id, step=checkpoint.step, nodes=list(checkpoint.nodes),
                               next=list(checkpoint.next), at=checkpoint.at, seq=checkpoint.seq,
                               parent=checkpoint.parent, error=checkpoint.error))


def checkpoint_page(run_id: str, found: Sequence[Checkpoint], limit: int) -> dict[str, Any]:
    """A page of ``limit`` checkpoints (``found`` holds one more if another page follows)."""
    page = list(found[:limit])
    return {"run_id": run_id, "checkpoints": [checkpoint_json(c) for c in page],
            "next_before": page[-1].step if len(found) > limit else None}


def state_json(run_id: str, step: int, state: dict[str, Any]) -> dict[str, Any]:
    return plain(StateOut(run_id=run_id, step=step, state=state))


def diff_json(run_id: str, step_a: int, other_run: str, step_b: int,
              changes: Sequence[Change]) -> dict[str, Any]:
    return {"run_id": run_id, "step_a": step_a, "other_run": other_run, "step_b": step_b,
            "changes": diffs.to_json(changes)}


def divergence_json(run_a: str, run_b: str, step: int | None) -> dict[str, Any]:
    return plain(DivergenceOut(run_a=run_a, run_b=run_b, step=step))


# -- operations and approvals ---------------------------------------------------------------------


def operation_of(op: OperationView) -> OperationOut:
    resolution = None if op.resolution is None else ResolutionOut(
        how=op.resolution.how, actor=op.resolution.actor, at=op.resolution.at)
    arguments = {"arguments": None} if op.arguments is None else _decoded(op.arguments, "arguments")
    return OperationOut(position=op.position, tool=op.tool, effect=op.effect, status=op.status,
                        operation_id=op.operation_id, attempt=op.attempt, last_event=op.last_event,
                        why=op.why, uncertain=op.uncertain, resolution=resolution, **arguments)


def operation_json(op: OperationView) -> dict[str, Any]:
    """One tool call (``App.operations``, ``cairn ops --json``, the API)."""
    return plain(operation_of(op))


def operations_of(report: RunOperations) -> OperationsOut:
    return OperationsOut(run_id=report.run.run_id, status=report.run.status,
                         operations=[operation_of(op) for op in report.operations],
                         needs_resolution=[op.position for op in report.uncertain()])


def approval_of(view: ApprovalView) -> ApprovalOut:
    return ApprovalOut(
        run_id=view.run_id, request_id=view.request_id, tenant=view.tenant, action=view.action,
        details=view.details, type=view.type_name,
        approvers=None if view.approvers is None else list(view.approvers), requested_at=view.requested_at,
        expires_at=view.expires_at, status=view.status, run_status=view.run_status, position=view.position,
        decided_by=view.decided_by, decided_at=view.decided_at, comment=view.comment, edited=view.edited,
        pending=view.pending)


def approval_json(view: ApprovalView) -> dict[str, Any]:
    """One approval request (``cairn approvals --json``, ``cairn show --json``, the API)."""
    return plain(approval_of(view))


# -- model calls ----------------------------------------------------------------------------------


class ModelCallOut(msgspec.Struct, kw_only=True):
    """One model call as sent and received."""

    seq: int
    position: int | None
    name: str | None
    at: float
    model: str
    latency_ms: float
    usage: Any
    cost: float | None
    finish_reason: str | None
    request: Any
    response: Any


def model_call_json(event: HistoryEvent, record: ModelRecord) -> dict[str, Any]:
    """One model call (``GET /api/runs/{id}/model-calls``)."""
    response = record.response
    return plain(ModelCallOut(
        seq=event.seq, position=event.position, name=event.name, at=event.at, model=response.model,
        latency_ms=record.latency_ms, usage=msgspec.to_builtins(response.usage), cost=response.cost,
        finish_reason=response.finish_reason, request=msgspec.to_builtins(record.request),
        response=msgspec.to_builtins(response.message)))


__all__ = ["ApprovalOut", "EventOut", "JournalEntryOut", "ModelCallOut", "ModelCalls", "OperationOut",
           "OperationsOut", "Reads", "ResolveCommandsOut", "RunDetailOut", "RunOut", "approval_json",
           "approval_of", "attention", "event_json", "journal_entry", "journal_status", "model_call_json",
           "model_calls", "model_calls_of", "model_records", "model_records_of", "operation_json",
           "operation_of", "operations_of", "pending_approvals", "plain", "put_decoded", "result_of",
           "run_detail", "run_json", "run_of"]
