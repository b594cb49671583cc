"""The operation ledger across real crashes (SIGKILL at named fault points)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

import pytest

import cairn
from cairn.store.records import EventType, RunStatus
from tests.timing import wait_until_lease_lapsed


def recover(run_id: str) -> tuple[ModuleType, object]:
    """Load the app in this process and finish the run once the dead child's lease expired."""
    module = importlib.import_module("tests.effects.ledger_app")
    wait_until_lease_lapsed(module.app, run_id)  # before another holder may take over
    return module, module.app.resume(run_id)


def kinds(module: ModuleType, kind: str) -> list[dict[str, object]]:
    return [e for e in module.ledger_entries() if e["kind"] == kind]


@pytest.mark.slow
def test_write_with_reconcile_after_effect_is_not_sent_twice(
    crash_at: Callable[..., None], world: dict[str, str]
) -> None:
    crash_at("tool.after_effect", "r1", "transfer", 500)
    module, result = recover("r1")
    transfers = kinds(module, "transfer")
    assert len(transfers) == 1, transfers  # the bank holds exactly one transfer
    assert result["receipt"] == transfers[0]  # reconciliation recorded what the bank did
    assert transfers[0]["key"] == cairn.operation_id("r1", 0)
    history = module.app.history("r1")
    completed = [e for e in history if e.event is EventType.STEP_COMPLETED and e.position == 0]
    assert completed[0].detail is not None
    assert completed[0].detail["reconciled"] == "done"


@pytest.mark.slow
def test_write_with_reconcile_after_intent_executes_once(
    crash_at: Callable[..., None], world: dict[str, str]
) -> None:
    crash_at("tool.after_intent", "r2", "transfer", 70)
    module, result = recover("r2")
    transfers = kinds(module, "transfer")
    assert len(transfers) == 1
    assert transfers[0]["amount"] == 70
    assert transfers[0]["key"] == cairn.operation_id("r2", 0)  # the same key the intent recorded
    events = [e.detail for e in module.app.history("r2") if e.event is EventType.OP_RECONCILED]
    assert events
    assert events[0] is not None
    assert events[0]["outcome"] == "not_found"
    assert result["balance"] == 70


@pytest.mark.slow
def test_write_without_reconcile_waits_for_an_operator(
    crash_at: Callable[..., None], world: dict[str, str]
) -> None:
    crash_at("tool.after_effect", "r3", "unreconciled", 9)
    module = importlib.import_module("tests.effects.ledger_app")
    app: cairn.App = module.app
    wait_until_lease_lapsed(app, "r3")
    with pytest.raises(TimeoutError):
        app.handle("r3").result(timeout=0.01)
    # resume parks the run: it never guesses
    claim = app.store.claim_run("r3", "w", 5.0, 5)
    assert claim is not None
    from cairn.engine.executor import execute

    assert execute(app.runtime, claim, "w").status == "suspended"
    run = app.get_run("r3")
    assert run.status is RunStatus.NEEDS_ATTENTION
    assert app.store.claim_run("r3", "w", 5.0, 5) is None  # no worker picks it up
    ops = app.operations("r3")
    assert [(o["position"], o["status"]) for o in ops] == [(0, "uncertain")]
    assert len(kinds(module, "unreconciled")) == 1
    # the operator checked the bank: it happened
    app.resolve_operation("r3", 0, done=True, result=kinds(module, "unreconciled")[0])
    result = app.resume("r3")
    assert len(kinds(module, "unreconciled")) == 1  # not sent again
    assert result["receipt"]["amount"] == 9
    assert app.operations("r3")[0]["status"] == "done"


@pytest.mark.slow
def test_operator_can_say_not_done_and_it_is_sent_with_the_same_key(
    crash_at: Callable[..., None], world: dict[str, str]
) -> None:
    crash_at("tool.after_intent", "r4", "unreconciled", 11)
    module = importlib.import_module("tests.effects.ledger_app")
    app: cairn.App = module.app
    wait_until_lease_lapsed(app, "r4")
    with pytest.raises(cairn.CairnError, match="no operation to resolve"):
        app.resolve_operation("r4", 0, done=False)
    claim = app.store.claim_run("r4", "w", 5.0, 5)
    assert claim is not None
    from cairn.engine.executor import execute

    execute(app.runtime, claim, "w")
    assert app.get_run("r4").status is RunStatus.NEEDS_ATTENTION
    assert kinds(module, "unreconciled") == []  # it died before the effect
    app.resolve_operation("r4", 0, done=False)
    app.resume("r4")
    sent = kinds(module, "unreconciled")
    assert len(sent) == 1
    assert sent[0]["key"] == cairn.operation_id("r4", 0)


@pytest.mark.slow
def test_idempotent_tool_is_resent_with_the_same_key(
    crash_at: Callable[..., None], world: dict[str, str]
) -> None:
    crash_at("tool.after_effect", "r5", "idempotent", 3)
    module, result = recover("r5")
    assert len(kinds(module, "idempotent")) == 1  # the outside world deduplicated the resend
    assert result["receipt"]["key"] == cairn.operation_id("r5", 0)


@pytest.mark.slow
def test_read_tool_simply_runs_again(crash_at: Callable[..., None], world: dict[str, str]) -> None:
    # die after the read tool's effect (position 1), before its result was recorded
    crash_at("tool.after_effect@2", "r6", "transfer", 5)
    module, result = recover("r6")
    assert len(kinds(module, "transfer")) == 1
    assert len(kinds(module, "read")) == 2  # the read ran, was lost, and ran again
    assert result["balance"] == 5


@pytest.mark.slow
def test_rewound_write_gets_a_new_key_that_survives_a_crash(
    crash_at: Callable[..., None], world: dict[str, str]
) -> None:
    """Issue 9 item 2: after a rewind the write re-runs with new arguments; it
    is a new effect, so it has a new key (or the bank, deduplicating by key,
    drops it and returns the old receipt). The worker is killed right after
    the second effect: recovery reconciles it under that same new key."""
    crash_at("tool.after_effect@2", "rw", "checked", 5)
    module, result = recover("rw")
    keyed = kinds(module, "keyed")
    assert [e["amount"] for e in keyed] == [5, 1005], keyed  # both landed, once each
    first, second = (str(e["key"]) for e in keyed)
    assert first == cairn.operation_id("rw", 1)  # a run's first pass keeps the original key
    assert second == cairn.operation_id("rw", 1, 1) != first
    assert result == keyed[1]  # the run reports the new receipt, not the old one
    reconciled = [e for e in module.app.history("rw") if e.event is EventType.STEP_COMPLETED
                  and (e.detail or {}).get("reconciled") == "done"]
    assert [(e.detail or {})["operation_id"] for e in reconciled] == [second]


@pytest.mark.slow
def test_a_deploy_that_removed_a_write_call_does_not_complete_over_its_effect(
    crash_at: Callable[..., None], world: dict[str, str]
) -> None:
    """Issue 9 item 4: the worker is killed after the bank took the transfer;
    the new code no longer makes the call. The uncertain effect goes to an
    operator; the run does not complete silently over it."""
    crash_at("tool.after_effect", "gone", "once", 40)
    module = importlib.import_module("tests.effects.ledger_app")
    module.CHANGED["write_removed"] = True
    wait_until_lease_lapsed(module.app, "gone")
    with pytest.raises(cairn.RunNeedsAttention, match="unresolved"):
        module.app.resume("gone")
    assert module.app.get_run("gone").status is RunStatus.NEEDS_ATTENTION
    [op] = module.app.operations("gone")
    assert op["status"] == "uncertain"
    assert op["operation_id"] == cairn.operation_id("gone", 0)
    assert len(kinds(module, "transfer")) == 1
