"""Replay: recorded results come back, bodies do not run again."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any
from uuid import UUID

import pytest

import cairn
from cairn.store.records import EventType, RunStatus
from tests.engine.conftest import Calls
from tests.engine.kinds import Flow, Kind, both
from tests.timing import NAP, napped


@dataclasses.dataclass
class Order:
    order_id: int
    placed: datetime
    token: UUID


@both
def test_completed_steps_are_replayed_not_rerun(app: cairn.App, kind: Kind, calls: Calls) -> None:
    crash = {"armed": True}

    def add_body(x: int) -> int:
        calls.hit(f"add{x}")
        return x + 1

    def explode_body(x: int) -> int:
        calls.hit("explode")
        if crash["armed"]:
            raise cairn.TerminalError("boom")
        return x * 10

    add = app.step(name="add")(kind.fn(add_body))
    explode = app.step(name="explode")(kind.fn(explode_body))

    @kind.workflow(app, "wf")
    def wf(ctx: cairn.Context, start: int) -> Flow[int]:
        return (yield explode((yield add((yield add(start))))))

    with pytest.raises(cairn.RunFailed):
        app.run(wf, 1, run_id="r1")
    assert calls.counts == {"add1": 1, "add2": 1, "explode": 1}
    crash["armed"] = False
    app.retry("r1")
    assert app.resume("r1") == 30
    # the two good steps were replayed from the journal; only the failed one re-ran
    assert calls.counts == {"add1": 1, "add2": 1, "explode": 2}


@both
def test_replay_returns_the_same_types_as_the_first_run(app: cairn.App, kind: Kind) -> None:
    seen: list[Order] = []

    def make_body(ctx_now: datetime, token: UUID) -> Order:
        return Order(7, ctx_now, token)

    make = app.step(name="make")(kind.fn(make_body))

    @kind.workflow(app, "typed")
    def typed(ctx: cairn.Context) -> Flow[str]:
        order = yield make(ctx.now(), ctx.uuid())
        seen.append(order)
        ctx.sleep(0)  # forces a suspension, so the second pass is a replay
        return f"{order.order_id}:{order.token}"

    first = app.run(typed, run_id="t1")
    assert len(seen) >= 1
    assert all(isinstance(o, Order) and isinstance(o.placed, datetime) for o in seen)
    # every pass (first run and replays) saw the very same value
    assert len({(o.order_id, o.placed, o.token) for o in seen}) == 1
    assert first == f"7:{seen[0].token}"


def test_context_values_are_recorded_once(app: cairn.App) -> None:
    observed: list[tuple[object, object, object]] = []

    @app.workflow(name="vals")
    def vals(ctx: cairn.Context) -> None:
        observed.append((ctx.now(), ctx.uuid(), ctx.random()))
        ctx.sleep(NAP)  # suspends, however slow the commit of its deadline

    app.run(vals, run_id="v1")
    assert len(observed) == 2  # first pass, then the replay after the timer
    assert observed[0] == observed[1]


def test_idempotent_start_returns_the_existing_run(app: cairn.App) -> None:
    @app.workflow(name="echo")
    def echo(ctx: cairn.Context, text: str) -> str:
        return text

    first = app.start(echo, "a", run_id="same")
    second = app.start(echo, "b", run_id="same")
    assert first.run_id == second.run_id == "same"
    assert len(app.list_runs()) == 1
    assert app.resume("same") == "a"  # the second start changed nothing
    assert [e.event for e in app.history("same")].count(EventType.RUN_CREATED) == 1


def test_step_outside_a_workflow_is_a_plain_call(app: cairn.App) -> None:
    @app.step()
    def double(x: int) -> int:
        return 2 * x

    assert double(4) == 8


def test_workflow_cannot_be_called_directly(app: cairn.App) -> None:
    @app.workflow(name="nope")
    def nope(ctx: cairn.Context) -> None:
        return None

    with pytest.raises(TypeError, match="cannot be called directly"):
        nope()


def test_async_workflow_with_async_and_sync_steps(app: cairn.App, calls: Calls) -> None:
    @app.step()
    async def fetch(x: int) -> int:
        calls.hit("fetch")
        return x + 1

    @app.step()
    def square(x: int) -> int:
        calls.hit("square")
        return x * x

    @app.workflow(name="async_wf")
    async def async_wf(ctx: cairn.Context, x: int) -> int:
        y = await fetch(x)
        ctx.sleep(NAP)  # suspends: the second pass replays fetch, awaited
        return square(y)

    assert app.run(async_wf, 2, run_id="a1") == 9
    assert calls.counts == {"fetch": 1, "square": 1}
    before, after = napped(app.history("a1"))
    assert [e.name for e in before] == ["fetch", "sleep"]
    assert [e.name for e in after] == ["square"]
    assert app.get_run("a1").status is RunStatus.COMPLETED


@both
def test_step_info_gives_a_stable_operation_id(app: cairn.App, kind: Kind) -> None:
    seen: list[cairn.StepInfo] = []

    def charge_body() -> str:
        info = cairn.step_info()
        seen.append(info)
        if info.attempt < 3:
            raise ConnectionError("flaky")
        return info.operation_id

    charge = app.step(name="charge", retry=cairn.RetryPolicy(max_attempts=3, initial_delay=0.0, jitter=0.0))(
        kind.fn(charge_body))

    @kind.workflow(app, "pay")
    def pay(ctx: cairn.Context) -> Flow[str]:
        return (yield charge())

    result = app.run(pay, run_id="p1", tenant="acme", thread_id="th")
    assert [i.attempt for i in seen] == [1, 2, 3]
    assert {i.operation_id for i in seen} == {result}
    assert result == cairn.operation_id("p1", 0)
    assert seen[0].tenant == "acme"
    assert seen[0].thread_id == "th"
    assert seen[0].run_id == "p1"
    with pytest.raises(cairn.CairnError):
        cairn.step_info()


# -- the replay check's store -------------------------------------------------------------------

#: what a replay check may ask of its store: reads only (named here, not taken from the code under test)
_STORE_READS = frozenset({
    "get_run", "list_runs", "history", "queue_stats", "list_schedules", "deliveries", "latest_event",
    "approvals", "bundles", "run_counts", "bundle_counts", "get_artifact", "memory_item", "memory_items",
    "thread_messages", "memory_threads", "run_memory", "item_tiers", "get_token", "list_tokens",
    "runs_changed", "search_memory", "vector_tiers", "durability", "delivery", "history_at", "model_calls",
    "history_headers", "history_index",
})


def _store_methods() -> list[str]:
    from cairn.store.contract import Store

    return sorted(name for name, member in vars(Store).items()
                  if not name.startswith("_") and callable(member))


def test_the_replay_checks_store_refuses_every_write(app: cairn.App) -> None:
    """Every method of the store contract that is not a read raises
    ``DryRunWrite`` before reaching the store: a replay check cannot write
    whatever the code it replays asks for."""
    from cairn.engine.replaycheck import DryRunWrite, ReadOnlyStore

    dry: Any = ReadOnlyStore(app.store)
    writes = [name for name in _store_methods() if name not in _STORE_READS]
    assert {"append", "transact", "create_run", "finish_run", "deliver", "take_delivery", "put_artifact",
            "suspend_run", "rewind_run", "decide_approval", "write_memory"} <= set(writes)
    for name in writes:
        with pytest.raises(DryRunWrite):
            getattr(dry, name)
    assert dry.get_run("no-such-run") is None  # reads reach the store


@both
def test_a_replay_check_writes_nothing(app: cairn.App, kind: Kind, monkeypatch: pytest.MonkeyPatch) -> None:
    """A spy on the store under a replay check sees reads only, though the
    replayed code goes on past its journal (a step, a sleep, a signal)."""
    from cairn.engine import replaycheck

    big = "x" * (app.runtime.payloads.inline_limit + 1)  # an artifact: the replay reads the store

    @app.step()
    def fetch(n: int) -> dict[str, Any]:
        return {"n": n + 1, "padding": big}

    @kind.workflow(app, "checked")
    def checked(ctx: cairn.Context, n: int) -> Flow[int]:
        first = yield fetch(n)
        second = yield fetch(first["n"])
        return int(second["n"])

    assert app.run(checked, 1, run_id="checked-1") == 3
    history = app.store.history("checked-1")
    run = app.get_run("checked-1")
    asked: list[str] = []

    class Spy:
        def __init__(self, store: object) -> None:
            self._store = store

        def __getattr__(self, name: str) -> object:
            asked.append(name)
            return getattr(self._store, name)

    spied = dataclasses.replace(app.runtime, store=Spy(app.store))
    definition = app.target_bundle(run, None).definition
    # the journal cut before its second step: the code goes on where the journal ends
    cut = [e for e in history if e.position is None or e.position < 1]
    report = replaycheck.check(spied, definition, run, cut)
    assert report.compatible, report.describe()
    assert asked, "the spy saw nothing: it is not the store the check used"
    assert set(asked) <= _STORE_READS, asked
