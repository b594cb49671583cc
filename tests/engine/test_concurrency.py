"""Concurrency inside one run (issue 10, items 1, 2 and 11).

An execution owns every task and thread it starts: when it ends (suspension,
retry backoff, release, completion), every journaled call still in flight in a
sibling task or thread finishes and is recorded, and everything else is
cancelled, *before* the run can be claimed again. Journaled calls made from
several threads of one run are serialized: no two share a position or a
history ``seq``, and a replay in which the threads race differently matches
each call to its own record.

The attacks are the ones a user writes on the first day: ``asyncio.gather``
of a payment and a flaky step, a ``create_task`` nobody awaits, a thread pool
left running, ``gather`` over ``asyncio.to_thread``.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn.store.records import EventType, HistoryEvent, RunStatus
from tests.timing import NAP

pytestmark = pytest.mark.timeout(120)

FLAKY = cairn.RetryPolicy(max_attempts=3, initial_delay=0.05, backoff=1.0, jitter=0)


class Bank:
    """The outside world of a payment: what landed, by operation id, and how
    many attempts were ever sent (a second send of one operation is the bug)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent: list[str] = []
        self.landed: dict[str, int] = {}

    def send(self, op: cairn.Operation, amount: int) -> None:
        with self.lock:
            self.sent.append(op.operation_id)

    def land(self, op: cairn.Operation, amount: int) -> str:
        with self.lock:
            self.landed[op.operation_id] = amount
        return f"tx-{op.operation_id[:8]}"

    def reconcile(self, op: cairn.Operation) -> cairn.Done[str] | cairn.NotFound:
        with self.lock:
            if op.operation_id in self.landed:
                return cairn.Done(f"tx-{op.operation_id[:8]}")
        return cairn.NotFound()

    def assert_paid_once(self) -> None:
        assert len(self.sent) == len(set(self.sent)), (
            f"one operation was sent {len(self.sent)} times ({self.sent}): a payment made twice")


def run_in_thread(fn: Callable[[], Any], timeout: float = 30.0) -> Any:
    """``fn()`` in a daemon thread; fail (not hang) if it does not return."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # reported below
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"still blocked after {timeout}s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def flaky_step(app: cairn.App, name: str, fails: int = 1) -> Any:
    attempts: list[int] = []

    @app.step(name=name, retry=FLAKY)
    async def flaky() -> str:
        attempts.append(1)
        await asyncio.sleep(0.01)
        if len(attempts) <= fails:
            raise ConnectionError("flaky")
        return "ok"

    return flaky


def positions_and_seqs(history: list[HistoryEvent]) -> None:
    seqs = [e.seq for e in history]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), f"seq not gap-free: {seqs}"
    done = [e.position for e in history if e.event is EventType.STEP_COMPLETED]
    assert len(done) == len(set(done)), f"two outcomes at one position: {done}"


# -- item 1: the execution owns its tasks ---------------------------------------------------------


@pytest.mark.parametrize("ending", ["retry", "sleep", "failure"])
def test_gather_payment_with_a_sibling_that_ends_the_execution_pays_once(app: cairn.App, ending: str) -> None:
    """The issue's duplicate payment: a sibling ends the execution (a retry
    backoff, a durable sleep, a terminal failure) while the transfer is
    mid-flight. The claim must not end until the transfer has landed and is
    recorded; the next execution (if any) replays it, never resends it."""
    bank = Bank()

    @app.tool(effect="write", reconcile=bank.reconcile)
    async def transfer(op: cairn.Operation, amount: int) -> str:
        bank.send(op, amount)
        await asyncio.sleep(0.3)  # the bank is slow: the sibling ends the execution meanwhile
        return bank.land(op, amount)

    flaky = flaky_step(app, "flaky")

    @app.step()
    async def refuse() -> str:
        raise cairn.TerminalError("no")

    @app.workflow(name="pay")
    async def pay(ctx: cairn.Context) -> list[str]:
        async def sibling() -> str:
            if ending == "sleep":
                ctx.sleep(NAP)  # suspends, however slow the commit of its deadline
                return "ok"
            return str(await (flaky() if ending == "retry" else refuse()))

        return list(await asyncio.gather(transfer(500), sibling()))

    if ending == "failure":
        with pytest.raises(cairn.RunFailed):
            run_in_thread(lambda: app.run(pay, run_id="pay-1"))
        last = EventType.RUN_FAILED
    else:
        assert run_in_thread(lambda: app.run(pay, run_id="pay-1"))[1] == "ok"
        last = EventType.RUN_SUSPENDED
    bank.assert_paid_once()
    assert len(bank.landed) == 1
    history = app.history("pay-1")
    positions_and_seqs(history)
    ended = next(e for e in history if e.event is last)
    transfer_done = next(e for e in history if e.event is EventType.STEP_COMPLETED and e.name == "transfer")
    assert transfer_done.seq < ended.seq, f"the execution ended ({last}) while its transfer was in flight"


def test_gather_plain_step_body_runs_once(app: cairn.App) -> None:
    bodies: list[float] = []

    @app.step()
    async def slow() -> int:
        bodies.append(time.time())
        await asyncio.sleep(0.3)
        return 7

    flaky = flaky_step(app, "flaky2")

    @app.workflow(name="both")
    async def both_steps(ctx: cairn.Context) -> int:
        value, _ = await asyncio.gather(slow(), flaky())
        return int(value)

    assert run_in_thread(lambda: app.run(both_steps, run_id="both-1")) == 7
    assert len(bodies) == 1, f"the slow step's body ran {len(bodies)} times for one recorded step"
    positions_and_seqs(app.history("both-1"))


def test_to_thread_payment_with_flaky_step_pays_once(app: cairn.App) -> None:
    """Thread variant: the sync transfer runs in ``asyncio.to_thread``; the
    thread cannot be cancelled, so the suspension must wait for it."""
    bank = Bank()

    @app.tool(effect="write", reconcile=bank.reconcile)
    def transfer(op: cairn.Operation, amount: int) -> str:
        bank.send(op, amount)
        time.sleep(0.3)
        return bank.land(op, amount)

    flaky = flaky_step(app, "flaky3")

    @app.workflow(name="pay_thread")
    async def pay_thread(ctx: cairn.Context) -> list[str]:
        return list(await asyncio.gather(asyncio.to_thread(transfer, 500), flaky()))

    result = run_in_thread(lambda: app.run(pay_thread, run_id="pay-t"))
    assert result[1] == "ok"
    bank.assert_paid_once()
    positions_and_seqs(app.history("pay-t"))


def test_sync_workflow_thread_pool_payment_pays_once(app: cairn.App) -> None:
    """Sync variant: a pool the workflow does not wait for (``shutdown(wait=False)``)
    runs the transfer while the main flow's flaky step suspends the run."""
    bank = Bank()

    @app.tool(effect="write", reconcile=bank.reconcile)
    def transfer(op: cairn.Operation, amount: int) -> str:
        bank.send(op, amount)
        time.sleep(0.3)
        return bank.land(op, amount)

    attempts: list[int] = []

    @app.step(retry=FLAKY)
    def flaky() -> str:
        attempts.append(1)
        time.sleep(0.02)
        if len(attempts) == 1:
            raise ConnectionError("flaky")
        return "ok"

    @app.workflow(name="pay_pool")
    def pay_pool(ctx: cairn.Context) -> list[str]:
        pool = ThreadPoolExecutor(1)
        try:
            paid = pool.submit(contextvars.copy_context().run, transfer, 500)
            return [flaky(), paid.result()]
        finally:
            pool.shutdown(wait=False)

    result = run_in_thread(lambda: app.run(pay_pool, run_id="pay-p"))
    assert result[0] == "ok"
    bank.assert_paid_once()
    positions_and_seqs(app.history("pay-p"))


def test_a_timed_out_sync_write_is_not_reconciled_while_its_thread_runs(app: cairn.App) -> None:
    """A sync write tool over its ``timeout`` goes on in a thread nobody can
    stop. Reconciling it while that thread may still send finds nothing (the
    bank has not seen it yet) and sends it again: the reconciliation must wait
    for the attempt to return."""
    bank = Bank()

    @app.tool(effect="write", reconcile=bank.reconcile, timeout=0.05)
    def transfer(op: cairn.Operation, amount: int) -> str:
        bank.send(op, amount)
        time.sleep(0.4)
        return bank.land(op, amount)

    @app.workflow(name="pay_slow")
    def pay_slow(ctx: cairn.Context) -> str:
        return transfer(500)

    receipt = run_in_thread(lambda: app.run(pay_slow, run_id="pay-s"))
    bank.assert_paid_once()
    assert receipt == f"tx-{cairn.operation_id('pay-s', 0)[:8]}"
    reconciled = [e for e in app.history("pay-s") if e.event is EventType.STEP_COMPLETED]
    assert (reconciled[0].detail or {}).get("reconciled") == "done"


def test_pending_task_of_one_run_never_runs_in_a_later_run(app: cairn.App) -> None:
    """A ``create_task`` nobody awaits: when its run ends, the task has either
    finished (and its step is recorded) or been cancelled: it never runs
    during another run's execution on the same thread."""
    seen: list[tuple[str, float]] = []

    @app.step()
    async def straggle() -> int:
        seen.append(("begin", time.time()))
        await asyncio.sleep(0.2)
        seen.append(("end", time.time()))
        return 1

    @app.workflow(name="leaky")
    async def leaky(ctx: cairn.Context) -> int:
        task = asyncio.create_task(straggle())
        await asyncio.sleep(0)  # the task starts its step
        del task
        return 0

    @app.workflow(name="later")
    async def later(ctx: cairn.Context) -> int:
        await asyncio.sleep(0.5)  # the leaked task would run here, on the reused loop
        return 2

    def both_runs() -> None:
        app.run(leaky, run_id="leaky-1")
        app.run(later, run_id="later-1")

    run_in_thread(both_runs)
    finished = app.get_run("leaky-1")
    assert finished is not None
    assert finished.status is RunStatus.COMPLETED
    ended = app.history("leaky-1")[-1].at
    assert all(at <= ended for _, at in seen), f"a step of leaky-1 ran after it completed: {seen} > {ended}"
    recorded = [e for e in app.history("leaky-1") if e.event is EventType.STEP_COMPLETED]
    assert len(recorded) == len([k for k, _ in seen if k == "end"]), (
        "a step body that finished before its run completed must be recorded")


def test_a_thread_left_behind_cannot_call_into_its_ended_run(app: cairn.App) -> None:
    """A thread the workflow started and forgot (it carries the run's
    context) wakes up after the run completed: its step must not run at all,
    rather than send its effect and then fail to record it."""
    bodies: list[str] = []
    outcome: list[BaseException] = []
    done = threading.Event()

    @app.step()
    def late() -> int:
        bodies.append("late")
        return 1

    def straggler() -> None:
        time.sleep(0.2)
        try:
            late()
        except BaseException as exc:  # what the thread sees
            outcome.append(exc)
        finally:
            done.set()

    @app.workflow(name="forgetful")
    def forgetful(ctx: cairn.Context) -> int:
        context = contextvars.copy_context()
        threading.Thread(target=context.run, args=(straggler,), daemon=True).start()
        return 0

    assert run_in_thread(lambda: app.run(forgetful, run_id="forget-1")) == 0
    assert done.wait(5)
    assert bodies == [], "a step of a completed run ran in a thread it had left behind"
    assert outcome, "the late call should have been refused"
    assert app.history("forget-1")[-1].event is EventType.RUN_COMPLETED


# -- item 2: journaled calls from several threads ----------------------------------------------


def _threaded_app(app: cairn.App, n: int) -> tuple[Any, list[int], list[int]]:
    bodies: list[int] = []
    failed: list[int] = []
    lock = threading.Lock()

    @app.step(retry=FLAKY)
    def square(i: int) -> int:
        with lock:
            bodies.append(i)
            first = i == n - 1 and not failed
            if first:
                failed.append(i)
        time.sleep(0.01 * (i % 3))
        if first:  # one step fails once: the run suspends and replays with the threads racing anew
            raise ConnectionError("flaky")
        return i * i

    @app.workflow(name="threads")
    async def threads(ctx: cairn.Context, n: int) -> int:
        results = await asyncio.gather(*(asyncio.to_thread(square, i) for i in range(n)))
        return sum(results) + await asyncio.to_thread(square, 100)

    return threads, bodies, failed


def _check_threaded(app: cairn.App, run_id: str, n: int, result: int, bodies: list[int]) -> None:
    assert result == sum(i * i for i in range(n)) + 100 * 100
    counts = {i: bodies.count(i) for i in set(bodies)}
    expected = {i: 1 for i in range(n)} | {n - 1: 2, 100: 1}
    assert counts == expected, f"step bodies ran {counts}, expected {expected}"
    history = app.history(run_id)
    positions_and_seqs(history)
    kinds = {e.event for e in history}
    assert EventType.LEASE_TAKEN_OVER not in kinds
    assert EventType.LEASE_LOST not in kinds
    done = sorted(e.position for e in history if e.event is EventType.STEP_COMPLETED
                  and e.position is not None)
    assert done == list(range(n + 1))


@pytest.mark.parametrize("n", [8, 24])
def test_gather_to_thread_steps_inline(app: cairn.App, n: int) -> None:
    threads, bodies, _ = _threaded_app(app, n)
    result = run_in_thread(lambda: app.run(threads, n, run_id="threads-1"))
    _check_threaded(app, "threads-1", n, result, bodies)


def test_gather_to_thread_steps_under_a_worker(app: cairn.App) -> None:
    n = 8
    threads, bodies, _ = _threaded_app(app, n)
    handle = app.start(threads, n, run_id="threads-w")
    worker = app.worker(concurrency=2, worker_id="threads-w", poll_interval=0.01)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False, "max_idle": 1.0},
                              daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the worker did not go idle"
    _check_threaded(app, "threads-w", n, handle.result(timeout=1), bodies)


def test_threads_of_a_sync_workflow_never_collide(app: cairn.App) -> None:
    """Sync variant: a pool of threads calling steps and ``ctx.now()`` at once."""
    bodies: list[int] = []

    @app.step()
    def cube(i: int) -> int:
        bodies.append(i)
        return i ** 3

    @app.workflow(name="pool")
    def pool_flow(ctx: cairn.Context, n: int) -> int:
        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(contextvars.copy_context().run, cube, i) for i in range(n)]
            clocks = [pool.submit(contextvars.copy_context().run, ctx.now) for _ in range(n)]
            total = sum(f.result() for f in futures)
            for clock in clocks:
                clock.result()
        return total

    for attempt in range(3):
        run_id = f"pool-{attempt}"
        total = run_in_thread(lambda run_id=run_id: app.run(pool_flow, 16, run_id=run_id))
        assert total == sum(i ** 3 for i in range(16))
        positions_and_seqs(app.history(run_id))
    assert len(bodies) == 16 * 3


# -- item 11: event loops are closed ----------------------------------------------------------------


def test_worker_threads_leave_no_unclosed_event_loop(app: cairn.App) -> None:
    @app.workflow(name="tiny")
    async def tiny(ctx: cairn.Context) -> int:
        await asyncio.sleep(0)
        return 1

    for i in range(3):
        app.start(tiny, run_id=f"tiny-{i}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        worker = app.worker(concurrency=2, worker_id="tiny-w", poll_interval=0.01)
        thread = threading.Thread(target=worker.run, kwargs={"install_signals": False, "max_idle": 0.5},
                                  daemon=True)
        thread.start()
        thread.join(30)
        assert not thread.is_alive()
        del worker, thread
        gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert not leaks, f"unclosed resources after the worker exited: {leaks}"
    assert all(app.get_run(f"tiny-{i}").status is RunStatus.COMPLETED for i in range(3))  # type: ignore[union-attr]


def test_closing_an_app_closes_the_event_loops_of_its_inline_runs(tmp_path: Path) -> None:
    """``app.run`` of an async workflow leaves a loop on the calling thread;
    ``App.close`` closes it (an unclosed loop is a ResourceWarning at exit)."""
    app = cairn.App(db=f"sqlite:///{tmp_path}/c.db")

    @app.workflow(name="a")
    async def a(ctx: cairn.Context) -> int:
        await asyncio.sleep(0)
        return 1

    loops: list[asyncio.AbstractEventLoop] = []

    def run() -> None:
        assert app.run(a) == 1
        loops.append(app._inline().loops.get())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert loops
    assert not loops[0].is_closed()
    app.close()
    assert loops[0].is_closed()
