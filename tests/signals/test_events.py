"""Published events: ``ctx.set_event``, ``app.get_event``, ``ctx.get_event``
(issue 11, item 2), on both backends, sync and async workflows."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import cairn
from cairn.store.records import RunStatus
from tests.engine.conftest import execute_once
from tests.engine.kinds import Flow, Kind, both
from tests.signals.test_signals import recv
from tests.timing import NAP, wait_out_nap


@both
def test_a_reader_sees_the_latest_value_of_each_key_while_the_run_waits(app: cairn.App, kind: Kind) -> None:
    @kind.workflow(app, "progress")
    def flow(ctx: cairn.Context) -> Flow[str]:
        ctx.set_event("stage", "drafting")
        ctx.set_event("stage", "awaiting review")
        ctx.set_event("draft", {"amount": 1250, "to": "ada"})
        yield recv(kind, ctx, "go")
        ctx.set_event("stage", "paid")
        return "ok"

    run_id = app.start(flow).run_id
    assert app.get_event(run_id, "stage") is None  # nothing published yet: no wait by default
    assert execute_once(app, run_id) == "suspended"
    assert app.get_event(run_id, "stage") == "awaiting review"
    assert app.get_event(run_id, "draft") == {"amount": 1250, "to": "ada"}
    assert app.get_event(run_id, "missing", default="none") == "none"
    app.signal(run_id, "go")
    assert execute_once(app, run_id) == "completed"
    assert app.get_event(run_id, "stage") == "paid"
    stages = [e for e in app.history(run_id) if e.step_kind == "event" and e.name == "stage"]
    assert len(stages) == 3  # replay published nothing again


def test_get_event_waits_for_a_first_value_up_to_its_timeout(app: cairn.App) -> None:
    @app.workflow(name="later")
    def later(ctx: cairn.Context) -> str:
        ctx.sleep(0.3)
        ctx.set_event("ready", True)
        return str(ctx.wait_for_signal("end"))

    run_id = app.start(later).run_id
    started = time.monotonic()
    assert app.get_event(run_id, "ready", timeout=0.1, default="not yet") == "not yet"
    assert time.monotonic() - started >= 0.1
    worker = app.worker(concurrency=1, poll_interval=0.02)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        assert app.get_event(run_id, "ready", timeout=10) is True
        app.signal(run_id, "end", "x")
        assert app.handle(run_id).result(timeout=10) == "x"
    finally:
        worker.stop()
        thread.join(30)


def test_get_event_returns_at_once_for_a_run_that_finished_without_it(app: cairn.App) -> None:
    @app.workflow(name="silent")
    def silent(ctx: cairn.Context) -> int:
        return 1

    run_id = app.start(silent).run_id
    assert execute_once(app, run_id) == "completed"
    started = time.monotonic()
    assert app.get_event(run_id, "never", timeout=30) is None
    assert time.monotonic() - started < 10  # not the full timeout: the run is finished
    with pytest.raises(cairn.RunNotFound):
        app.get_event("no-such-run", "k")


def test_get_event_decodes_into_the_type_asked_for(app: cairn.App) -> None:
    @app.workflow(name="typed")
    def typed(ctx: cairn.Context) -> int:
        ctx.set_event("when", "2026-12-01T10:00:00+00:00")
        return 1

    run_id = app.start(typed).run_id
    assert execute_once(app, run_id) == "completed"
    from datetime import datetime

    assert app.get_event(run_id, "when", type_=datetime).year == 2026
    with pytest.raises(cairn.PayloadError):
        app.get_event(run_id, "when", type_=int)


@both
def test_ctx_get_event_is_journaled_so_replay_reads_the_same_value(app: cairn.App, kind: Kind) -> None:
    @app.workflow(name="publisher")
    def publisher(ctx: cairn.Context) -> int:
        ctx.set_event("n", 1)
        ctx.wait_for_signal("next")
        ctx.set_event("n", 2)
        return 2

    @kind.workflow(app, "reader")
    def reader(ctx: cairn.Context, target: str) -> Flow[list[Any]]:
        first = ctx.get_event(target, "n", type_=int)
        missing = ctx.get_event(target, "absent")
        yield ctx.sleep(NAP)
        return [first, missing]

    pub = app.start(publisher).run_id
    assert execute_once(app, pub) == "suspended"
    run_id = app.start(reader, pub).run_id
    assert execute_once(app, run_id) == "suspended"
    app.signal(pub, "next")
    assert execute_once(app, pub) == "completed"  # now it says 2
    wait_out_nap()
    assert execute_once(app, run_id) == "completed"
    assert app.handle(run_id).result(timeout=5) == [1, None]  # what the first execution read


def test_ctx_get_event_of_another_tenant_is_refused_like_an_unknown_run(app: cairn.App) -> None:
    @app.workflow(name="secretive")
    def secretive(ctx: cairn.Context) -> int:
        ctx.set_event("secret", "s3cr3t")
        return 1

    @app.workflow(name="snoop")
    def snoop(ctx: cairn.Context, target: str) -> str:
        try:
            return str(ctx.get_event(target, "secret"))
        except cairn.RunNotFound as exc:
            return str(exc)

    target = app.start(secretive, tenant="acme").run_id
    assert execute_once(app, target) == "completed"
    run_id = app.start(snoop, target, tenant="globex").run_id
    assert execute_once(app, run_id) == "completed"
    assert app.handle(run_id).result(timeout=5) == f"no run with id {target!r}"


@pytest.mark.parametrize("key", ["", "bad\x1bkey"])
def test_bad_event_keys_fail_the_call(app: cairn.App, key: str) -> None:
    @app.workflow(name="bad")
    def bad(ctx: cairn.Context) -> str:
        try:
            ctx.set_event(key, 1)
        except cairn.InvalidArgument as exc:
            return "refused: " + type(exc).__name__
        return "published"

    run_id = app.start(bad).run_id
    assert execute_once(app, run_id) == "completed"
    assert app.handle(run_id).result(timeout=5) == "refused: InvalidArgument"
    assert app.get_run(run_id).status is RunStatus.COMPLETED
