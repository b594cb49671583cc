"""``/api/runs/{run_id}/checkpoints``: time travel over a graph run. Its
history of checkpoints (newest first, paged), the state at one (plain
JSON, read without the graph's code), the diff of two (of one run or of
two: ``?other=``), the first super-step where two runs' states differ
(``/divergence?other=``), and replay and fork at one, which start a new run of the
graph (the server's app must register it) in the run's tenant, with its
lineage recorded. Fork and replay are idempotent on ``run_id`` /
``Idempotency-Key`` as ``POST /api/runs`` is.

A run of another tenant is 404 as an unknown one; a run that is not a
graph's, an update that does not fit the state or a graph this server does
not register is 422; a step the run has no checkpoint of is 404.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import msgspec
from starlette.responses import JSONResponse

from cairn.api import actors
from cairn.api.ledger import decode
from cairn.api.tokens import Role
from cairn.api.travel import NoCheckpoint
from cairn.api.views import (
    CheckpointPageOut,
    DiffOut,
    DivergenceOut,
    StateOut,
    checkpoint_page,
    diff_json,
    divergence_json,
    run_json,
    state_json,
)
from cairn.codec import values
from cairn.errors import InvalidArgument, PayloadError, RunNotFound
from cairn.server.errors import ApiError
from cairn.server.routing import Call, Endpoint, Ident
from cairn.server.runs import RUN, StartedOut, chosen_run_id

CHECKPOINTS = RUN + "/checkpoints"


class CheckpointPage(msgspec.Struct):
    """``before``: only super-steps below it (the ``next_before`` of the
    last page); ``limit``: at most that many."""

    before: Annotated[int, msgspec.Meta(ge=0)] | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 50


class DiffQuery(msgspec.Struct):
    """``other``: step ``b`` is of this run (default: the same run)."""

    other: Ident | None = None


class DivergenceQuery(msgspec.Struct):
    """``other``: the run compared with this one."""

    other: Ident


class Replay(msgspec.Struct, forbid_unknown_fields=True):
    """``run_id`` (or the ``Idempotency-Key`` header): the new run's id,
    which makes the request idempotent."""

    run_id: Ident | None = None


class Fork(msgspec.Struct, forbid_unknown_fields=True):
    """``update``: the fields of the state to set (each replaced, validated
    as its type); ``run_id`` (or ``Idempotency-Key``): the new run's id."""

    update: dict[str, Any] = {}
    run_id: Ident | None = None


def _step(call: Call[Any], name: str) -> int:
    raw = call.path[name]
    # ASCII only: str.isdigit takes Arabic-Indic digits (int reads them) and superscripts too
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise ApiError(400, "invalid", f"{name} must be a super-step number (a non-negative integer), "
                                       f"not {raw[:40]!r}")
    return int(raw)


@contextmanager
def _answered() -> Iterator[None]:
    """Time travel's refusals as the API's: a missing step 404, the rest 422."""
    try:
        yield
    except NoCheckpoint as exc:
        raise ApiError(404, "not_found", str(exc)) from None
    except RunNotFound:
        raise
    except (InvalidArgument, PayloadError) as exc:
        raise ApiError(422, "invalid", str(exc)) from None


def list_checkpoints(call: Call[Any]) -> Any:
    record = call.run(call.path["run_id"])
    query: CheckpointPage = call.query
    with _answered():
        found = call.app.checkpoints(record.run_id, before=query.before, limit=query.limit + 1)
    return checkpoint_page(record.run_id, found, query.limit)


def show_checkpoint(call: Call[Any]) -> Any:
    record = call.run(call.path["run_id"])
    step = _step(call, "step")
    with _answered():
        at, found = call.app.graph_state_json(record.run_id, step)
    return state_json(record.run_id, at, found)


def diff_checkpoints(call: Call[Any]) -> Any:
    record = call.run(call.path["run_id"])
    query: DiffQuery = call.query
    other = call.run(query.other) if query.other is not None else record
    step_a, step_b = _step(call, "a"), _step(call, "b")
    with _answered():
        changes = call.app.graph_diff(record.run_id, step_a, step_b, other_run=other.run_id)
    return diff_json(record.run_id, step_a, other.run_id, step_b, changes)


def diverge_runs(call: Call[Any]) -> Any:
    record = call.run(call.path["run_id"])
    query: DivergenceQuery = call.query
    other = call.run(query.other)  # another tenant's run: 404 as an unknown one
    with _answered():
        step = call.app.graph_divergence(record.run_id, other.run_id)
    return divergence_json(record.run_id, other.run_id, step)


def _started(call: Call[Any], origin: str, make: Callable[[str | None], Any], asked_id: str | None,
             step: int, update: dict[str, Any] | None) -> JSONResponse:
    run_id = chosen_run_id(call, asked_id)
    with _answered():
        handle = make(run_id)
    try:
        record = call.run(handle.run_id)
    except RunNotFound:  # the id belongs to another tenant's run: say no more than that it is taken
        raise ApiError(409, "conflict", f"run id {handle.run_id!r} is already taken") from None
    if not handle.created:
        _same(call, record.run_id, origin, step, update)
    return JSONResponse({"created": handle.created, "run": run_json(record)},
                        status_code=201 if handle.created else 200)


def _same(call: Call[Any], run_id: str, origin: str, step: int, update: dict[str, Any] | None) -> None:
    """A fork or replay that found its run existing must be the request
    that made it: the same origin, step and kind, and (a fork) the
    update's fields as the run started with them."""
    lineage = call.app.lineage(run_id)
    same = lineage is not None and (lineage.run_id, lineage.step, lineage.edited) == (
        origin, step, update is not None)
    if same and update:
        stored = decode(call.operator.codec, call.app.get_run(run_id).input, "the input")
        state = stored.value.get("state") if isinstance(stored.value, dict) else None
        asked = values.decode(values.encode(update))
        same = stored.error is not None or (isinstance(state, dict)
                                            and all(state.get(k) == v for k, v in asked.items()))
    if not same:
        raise ApiError(422, "idempotency_key_reused", f"run {run_id!r} was started by another request "
                                                      "(another run, step or update): choose a new key")


def _as_caller(call: Call[Any]) -> dict[str, Any]:
    """Who replays or forks: the new run acts with the token's role, as a
    run the token starts does (``start_run``), not with the origin's."""
    role = call.principal.role.value
    return {"started_role": role, "started_token": call.principal.token_id,
            "started_by": actors.context(call.principal.actor, call.principal.tenant, role=role)}


def replay_checkpoint(call: Call[Any]) -> Any:
    origin = call.run(call.path["run_id"]).run_id
    body: Replay = call.body
    step = _step(call, "step")
    return _started(call, origin, lambda run_id: call.app.graph_replay(origin, step, run_id=run_id,
                                                                      **_as_caller(call)),
                    body.run_id, step, None)


def fork_checkpoint(call: Call[Any]) -> Any:
    origin = call.run(call.path["run_id"]).run_id
    body: Fork = call.body
    step = _step(call, "step")
    return _started(call, origin, lambda run_id: call.app.graph_fork(origin, step, update=body.update,
                                                                    run_id=run_id, **_as_caller(call)),
                    body.run_id, step, body.update)


ROUTES = [
    Endpoint("GET", CHECKPOINTS, Role.VIEWER, "A graph run's checkpoints, newest first (a page)",
             list_checkpoints, query=CheckpointPage, tag="graphs", response=CheckpointPageOut),
    Endpoint("GET", CHECKPOINTS + "/{step}", Role.VIEWER, "The state of a graph run after a super-step",
             show_checkpoint, tag="graphs", response=StateOut),
    Endpoint("GET", CHECKPOINTS + "/{a}/diff/{b}", Role.VIEWER, "What changed from checkpoint a to "
             "checkpoint b (of ?other= if given), field by field", diff_checkpoints, query=DiffQuery,
             tag="graphs", response=DiffOut),
    Endpoint("GET", RUN + "/divergence", Role.VIEWER, "The first super-step at which this graph run's "
             "state and ?other='s differ (null: never)", diverge_runs, query=DivergenceQuery, tag="graphs",
             response=DivergenceOut),
    Endpoint("POST", CHECKPOINTS + "/{step}/replay", Role.OPERATOR, "Start a new run from the checkpoint, "
             "running every super-step after it again", replay_checkpoint, body=Replay, status=201,
             returns="The new run (201: created; 200: it existed)", idempotent=True, tag="graphs",
             response=StartedOut),
    Endpoint("POST", CHECKPOINTS + "/{step}/fork", Role.OPERATOR, "Start a new run from the checkpoint "
             "with the update's fields set", fork_checkpoint, body=Fork, status=201,
             returns="The new run (201: created; 200: it existed)", idempotent=True, tag="graphs",
             response=StartedOut),
]
