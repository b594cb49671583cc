"""``/api/runs``: start, list, show, page the journal, model calls,
operations, and the operator's actions on a run (cancel, kill, resume,
retry, budget, resolve). Every action goes through the ``Operator`` acting
as the token's identity, which records it in the run's history."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from starlette.responses import JSONResponse

from cairn.api import actors
from cairn.api.ledger import decode
from cairn.api.tokens import Role
from cairn.api.views import (
    EventOut,
    ModelCallOut,
    OperationsOut,
    RunDetailOut,
    RunOut,
    event_json,
    model_call_json,
    model_calls_of,
    model_records_of,
    operations_of,
    plain,
    run_detail,
    run_json,
)
from cairn.codec import values
from cairn.engine.budget import Budget
from cairn.errors import PayloadError, RunNotFound
from cairn.server.errors import ApiError
from cairn.server.routing import Call, Endpoint, Ident
from cairn.store.records import RunRecord, RunStatus
from cairn.store.runids import scoped_run_id

Name = Ident
#: a run id: any printable text but '.' and '..' ('/' included: paths carry it percent-encoded, see
#: routing.EncodedRoute), the rule of ``store.runids.check_id``
RunId = Ident
#: a count or a cursor: both backends store it as a signed 64-bit integer
NonNegative = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
NonNegativeFloat = Annotated[float, msgspec.Meta(ge=0)]


class BudgetBody(msgspec.Struct, forbid_unknown_fields=True):
    """Limits of a run's budget; a limit left out is not limited (when
    starting) or kept (when changing)."""

    tokens: NonNegative | None = None
    cost: NonNegativeFloat | None = None
    tool_calls: NonNegative | None = None
    wall_seconds: NonNegativeFloat | None = None

    def budget(self) -> Budget:
        return Budget(self.tokens, self.cost, self.tool_calls, self.wall_seconds)


class StartRun(msgspec.Struct, forbid_unknown_fields=True):
    """Start a run of a workflow the server's app registers. ``input``: an
    object names parameters, an array lists them, any other value is the
    only argument; left out, the workflow gets no arguments (its defaults).
    ``run_id`` (or the ``Idempotency-Key`` header) makes the start
    idempotent: starting an existing run of yours answers it unchanged
    (with another workflow or input: 422 ``idempotency_key_reused``)."""

    workflow: Name
    input: Any | msgspec.UnsetType = msgspec.UNSET
    run_id: RunId | None = None
    thread_id: Name | None = None
    queue: Name = "default"
    priority: Annotated[int, msgspec.Meta(ge=-1_000_000, le=1_000_000)] = 0
    budget: BudgetBody | None = None
    #: whose data the run holds (erasure by subject: ``POST /v1/erasures``)
    subject: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] | None = None


class ListRuns(msgspec.Struct):
    status: RunStatus | None = None
    workflow: Name | None = None
    thread_id: Name | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=500)] = 50


class ShowRun(msgspec.Struct):
    """``journal``: the run's journal too, as ``cairn show --json`` has it
    (it reads the whole history; pages of it are ``/history``)."""

    journal: bool = False


class Page(msgspec.Struct):
    """``after``: only entries with a larger ``seq``; ``limit``: at most that many."""

    after: NonNegative = 0
    limit: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 100


class Reason(msgspec.Struct, forbid_unknown_fields=True):
    reason: Annotated[str, msgspec.Meta(min_length=1, max_length=1000)] | None = None


class Resolve(msgspec.Struct, forbid_unknown_fields=True):
    """``done: true``: the effect happened and ``result`` is recorded as the
    tool's result (it is not executed again); ``done: false``: it did not,
    and it is executed again with the same operation id."""

    done: bool
    result: Any = None


# -- what the routes answer (documented in the OpenAPI document; the objects are cairn.api.views)


class StartedOut(msgspec.Struct, kw_only=True):
    created: bool
    run: RunOut


class RunListOut(msgspec.Struct, kw_only=True):
    runs: list[RunOut]


class HistoryPageOut(msgspec.Struct, kw_only=True):
    """``next_after``: the ``after`` of the next page; ``None``: this is the last."""

    run_id: str
    events: list[EventOut]
    next_after: int | None


class ModelCallsOut(msgspec.Struct, kw_only=True):
    """``error``: why the model calls cannot be rebuilt (none are listed then);
    ``next_after``: the ``after`` of the next page; ``None``: this is the last."""

    run_id: str
    model_calls: list[ModelCallOut]
    next_after: int | None
    error: str | msgspec.UnsetType = msgspec.UNSET


class ChangeOut(msgspec.Struct, kw_only=True):
    """An action's effect: whether it changed the run, its status before,
    the run after; ``from_position`` (retry): where it resumes (``None``:
    the top of its journal); ``position`` (resolve): the call settled."""

    changed: bool
    before: RunStatus
    run: RunOut
    from_position: int | msgspec.UnsetType | None = msgspec.UNSET
    position: int | msgspec.UnsetType = msgspec.UNSET


class KilledOut(msgspec.Struct, kw_only=True):
    """The runs killed (the run and its unfinished children), and the run now."""

    killed: list[str]
    run: RunOut


def _position(call: Call[Any]) -> int:
    raw = call.path["position"]
    # ASCII only: str.isdigit takes Arabic-Indic digits (int reads them) and superscripts too
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise ApiError(400, "invalid", f"position must be a non-negative integer, not {raw[:40]!r}")
    return int(raw)


def _same_start(call: Call[Any], record: RunRecord, data: Any) -> None:
    """A start that found its run existing must be the request that made it
    (the same workflow and input): a key reused for another request would
    otherwise answer the old run and drop the new request without a word."""
    body: StartRun = call.body
    chosen = body.run_id or call.request.headers.get("idempotency-key", "")
    same = record.workflow == body.workflow
    if same:
        stored = decode(call.operator.codec, record.input, "the input")
        asked = values.decode(values.encode(call.app.definition(body.workflow).inputs_from_json(data)))
        same = stored.error is not None or stored.value == asked  # an unreadable input cannot tell: as asked
    if not same:
        raise ApiError(422, "idempotency_key_reused", f"run {chosen!r} was started by another request "
                                                      "(another workflow or input): choose a new key")


def chosen_run_id(call: Call[Any], given: str | None) -> str | None:
    """The id a request that creates a run chose (the body's ``run_id`` or
    the ``Idempotency-Key`` header; they must agree), in the caller's
    tenant's own namespace: no other tenant can hold it or see it exists."""
    key = call.request.headers.get("idempotency-key")
    if key is not None:
        try:
            key = msgspec.convert(key, RunId)
        except msgspec.ValidationError:
            raise ApiError(422, "invalid", "the Idempotency-Key header must be 1 to 200 printable "
                                           "characters, not . or ..") from None
        if given is not None and given != key:
            raise ApiError(422, "invalid", "run_id and the Idempotency-Key header differ")
    chosen = given or key
    return scoped_run_id(call.principal.tenant, chosen) if chosen is not None else None


def start_run(call: Call[Any]) -> Any:
    body: StartRun = call.body
    tenant = call.principal.tenant
    run_id = chosen_run_id(call, body.run_id)
    data = {} if body.input is msgspec.UNSET else body.input
    try:
        handle = call.app.start_json(
            body.workflow, data, run_id=run_id, thread_id=body.thread_id, tenant=tenant, queue=body.queue,
            priority=body.priority, budget=body.budget.budget() if body.budget is not None else None,
            started_role=call.principal.role.value, started_token=call.principal.token_id,
            started_by=actors.context(call.principal.actor, tenant, role=call.principal.role.value),
            subject=body.subject,
        )
    except PayloadError as exc:  # JSON the document allows, that the workflow's parameters do not take
        raise ApiError(422, "invalid_input", str(exc)) from None
    try:
        record = call.run(handle.run_id)
    except RunNotFound:  # the id belongs to another tenant's run: say no more than that it is taken
        raise ApiError(409, "conflict", f"run id {handle.run_id!r} is already taken") from None
    if not handle.created:
        _same_start(call, record, data)
    return JSONResponse({"created": handle.created, "run": run_json(record)},
                        status_code=201 if handle.created else 200)


def list_runs(call: Call[Any]) -> Any:
    query: ListRuns = call.query
    records = call.app.list_runs(status=query.status, tenant=call.principal.tenant, workflow=query.workflow,
                                 thread_id=query.thread_id, limit=query.limit)
    return {"runs": [run_json(r) for r in records]}


def show_run(call: Call[Any]) -> Any:
    record = call.run(call.path["run_id"])
    query: ShowRun = call.query
    return run_detail(call.operator, record, journal=query.journal)


def run_history(call: Call[Any]) -> Any:
    """One page, read as one: the entries after ``after``, one more than the
    page to know whether another follows, and the entries the page's model
    calls name as needed to rebuild them (``model_calls_of``)."""
    query: Page = call.query
    record = call.run(call.path["run_id"])
    fetched = call.app.history(record.run_id, query.after, query.limit + 1)
    page = fetched[: query.limit]
    models = model_calls_of(call.app, call.operator.codec, record.run_id, page)
    next_after = page[-1].seq if len(fetched) > query.limit else None
    return {"run_id": record.run_id, "events": [event_json(call.operator.codec, e, models) for e in page],
            "next_after": next_after}


def run_model_calls(call: Call[Any]) -> Any:
    """A page of the run's model calls (``after``: a ``seq``), read in the
    database without the entries between them, each rebuilt from the entries
    it needs."""
    query: Page = call.query
    record = call.run(call.path["run_id"])
    fetched = call.app.model_calls(record.run_id, query.after, query.limit + 1)
    page = fetched[: query.limit]
    next_after = page[-1].seq if len(fetched) > query.limit else None
    models = model_records_of(call.app, call.operator.codec, record.run_id, page)
    if isinstance(models, str):
        return {"run_id": record.run_id, "model_calls": [], "error": models, "next_after": next_after}
    return {"run_id": record.run_id, "next_after": next_after,
            "model_calls": [model_call_json(e, models[e.seq]) for e in page if e.seq in models]}


def run_operations(call: Call[Any]) -> Any:
    record = call.run(call.path["run_id"])
    ops = call.operator.operations(record.run_id)
    return plain(operations_of(ops))


def _change(before: Any, after: Any) -> dict[str, Any]:
    # a budget's change bumps no epoch and keeps the status: it is a change all the same
    changed = (after.epoch != before.epoch or after.status is not before.status
               or after.budget != before.budget)
    return {"changed": changed, "before": before.status.value, "run": run_json(after)}


def cancel_run(call: Call[Any]) -> Any:
    record = call.run(call.path["run_id"])
    body: Reason = call.body
    change = call.operator.cancel(record.run_id, body.reason or "cancelled by operator")
    return _change(change.before, change.run)


def kill_run(call: Call[Any]) -> Any:
    record = call.run(call.path["run_id"])
    body: Reason = call.body
    killed = call.operator.kill(record.run_id, reason=body.reason or "killed by operator")
    return {"killed": [r.run_id for r in killed], "run": run_json(call.run(record.run_id))}


def resume_run(call: Call[Any]) -> Any:
    record = call.run(call.path["run_id"])
    change = call.operator.revive(record.run_id)
    return _change(change.before, change.run)


def retry_run(call: Call[Any]) -> Any:
    record = call.run(call.path["run_id"])
    retried = call.operator.retry(record.run_id)
    return {**_change(retried.before, retried.run), "from_position": retried.from_position}


def set_budget(call: Call[Any]) -> Any:
    record = call.run(call.path["run_id"])
    body: BudgetBody = call.body
    if all(v is None for v in (body.tokens, body.cost, body.tool_calls, body.wall_seconds)):
        raise ApiError(422, "invalid", "give at least one limit: tokens, cost, tool_calls or wall_seconds")
    change = call.operator.set_budget(record.run_id, body.budget(), keep_others=True)
    return _change(change.before, change.run)


def resolve_operation(call: Call[Any]) -> Any:
    record = call.run(call.path["run_id"])
    position = _position(call)
    body: Resolve = call.body
    resolved = call.operator.resolve(record.run_id, position, done=body.done, result=body.result)
    return {**_change(resolved.before, resolved.run), "position": position}


RUN = "/api/runs/{run_id}"

ROUTES = [
    Endpoint("POST", "/api/runs", Role.OPERATOR, "Start a run (idempotent on run_id / Idempotency-Key)",
             start_run, body=StartRun, status=201, returns="The run (201: created; 200: it existed)",
             idempotent=True, response=StartedOut),
    Endpoint("GET", "/api/runs", Role.VIEWER, "List the tenant's runs, newest first", list_runs,
             query=ListRuns, response=RunListOut),
    Endpoint("GET", RUN, Role.VIEWER, "A run with its input, result, budget, usage, pending approvals "
             "and (?journal=true) its journal: the shape of 'cairn show --json'", show_run, query=ShowRun,
             response=RunDetailOut),
    Endpoint("GET", RUN + "/history", Role.VIEWER, "A page of the run's history (its journal)", run_history,
             query=Page, response=HistoryPageOut),
    Endpoint("GET", RUN + "/model-calls", Role.VIEWER, "A page of the run's model calls as sent and received",
             run_model_calls, query=Page, response=ModelCallsOut),
    Endpoint("GET", RUN + "/operations", Role.VIEWER, "The run's tool calls and where each stands",
             run_operations, tag="operations", response=OperationsOut),
    Endpoint("POST", RUN + "/cancel", Role.OPERATOR, "Cancel the run and its unfinished children",
             cancel_run, body=Reason, response=ChangeOut),
    Endpoint("POST", RUN + "/kill", Role.OPERATOR, "Kill switch: stop the run and its children now",
             kill_run, body=Reason, response=KilledOut),
    Endpoint("POST", RUN + "/resume", Role.OPERATOR, "Bring a killed or halted run back (revive)",
             resume_run, response=ChangeOut),
    Endpoint("POST", RUN + "/retry", Role.OPERATOR, "Resume a failed or quarantined run from its last "
             "good step", retry_run, response=ChangeOut),
    Endpoint("PUT", RUN + "/budget", Role.OPERATOR, "Change limits of the run's budget (others are kept)",
             set_budget, body=BudgetBody, response=ChangeOut),
    Endpoint("POST", RUN + "/operations/{position}/resolve", Role.OPERATOR,
             "Settle an uncertain write of a run that needs attention", resolve_operation, body=Resolve,
             tag="operations", response=ChangeOut),
]
