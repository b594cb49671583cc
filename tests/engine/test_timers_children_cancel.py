"""Durable timers, child workflows and cancellation."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

import cairn
from cairn.store.records import EventType, RunStatus
from tests.engine.conftest import Calls, execute_once
from tests.engine.kinds import Flow, Kind, both
from tests.timing import NAP, SLACK, napped, wait_out_nap


def test_timer_suspends_frees_the_worker_and_survives_a_restart(tmp_path: Path, calls: Calls) -> None:
    db = f"sqlite:///{tmp_path}/t.db"

    def build() -> tuple[cairn.App, cairn.Workflow[str]]:
        app = cairn.App(db=db)

        @app.step()
        def before() -> str:
            calls.hit("before")
            return "b"

        @app.step()
        def after() -> str:
            calls.hit("after")
            return "a"

        @app.workflow(name="nap")
        def nap(ctx: cairn.Context) -> str:
            x = before()
            ctx.sleep(NAP)  # not due before its entry commits, nor before the checks below
            return x + after()

        return app, nap

    app, nap = build()
    app.start(nap, run_id="n")
    assert execute_once(app, "n") == "suspended"
    run = app.get_run("n")
    assert run.status is RunStatus.SUSPENDED
    assert run.owner is None
    assert run.wake_at is not None
    assert run.wake_at > time.time()
    assert app.store.claim_run("n", "other", 5.0, 5) is None  # not due yet
    app.close()  # the process "restarts"

    app2, _ = build()
    wait_out_nap()
    assert app2.resume("n") == "ba"
    assert calls.counts == {"before": 1, "after": 1}
    events = [e.event for e in app2.history("n")]
    assert EventType.RUN_SUSPENDED in events
    assert EventType.RUN_WOKEN in events
    app2.close()


@both
def test_child_workflow_has_its_own_journal(app: cairn.App, kind: Kind, calls: Calls) -> None:
    def work_body(x: int) -> int:
        calls.hit(f"work{x}")
        return x * 3

    work = app.step(name="work")(kind.fn(work_body))

    @kind.workflow(app, "child")
    def child(ctx: cairn.Context, x: int) -> Flow[int]:
        return (yield work(x))

    @kind.workflow(app, "parent")
    def parent(ctx: cairn.Context) -> Flow[list[int]]:
        first = yield ctx.child(child, 1)
        handle = ctx.start_child(child, 2)
        return [first, (yield handle.result())]

    assert app.run(parent, run_id="p", tenant="t1", thread_id="th") == [3, 6]
    children = app.store.list_runs(cairn.store.records.RunFilter(parent_run_id="p"))
    assert sorted(c.run_id for c in children) == ["p:0", "p:2"]
    assert all(c.tenant == "t1" and c.thread_id == "th" and c.status is RunStatus.COMPLETED for c in children)
    assert calls.counts == {"work1": 1, "work2": 1}
    # the parent waited without holding a worker: it suspended on each child
    waits = [e for e in app.history("p") if e.event is EventType.RUN_SUSPENDED]
    assert [w.detail and w.detail["waiting_on"] for w in waits] == ["p:0", "p:2"]
    started = [e for e in app.history("p") if e.step_kind == "child"]
    assert [(e.position, e.name, e.epoch) for e in started] == [(0, "child", 1), (2, "child", 2)]


@both
def test_child_failure_raises_child_failed(app: cairn.App, kind: Kind) -> None:
    @kind.workflow(app, "bad_child")
    def bad_child(ctx: cairn.Context) -> Flow[int]:
        raise RuntimeError("child broke")
        yield

    @kind.workflow(app, "parent2")
    def parent2(ctx: cairn.Context) -> Flow[str]:
        try:
            yield ctx.child(bad_child)
        except cairn.ChildFailed as failure:
            outcome = f"{failure.status}: {failure.error}"
        ctx.sleep(NAP)  # the second pass raises the recorded failure again, without asking the store
        return outcome

    assert app.run(parent2, run_id="p2") == "failed: child broke"
    before, after = napped(app.history("p2"))
    assert [e.step_kind for e in before] == ["child", "wait", "sleep"]
    assert after == []
    [failed] = [e for e in app.history("p2") if e.event is EventType.STEP_FAILED]
    assert (failed.step_kind, failed.name) == ("wait", "p2:0")
    assert failed.detail is not None
    assert failed.detail["error"] == {"type": "ChildFailed", "status": "failed", "message": "child broke"}


def test_child_runs_on_workers_and_wakes_the_parent(app: cairn.App) -> None:
    @app.workflow(name="leaf")
    def leaf(ctx: cairn.Context, n: int) -> int:
        ctx.sleep(0.05)
        return n + 1

    @app.workflow(name="root")
    def root(ctx: cairn.Context) -> int:
        return sum(ctx.child(leaf, i) for i in range(3))

    handle = app.start(root, run_id="root")
    worker = app.worker(concurrency=2, poll_interval=0.01)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        assert handle.result(timeout=15) == 6
    finally:
        worker.stop()
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_cancel_pending_and_suspended_runs_with_children(app: cairn.App) -> None:
    @app.workflow(name="sleepy")
    def sleepy(ctx: cairn.Context) -> None:
        ctx.sleep(60)

    @app.workflow(name="boss")
    def boss(ctx: cairn.Context) -> None:
        ctx.child(sleepy)

    app.start(boss, run_id="b")
    assert execute_once(app, "b") == "suspended"  # started its child, waits on it
    assert execute_once(app, "b:0") == "suspended"  # child sleeps
    record = app.cancel("b", reason="user gave up")
    assert record.status is RunStatus.CANCELLED
    assert app.get_run("b:0").status is RunStatus.CANCELLED
    cancelled = [e for e in app.history("b:0") if e.event is EventType.RUN_CANCELLED]
    assert cancelled
    assert cancelled[0].detail == {"reason": "user gave up", "actor": f"app:{os.getpid()}"}
    with pytest.raises(cairn.RunFailed, match="cancelled"):
        app.handle("b").result(timeout=1)
    assert app.store.claim_runs("w", ["boss", "sleepy"], 10, 5.0, 5) == []


def test_cancel_a_running_run_fences_its_worker(app: cairn.App, calls: Calls) -> None:
    inside = threading.Event()
    release = threading.Event()

    @app.step()
    def slow() -> str:
        calls.hit("slow")
        inside.set()
        release.wait(10)
        return "done"

    @app.step()
    def never() -> str:
        calls.hit("never")
        return "x"

    @app.workflow(name="long")
    def long(ctx: cairn.Context) -> str:
        return slow() + never()

    app.start(long, run_id="L")
    worker = app.worker(concurrency=1, poll_interval=0.01)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        assert inside.wait(10)
        app.cancel("L")
        release.set()
        deadline = time.monotonic() + 10 * SLACK
        while not worker._idle():
            assert time.monotonic() < deadline, "the worker never went idle after the cancellation"
            time.sleep(0.01)
    finally:
        worker.stop()
        thread.join(timeout=10)
    assert app.get_run("L").status is RunStatus.CANCELLED
    assert calls["never"] == 0  # nothing new started after the cancellation
    # the step that finished after the cancel was not recorded
    assert not [e for e in app.history("L") if e.event is EventType.STEP_COMPLETED]


def test_children_inherit_queue_and_priority_unless_told(app: cairn.App) -> None:
    """A parent and its children share a queue of concurrency 1 through a
    worker: the parent holds no slot while it waits, so nothing deadlocks."""

    @app.workflow(name="leaf")
    def leaf(ctx: cairn.Context, x: int) -> int:
        return x + 1

    @app.workflow(name="fan")
    def fan(ctx: cairn.Context) -> list[int]:
        inherited = ctx.start_child(leaf, 1)
        elsewhere = ctx.start_child(leaf, 2, queue="side", priority=9)
        return [inherited.result(), elsewhere.result(), ctx.child(leaf, 3)]

    app.set_queue("solo", concurrency=1)
    handle = app.start(fan, run_id="f", queue="solo", priority=4)
    worker = app.worker(concurrency=4, poll_interval=0.01)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False, "max_idle": 1.0})
    thread.start()
    try:
        assert handle.result(timeout=20) == [2, 3, 4]
    finally:
        worker.stop()
        thread.join(timeout=10)
    kids = {c.run_id: c for c in app.store.list_runs(cairn.store.records.RunFilter(parent_run_id="f"))}
    assert {k: (c.queue, c.priority) for k, c in kids.items()} == {
        "f:0": ("solo", 4), "f:1": ("side", 9), "f:4": ("solo", 4)}
