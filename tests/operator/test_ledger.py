"""The operation ledger (``cairn.api.ledger``): typed views of a run's tool
calls, read from real runs on SQLite and from histories written out by hand
where a case is hard to reach by running (an actor, a cut)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn.api.ledger import (
    Ledger,
    OpStatus,
    Settled,
    operations,
    resolution_request,
)
from cairn.api.views import operation_json
from cairn.codec.payloads import PayloadCodec
from cairn.store.records import EventType, HistoryEvent, Payload
from tests.cli.effects import ledger_lines
from tests.operator.conftest import stuck_payment


def test_an_uncertain_write_and_the_read_before_it(app: cairn.App, bank: dict[str, str]) -> None:
    run_id = stuck_payment(app, bank, "after")
    lookup, pay = operations(run_id, app.history(run_id), app.runtime.payloads)

    assert (lookup.position, lookup.tool, lookup.status) == (0, "lookup_account", OpStatus.DONE)
    assert lookup.effect is None
    assert lookup.arguments is None  # a read records no intent
    assert lookup.last_event is EventType.STEP_COMPLETED
    assert (pay.position, pay.tool, pay.status, pay.effect) == (1, "pay", OpStatus.UNCERTAIN, "write")
    assert pay.operation_id == cairn.operation_id(run_id, 1)
    assert pay.attempt == 1
    assert pay.arguments is not None
    assert pay.arguments.error is None
    assert pay.arguments.value == {"to": "acct_ada", "amount": 40, "ledger": bank["ledger"],
                                   "outage": bank["outage"]}
    assert pay.why is not None
    assert "TimeoutError: the bank did not answer in time" in pay.why
    assert pay.resolution is None
    assert pay.last_event is EventType.OP_INTENT
    assert Ledger(run_id, app.history(run_id)).uncertain_positions() == [1]
    # App.operations answers the one operation shape (cli ops --json, the API), from the same views
    assert app.operations(run_id) == [operation_json(lookup), operation_json(pay)]
    assert [(op["tool"], op["attempt"], op["arguments"]) for op in app.operations(run_id)] == [
        ("lookup_account", 1, None), ("pay", 1, pay.arguments.value)]


def test_resolved_done_by_an_operator(app: cairn.App, bank: dict[str, str]) -> None:
    run_id = stuck_payment(app, bank, "after")
    app.resolve_operation(run_id, 1, done=True, result={"transfer": "t-manual"})
    [_, pay] = operations(run_id, app.history(run_id), app.runtime.payloads)
    assert pay.status is OpStatus.DONE
    assert pay.resolution is not None
    assert pay.resolution.how is Settled.OPERATOR_DONE
    assert pay.why is None  # it no longer waits for anyone


def test_resolved_not_done_then_executed_again(app: cairn.App, bank: dict[str, str]) -> None:
    run_id = stuck_payment(app, bank, "before")
    app.resolve_operation(run_id, 1, done=False)
    [_, pay] = operations(run_id, app.history(run_id), app.runtime.payloads)
    assert (pay.status, pay.last_event) == (OpStatus.PENDING, EventType.OP_RESOLVED)
    assert pay.resolution is not None
    assert pay.resolution.how is Settled.OPERATOR_NOT_DONE

    app.resume(run_id)
    [_, pay] = operations(run_id, app.history(run_id), app.runtime.payloads)
    assert (pay.status, pay.last_event) == (OpStatus.DONE, EventType.STEP_COMPLETED)
    # how it came to be executed again is still said
    assert pay.resolution is not None
    assert pay.resolution.how is Settled.OPERATOR_NOT_DONE
    assert len(ledger_lines(bank["ledger"])) == 1


def test_arguments_are_read_through_the_codec(tmp_path: Path, bank: dict[str, str]) -> None:
    """Arguments large enough to be an artifact are fetched through the codec;
    one that cannot be read is reported, not raised."""
    from tests.cli.effects import register

    app = cairn.App(f"sqlite:///{tmp_path / 'big.db'}", lease_seconds=5.0, inline_limit=64)
    register(app)
    try:
        run_id = stuck_payment(app, bank, "after")
        [intent] = [e for e in app.history(run_id) if e.event is EventType.OP_INTENT]
        assert intent.payload is not None
        assert intent.payload.ref is not None
        [_, pay] = operations(run_id, app.history(run_id), app.runtime.payloads)
        assert pay.arguments is not None
        assert pay.arguments.value["amount"] == 40

        broken = [replace_payload(e, Payload(ref="0" * 64)) if e.seq == intent.seq else e
                  for e in app.history(run_id)]
        [_, pay] = operations(run_id, broken, app.runtime.payloads)
        assert pay.status is OpStatus.UNCERTAIN
        assert pay.arguments is not None
        assert pay.arguments.value is None
        assert pay.arguments.error is not None
        assert "arguments of #1" in pay.arguments.error
    finally:
        app.close()


def replace_payload(event: HistoryEvent, payload: Payload) -> HistoryEvent:
    from dataclasses import replace

    return replace(event, payload=payload)


# -- histories written out by hand ------------------------------------------------------------


def entry(seq: int, kind: EventType, position: int | None = None, *, payload: bytes | None = None,
          **detail: Any) -> HistoryEvent:
    return HistoryEvent(run_id="r", seq=seq, event=kind, at=float(seq), epoch=1, position=position,
                        step_kind="tool" if position is not None else None,
                        name="charge" if position is not None else None, attempt=1,
                        payload=Payload(data=payload) if payload is not None else None,
                        detail=detail or None)


def intent(seq: int, position: int) -> HistoryEvent:
    return entry(seq, EventType.OP_INTENT, position, payload=json.dumps({"amount": seq}).encode(),
                 operation_id=f"op-{position}", effect="write")


@pytest.fixture
def codec(app: cairn.App) -> PayloadCodec:
    return app.runtime.payloads


def test_the_actor_of_a_resolution_is_read_from_its_entry(codec: PayloadCodec) -> None:
    history = [intent(1, 0),
               entry(2, EventType.STEP_COMPLETED, 0, payload=b'"ok"', resolved_by="operator",
                     operation_id="op-0", actor="cli:ada@host")]
    [view] = operations("r", history, codec)
    assert view.status is OpStatus.DONE
    assert view.resolution is not None
    assert (view.resolution.how, view.resolution.actor, view.resolution.at) == (
        Settled.OPERATOR_DONE, "cli:ada@host", 2.0)


def test_reconciliations(codec: PayloadCodec) -> None:
    history = [intent(1, 0), entry(2, EventType.OP_RECONCILED, 0, outcome="unknown", next_at=9.0),
               intent(3, 1), entry(4, EventType.OP_RECONCILED, 1, outcome="not_found"),
               intent(5, 2), entry(6, EventType.STEP_COMPLETED, 2, payload=b"1", reconciled="done")]
    unknown, not_found, done = operations("r", history, codec)
    assert (unknown.status, unknown.resolution) == (OpStatus.UNCERTAIN, None)
    # found absent, it is executed again at once; until its result is recorded
    # it may have happened, so it stays uncertain (the replay journal's rule)
    assert not_found.status is OpStatus.UNCERTAIN
    assert not_found.resolution is not None
    assert not_found.resolution.how is Settled.RECONCILED_NOT_FOUND
    assert done.status is OpStatus.DONE
    assert done.resolution is not None
    assert done.resolution.how is Settled.RECONCILED_DONE
    assert done.resolution.actor is None
    assert Ledger("r", history).uncertain_positions() == [0, 1]


def test_a_retry_cut_forgets_what_settled_the_positions_after_it(codec: PayloadCodec) -> None:
    history = [intent(1, 0), entry(2, EventType.OP_RESOLVED, 0, done=False),
               entry(3, EventType.STEP_FAILED, 0, error={"type": "X", "message": "no"}),
               entry(4, EventType.RUN_RETRIED, from_position=0, previous_status="failed"),
               intent(5, 0)]
    [view] = operations("r", history, codec)
    assert (view.status, view.resolution, view.arguments is not None) == (OpStatus.UNCERTAIN, None, True)
    assert view.arguments is not None
    assert view.arguments.value == {"amount": 5}


def test_the_resolution_request(app: cairn.App, bank: dict[str, str]) -> None:
    run_id = stuck_payment(app, bank, "after")
    run, ledger = app.get_run(run_id), Ledger(run_id, app.history(run_id))
    request = resolution_request(run, ledger, 1, done=True, result=Payload(data=b"1"))
    assert (request.position, request.done, request.result) == (1, True, Payload(data=b"1"))
    assert request.detail == {"name": "pay", "step_kind": "tool",
                              "operation_id": cairn.operation_id(run_id, 1)}
    not_done = resolution_request(run, ledger, 1, done=False, result=Payload(data=b"1"))
    assert not_done.result is None  # "not done" records no result

    with pytest.raises(cairn.CairnError, match=r"0 .* is not uncertain \(uncertain positions: \[1\]\)"):
        resolution_request(run, ledger, 0, done=True, result=None)


def test_an_uncertain_call_of_a_run_that_does_not_need_attention_is_the_engines(
    app: cairn.App, bank: dict[str, str]
) -> None:
    """Between an intent and the claim that reconciles it, a call is uncertain
    but no operator's to settle."""
    run_id = stuck_payment(app, bank, "after")
    history = [e for e in app.history(run_id) if e.event is not EventType.RUN_NEEDS_ATTENTION]
    pending = app.get_run(run_id)
    from dataclasses import replace

    pending = replace(pending, status=cairn.RunStatus.PENDING)
    ledger = Ledger(run_id, history)
    assert ledger.uncertain_positions() == [1]
    with pytest.raises(cairn.CairnError, match="is pending; it has no operation to resolve"):
        resolution_request(pending, ledger, 1, done=False, result=None)
