"""The engine's exactly-once rules, attacked (issue 9 items 2-6, issue 10 items 3-4).

Each test plays the user's worst day: code that swallows every exception,
code changed under a journal, a rewind that re-sends with new arguments, a
hostile child id, a bank that keeps failing, a reconciler that lies or hangs,
a caller that cancels a write half-way.
"""

from __future__ import annotations

import time

import pytest

import cairn
from cairn.engine.signals import Release
from cairn.store.records import RunStatus
from tests.engine.conftest import execute_once

# -- issue 9 item 4: the replay guard cannot be swallowed or skipped ----------------------


def test_nondeterminism_cannot_be_swallowed_by_except_exception(app: cairn.App) -> None:
    """The everyday agent pattern ``try: tool() except Exception:`` must not
    hide a changed journal: the run fails and writes nothing on top of it."""
    version = {"v": 1}

    @app.step()
    def a() -> str:
        return "a"

    @app.step()
    def b() -> str:
        return "b"

    @app.step()
    def after() -> str:
        return "after"

    @app.workflow(name="swallow")
    def swallow(ctx: cairn.Context) -> str:
        try:
            first = a() if version["v"] == 1 else b()
        except Exception:  # the agent's "never crash" habit
            first = "fallback"
        ctx.sleep(0.05)
        return first + after()

    app.start(swallow, run_id="sw")
    assert execute_once(app, "sw") == "suspended"
    before = [e for e in app.history("sw") if e.position is not None]
    version["v"] = 2
    time.sleep(0.06)
    with pytest.raises(cairn.RunFailed, match="NonDeterminismError"):
        app.resume("sw")
    assert app.get_run("sw").status is RunStatus.FAILED
    assert [e for e in app.history("sw") if e.position is not None] == before
    assert not issubclass(cairn.NonDeterminismError, Exception)


def test_code_that_ends_before_its_journal_fails(app: cairn.App) -> None:
    """A removed call: the new code finishes at position 1 while the journal
    records a step at position 2. The run must not complete silently."""
    version = {"v": 1}

    @app.step()
    def a() -> str:
        return "a"

    @app.step()
    def extra() -> str:
        return "extra"

    @app.workflow(name="shorter")
    def shorter(ctx: cairn.Context) -> str:
        a()
        if version["v"] == 1:
            extra()
            ctx.sleep(0.05)
        return "done"

    app.start(shorter, run_id="short")
    assert execute_once(app, "short") == "suspended"
    version["v"] = 2
    with pytest.raises(cairn.RunFailed, match="NonDeterminismError"):
        app.resume("short")
    run = app.get_run("short")
    assert run.status is RunStatus.FAILED
    assert run.error is not None
    assert "step 'extra'" in run.error["message"]


def test_removed_write_call_leaves_no_uncertain_effect_on_a_completed_run(app: cairn.App) -> None:
    """The write's intent is durable, the worker dies (simulated by a body that
    never records), then the code no longer makes the call: the uncertain
    effect must go to an operator, not vanish under a completed run."""
    version = {"v": 1}

    @app.tool(effect="write")
    def pay(amount: int) -> str:
        raise Release("drained right after sending")  # the intent stays, no outcome

    @app.workflow(name="removed")
    def removed(ctx: cairn.Context) -> str:
        if version["v"] == 1:
            pay(5)
        return "done"

    app.start(removed, run_id="rm")
    assert execute_once(app, "rm") == "released"
    version["v"] = 2
    with pytest.raises(cairn.RunNeedsAttention) as caught:
        app.resume("rm")
    assert caught.value.run_id == "rm"
    run = app.get_run("rm")
    assert run.status is RunStatus.NEEDS_ATTENTION
    [op] = app.operations("rm")
    assert op["status"] == "uncertain"


# -- issue 9 item 6: no silent hangs ----------------------------------------------------


@pytest.mark.timeout(30)
def test_run_over_budget_raises_instead_of_polling_forever(app: cairn.App) -> None:
    @app.tool(effect="read")
    def look() -> int:
        return 1

    @app.workflow(name="greedy")
    def greedy(ctx: cairn.Context) -> int:
        return sum(look() for _ in range(5))

    with pytest.raises(cairn.RunSuspended, match="budget_exceeded") as caught:
        app.run(greedy, run_id="greedy", budget=cairn.Budget(tool_calls=2))
    assert (caught.value.run_id, caught.value.status) == ("greedy", "suspended")
    with pytest.raises(cairn.RunSuspended):  # resume says the same, at once
        app.resume("greedy")
    app.set_budget("greedy", cairn.Budget(tool_calls=10))
    assert app.resume("greedy") == 5


@pytest.mark.timeout(30)
def test_run_that_needs_an_operator_raises_with_its_status(app: cairn.App) -> None:
    @app.tool(effect="write")
    def pay(amount: int) -> str:
        raise ConnectionError("reset after sending")  # uncertain; no reconcile

    @app.workflow(name="stuck")
    def stuck(ctx: cairn.Context) -> str:
        return pay(5)

    @app.workflow(name="parent")
    def parent(ctx: cairn.Context) -> str:
        return str(ctx.child(stuck))

    with pytest.raises(cairn.RunNeedsAttention, match="raised ConnectionError: reset") as caught:
        app.run(stuck, run_id="stuck")
    assert (caught.value.run_id, caught.value.status) == ("stuck", "needs_attention")
    with pytest.raises(cairn.RunNeedsAttention):
        app.resume("stuck")
    # a parent waiting on such a child is blocked with it, and says so
    with pytest.raises(cairn.RunNeedsAttention, match=r"child run 'p:0'.*needs_attention") as blocked:
        app.run(parent, run_id="p")
    assert blocked.value.run_id == "p"


# -- issue 9 item 2: operation ids stay unique after a rewind ------------------------------


class Bank:
    """Deduplicates by idempotency key, like a real payment API."""

    def __init__(self) -> None:
        self.transfers: dict[str, int] = {}

    def transfer(self, key: str, amount: int) -> dict[str, object]:
        self.transfers.setdefault(key, amount)
        return {"key": key, "amount": self.transfers[key]}


def test_rewound_write_with_new_arguments_lands_under_a_new_stable_key(app: cairn.App) -> None:
    bank = Bank()
    keys_seen: list[tuple[str, int]] = []

    @app.tool(effect="write", retry=cairn.RetryPolicy(max_attempts=2, initial_delay=0, jitter=0))
    def pay(op: cairn.Operation, amount: int) -> dict[str, object]:
        keys_seen.append((op.operation_id, op.attempt))
        if amount > 100 and op.attempt == 1:
            raise cairn.EffectNotApplied("bank busy")  # a definite failure: retried, same key
        return bank.transfer(op.operation_id, amount)

    @app.step()
    def decide(amount: int) -> int:
        return amount

    @app.step()
    def key_of_step() -> str:
        return cairn.step_info().operation_id

    @app.workflow(name="checked")
    def checked(ctx: cairn.Context) -> dict[str, object]:
        amount = decide(50 + 100 * len(ctx.rewinds()))
        receipt = pay(amount)
        step_key = key_of_step()
        if not ctx.rewinds():
            raise cairn.LogicalFailure("wrong amount", rewind_to="decide")
        return {**receipt, "step_key": step_key}

    result = app.run(checked, run_id="chk")
    assert sorted(bank.transfers.values()) == [50, 150]  # both effects landed, once each
    assert result["amount"] == 150  # the run reports the new receipt, not the old one
    first, retried, second = keys_seen
    assert first == (cairn.operation_id("chk", 1), 1)  # never rewound here: the original key
    assert retried == (cairn.operation_id("chk", 1, 1), 1)
    assert second == (retried[0], 2)  # a retry of the one effect keeps its key
    assert result["step_key"] == cairn.operation_id("chk", 2, 1)  # step_info() agrees
    assert {op["operation_id"] for op in app.operations("chk")} == {retried[0]}


# -- issue 9 item 3: child run ids are scoped ----------------------------------------------


@pytest.mark.timeout(30)
def test_child_id_naming_another_tenants_run_is_refused(app: cairn.App) -> None:
    @app.workflow(name="secret")
    def secret(ctx: cairn.Context) -> str:
        return "tenant B's secret"

    @app.workflow(name="thief")
    def thief(ctx: cairn.Context, target: str) -> str:
        return str(ctx.child(secret, run_id=target))

    assert app.run(secret, run_id="b-secret", tenant="b") == "tenant B's secret"
    with pytest.raises(cairn.RunFailed, match="not a child of run 'thief'") as caught:
        app.run(thief, "b-secret", run_id="thief", tenant="a")
    assert "secret" not in caught.value.error.replace("b-secret", "")  # nothing of B's result leaks
    history = app.history("thief")
    assert not [e for e in history if e.step_kind == "child"]  # nothing recorded for the refused child
    # a live unrelated run (no worker serves it) does not leave the parent suspended forever
    app.start(secret, run_id="b-live", tenant="b")
    with pytest.raises(cairn.RunFailed, match="InvalidArgument"):
        app.run(thief, "b-live", run_id="thief-2", tenant="a")
    assert app.get_run("b-live").status is RunStatus.PENDING  # and it is left untouched


@pytest.mark.timeout(30)
def test_child_adopted_through_a_race_is_never_read(app: cairn.App, monkeypatch: pytest.MonkeyPatch) -> None:
    """The unrelated run appears between the check and the start: the
    parent's wait still refuses to read it."""
    @app.workflow(name="other")
    def other(ctx: cairn.Context) -> str:
        return "not yours"

    @app.workflow(name="racer")
    def racer(ctx: cairn.Context) -> str:
        return str(ctx.child(other, run_id="raced"))

    assert app.run(other, run_id="raced", tenant="b") == "not yours"
    real_get = app.store.get_run
    hidden = {"raced"}

    def racing_get(run_id: str) -> cairn.RunRecord | None:
        if run_id in hidden:
            hidden.discard(run_id)  # the first look misses it, as if it did not exist yet
            return None
        return real_get(run_id)

    monkeypatch.setattr(app.store, "get_run", racing_get)
    with pytest.raises(cairn.RunFailed, match="not a child of run 'racer'"):
        app.run(racer, run_id="racer", tenant="b")
