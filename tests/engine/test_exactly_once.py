"""The engine's exactly-once rules, attacked (issue 9 items 2-6, issue 10 items 3-4).

Each test plays the user's worst day: code that swallows every exception,
code changed under a journal, a rewind that re-sends with new arguments, a
hostile child id, a bank that keeps failing, a reconciler that lies or hangs,
a caller that cancels a write half-way.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time

import pytest

import cairn
from cairn.engine.signals import Release
from cairn.engine.tools import RECONCILE_RETRY
from cairn.store.records import EventType, RunFilter, RunStatus
from tests.engine.conftest import execute_once
from tests.timing import NAP, wait_out_nap

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
        ctx.sleep(NAP)
        return first + after()

    app.start(swallow, run_id="sw")
    assert execute_once(app, "sw") == "suspended"
    before = [e for e in app.history("sw") if e.position is not None]
    version["v"] = 2
    wait_out_nap()
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
            ctx.sleep(NAP)
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


# -- issue 9 item 5: no unbounded loops ----------------------------------------------------


def _not_found(op: cairn.Operation) -> cairn.NotFound:
    return cairn.NotFound()


@pytest.mark.timeout(30)
def test_failing_write_with_not_found_reconcile_follows_its_retry_policy(app: cairn.App) -> None:
    """Today: 44,808 sends in 3 s. The attempt raised and the world has no
    trace of it: the retry policy decides, with durable backoff."""
    sends: list[float] = []

    @app.tool(effect="write", reconcile=_not_found)
    def pay(amount: int) -> str:
        sends.append(time.monotonic())
        raise ConnectionError("bank down")

    @app.tool(effect="write", reconcile=_not_found,
              retry=cairn.RetryPolicy(max_attempts=3, initial_delay=0.1, backoff=1, jitter=0))
    def pay_retried(amount: int) -> str:
        sends.append(time.monotonic())
        raise ConnectionError("bank down")

    @app.workflow(name="once")
    def once(ctx: cairn.Context) -> str:
        return pay(5)

    @app.workflow(name="thrice")
    def thrice(ctx: cairn.Context) -> str:
        return pay_retried(5)

    with pytest.raises(cairn.RunFailed, match="bank down"):
        app.run(once, run_id="once")
    assert len(sends) == 1  # no retry policy: one send, then the step fails
    sends.clear()
    with pytest.raises(cairn.RunFailed, match="after 3 attempt"):
        app.run(thrice, run_id="thrice")
    assert len(sends) == 3
    assert all(b - a >= 0.09 for a, b in itertools.pairwise(sends))  # backoff between sends
    history = app.history("thrice")
    retried = [e for e in history if e.event is EventType.STEP_RETRIED]
    assert [e.attempt for e in retried] == [1, 2]
    assert all((e.detail or {}).get("next_at") for e in retried)  # the backoff is durable
    assert len([e for e in history if e.event is EventType.RUN_SUSPENDED]) == 2


@pytest.mark.timeout(30)
def test_timed_out_write_is_never_in_flight_twice(app: cairn.App) -> None:
    """A sync write times out but its thread goes on and lands later. It must
    be neither looked up nor re-sent while it runs: today six were in flight."""
    bank: dict[str, int] = {}
    in_flight = {"now": 0, "max": 0}
    sends: list[int] = []

    def lookup(op: cairn.Operation) -> cairn.Done[str] | cairn.NotFound:
        return cairn.Done(op.operation_id) if op.operation_id in bank else cairn.NotFound()

    @app.tool(effect="write", reconcile=lookup, timeout=0.05,
              retry=cairn.RetryPolicy(max_attempts=5, initial_delay=0, jitter=0),
              reconcile_retry=cairn.RetryPolicy(max_attempts=50, initial_delay=0.05, backoff=1, jitter=0))
    def pay(op: cairn.Operation, amount: int) -> str:
        sends.append(op.attempt)
        in_flight["now"] += 1
        in_flight["max"] = max(in_flight["max"], in_flight["now"])
        try:
            time.sleep(0.4)  # slow bank: lands long after the timeout
            bank[op.operation_id] = amount
            return op.operation_id
        finally:
            in_flight["now"] -= 1

    @app.workflow(name="slowpay")
    def slowpay(ctx: cairn.Context) -> str:
        return pay(9)

    assert app.run(slowpay, run_id="slow") == cairn.operation_id("slow", 0)
    assert in_flight["max"] == 1
    assert sends == [1]  # the first send landed; reconciliation found it
    assert list(bank.values()) == [9]


@pytest.mark.timeout(30)
def test_reconcile_answering_garbage_asks_an_operator(app: cairn.App) -> None:
    calls: list[int] = []

    def liar(op: cairn.Operation) -> object:
        calls.append(1)
        return "yes, probably"

    @app.tool(effect="write", reconcile=liar)  # type: ignore[arg-type]
    def pay(amount: int) -> str:
        raise ConnectionError("reset")

    @app.workflow(name="lied")
    def lied(ctx: cairn.Context) -> str:
        return pay(1)

    with pytest.raises(cairn.RunNeedsAttention, match=r"reconcile returned 'yes, probably', not Done"):
        app.run(lied, run_id="lied")
    assert calls == [1]
    [op] = app.operations("lied")
    assert op["status"] == "uncertain"


@pytest.mark.timeout(30)
def test_unknown_escalates_after_a_bounded_number_of_tries(app: cairn.App) -> None:
    calls: list[int] = []

    def unsure(op: cairn.Operation) -> cairn.Unknown:
        calls.append(1)
        return cairn.Unknown("bank is indexing")

    @app.tool(effect="write", reconcile=unsure,
              reconcile_retry=cairn.RetryPolicy(max_attempts=3, initial_delay=0.01, jitter=0))
    def pay(amount: int) -> str:
        raise ConnectionError("reset")

    @app.workflow(name="unsure")
    def unsure_wf(ctx: cairn.Context) -> str:
        return pay(1)

    with pytest.raises(cairn.RunNeedsAttention, match="could not tell after 3 tries: bank is indexing"):
        app.run(unsure_wf, run_id="unsure")
    assert len(calls) == 3
    assert RECONCILE_RETRY.max_attempts <= 100  # the default is bounded too


@pytest.mark.timeout(30)
def test_a_hanging_reconcile_times_out(app: cairn.App) -> None:
    gate = threading.Event()
    calls: list[int] = []

    def hangs(op: cairn.Operation) -> cairn.Done[int]:
        calls.append(1)
        if len(calls) == 1:
            gate.wait(25)  # the bank's lookup hangs
        return cairn.Done(1)

    @app.tool(effect="write", reconcile=hangs, timeout=0.2,
              reconcile_retry=cairn.RetryPolicy(max_attempts=5, initial_delay=0.01, jitter=0))
    def pay(amount: int) -> int:
        raise ConnectionError("reset")

    @app.workflow(name="hung")
    def hung(ctx: cairn.Context) -> int:
        return pay(1)

    started = time.monotonic()
    try:
        assert app.run(hung, run_id="hung") == 1
    finally:
        gate.set()
    assert time.monotonic() - started < 5
    assert len(calls) == 2
    unknown = [e.detail for e in app.history("hung") if e.event is EventType.OP_RECONCILED]
    assert "did not return within 0.2s" in str(unknown[0])


# -- issue 10 item 3: cancellation is an outcome, not a crash ------------------------------


@pytest.mark.timeout(30)
def test_a_step_raising_cancelled_error_is_a_recorded_failure(app: cairn.App) -> None:
    attempts: list[int] = []

    @app.step()
    async def flaky() -> str:
        attempts.append(1)
        raise asyncio.CancelledError  # e.g. awaited a future someone else cancelled

    @app.step(retry=cairn.RetryPolicy(max_attempts=2, initial_delay=0, jitter=0))
    async def flaky_once() -> str:
        attempts.append(2)
        if attempts.count(2) == 1:
            raise asyncio.CancelledError
        return "ok"

    @app.workflow(name="cancels")
    async def cancels(ctx: cairn.Context) -> str:
        return await flaky()

    @app.workflow(name="recovers")
    async def recovers(ctx: cairn.Context) -> str:
        return await flaky_once()

    app.start(cancels, run_id="cx")
    assert execute_once(app, "cx") == "failed"  # not a crash of the executor
    run = app.get_run("cx")
    assert run.status is RunStatus.FAILED
    assert run.recoveries == 0
    failed = [e for e in app.history("cx") if e.event is EventType.STEP_FAILED]
    assert [(e.detail or {})["error"]["type"] for e in failed] == ["CallCancelled"]
    assert app.run(recovers, run_id="cy") == "ok"  # retried by the step's policy
    assert attempts == [1, 2, 2]


@pytest.mark.timeout(30)
def test_a_write_cancelled_by_its_callers_wait_for_is_not_left_uncertain(app: cairn.App) -> None:
    """The effect landed, then the caller's ``wait_for`` cancelled the tool:
    the run must not complete over an uncertain operation."""
    bank: list[int] = []

    @app.tool(effect="write")
    async def pay(amount: int) -> str:
        bank.append(amount)  # the bank got it ...
        await asyncio.sleep(5)  # ... and the answer is slow
        return "receipt"

    @app.workflow(name="impatient")
    async def impatient(ctx: cairn.Context) -> str:
        try:
            return await asyncio.wait_for(pay(10), 0.05)
        except TimeoutError:
            return "gave up"

    with pytest.raises(cairn.RunNeedsAttention, match="unresolved"):
        app.run(impatient, run_id="imp")
    assert app.get_run("imp").status is RunStatus.NEEDS_ATTENTION
    [op] = app.operations("imp")
    assert op["status"] == "uncertain"
    assert bank == [10]


# -- issue 10 item 4: wrong shapes fail at once --------------------------------------------


@pytest.mark.timeout(30)
def test_an_async_step_in_a_sync_workflow_fails_at_the_call(app: cairn.App) -> None:
    ran: list[int] = []

    @app.step()
    async def fetch() -> int:
        ran.append(1)
        return 1

    @app.workflow(name="mismatched")
    def mismatched(ctx: cairn.Context) -> str:
        fetch()  # a coroutine nobody awaits: today the step is silently skipped
        return "completed?"

    with pytest.raises(cairn.RunFailed, match="async step 'fetch' called from a sync workflow"):
        app.run(mismatched, run_id="mm")
    assert ran == []


@pytest.mark.timeout(30)
def test_await_ctx_sleep_works_in_an_async_workflow(app: cairn.App) -> None:
    @app.workflow(name="napper")
    async def napper(ctx: cairn.Context) -> str:
        await ctx.sleep(NAP)
        ctx.sleep(0.01)  # without await as well
        return "rested"

    app.start(napper, run_id="nap")
    assert execute_once(app, "nap") == "suspended"
    assert app.resume("nap") == "rested"


@pytest.mark.timeout(30)
def test_a_squatted_derived_child_id_neither_fails_nor_feeds_the_parent(app: cairn.App) -> None:
    """Another tenant guessed the derived id of a parent's first child and
    created it first, with a result of its choosing. The parent neither
    adopts it nor fails (a squatter must not be able to stop another
    tenant's run): its child takes an id nobody can guess, recorded with the
    child's start, and replay reads that id back."""
    @app.workflow(name="kid")
    def kid(ctx: cairn.Context) -> str:
        return "genuine"

    @app.workflow(name="forged")
    def forged(ctx: cairn.Context) -> str:
        return "forged result"

    @app.workflow(name="family")
    def family(ctx: cairn.Context) -> str:
        return str(ctx.child(kid))

    assert app.run(forged, run_id="fam:0", tenant="mallory") == "forged result"
    assert app.run(family, run_id="fam", tenant="alice") == "genuine"
    assert len([e for e in app.history("fam") if e.step_kind == "child"]) == 1
    (child,) = app.store.list_runs(RunFilter(parent_run_id="fam"))
    assert child.tenant == "alice"
    assert child.status is RunStatus.COMPLETED
    assert child.run_id.startswith("fam:0~")
    assert len(child.run_id) == len("fam:0~") + 16
    # replayed from the journal (a worker taking the run over), the parent reads the same child back
    assert app.resume("fam") == "genuine"
    assert [r.run_id for r in app.store.list_runs(RunFilter(parent_run_id="fam"))] == [child.run_id]
    squatter = app.get_run("fam:0")
    assert (squatter.tenant, squatter.parent_run_id) == ("mallory", None)  # left untouched


@pytest.mark.timeout(30)
def test_a_workflow_raising_cancelled_error_fails_instead_of_crashing(app: cairn.App) -> None:
    @app.workflow(name="self_cancel")
    async def self_cancel(ctx: cairn.Context) -> str:
        doomed = asyncio.get_running_loop().create_future()
        doomed.cancel()
        return str(await doomed)  # a CancelledError nobody asked for

    app.start(self_cancel, run_id="sc")
    assert execute_once(app, "sc") == "failed"
    run = app.get_run("sc")
    assert run.error is not None
    assert run.error["type"] == "CallCancelled"


@pytest.mark.timeout(30)
def test_a_hanging_sync_reconcile_times_out_in_an_async_workflow(app: cairn.App) -> None:
    """The async path ran plain functions without their timeout: a sync
    reconciler of an async tool that hangs held the run forever."""
    gate = threading.Event()
    calls: list[int] = []

    def hangs(op: cairn.Operation) -> cairn.Done[int]:
        calls.append(1)
        if len(calls) == 1:
            gate.wait(25)
        return cairn.Done(1)

    @app.tool(effect="write", reconcile=hangs, timeout=0.2,
              reconcile_retry=cairn.RetryPolicy(max_attempts=5, initial_delay=0.01, jitter=0))
    async def pay(amount: int) -> int:
        raise ConnectionError("reset")

    @app.workflow(name="hung_async")
    async def hung_async(ctx: cairn.Context) -> int:
        return await pay(1)

    started = time.monotonic()
    try:
        assert app.run(hung_async, run_id="hung-async") == 1
    finally:
        gate.set()
    assert time.monotonic() - started < 5
    assert len(calls) == 2

