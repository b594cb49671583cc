"""The worker's scheduler, driven by a fake clock on SQLite and PostgreSQL:
one run per tick whatever the number of schedulers (workers) and restarts,
the missed-tick policies, arguments and the tick time reaching the run.

Each scheduler here is what one worker runs (``Worker.scheduler``), called a
pass at a time (``run_pass``) with the store's clock moved by hand, so every
assertion is about exactly which ticks fired, never about timing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pytest

import cairn
from cairn.engine.schedules import tick_run_id
from cairn.store.contract import Store
from cairn.store.records import RunFilter
from cairn.worker.scheduler import Scheduler
from tests.backends import StoreBackend
from tests.engine.test_transactions import sql
from tests.store.contract import FakeClock

START = 1_796_000_000.0  # a whole second


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def make_app(backend: StoreBackend, clock: FakeClock) -> Iterator[Callable[..., cairn.App]]:
    """Apps on the test's store, each with a store of its own (one per
    simulated worker process), every one declaring the same schedules."""
    apps: list[cairn.App] = []

    def make(missed: str = "once", grace: float = 5.0, cron: str = "* * * * * *") -> cairn.App:
        app = cairn.App(store=backend.open_store(clock))
        apps.append(app)

        @app.schedule(cron, name="beat", tenant="acme", kwargs={"label": "hi"}, tick_arg="at",
                      missed=missed, grace=grace)
        @app.workflow(name="beat")
        def beat(ctx: cairn.Context, label: str, at: datetime) -> str:
            return f"{label} {at.isoformat()}"

        return app

    yield make
    for app in apps:
        app.close()


def scheduler(app: cairn.App) -> Scheduler:
    return Scheduler(app.runtime, list(app.runtime.schedules.values()))


def ticks_run(store: Store) -> list[float]:
    """The tick of every run of the ``beat`` schedule, sorted (each id once)."""
    ids = [r.run_id for r in store.list_runs(RunFilter(None, "acme", None, None, None, 10_000))]
    assert len(ids) == len(set(ids))
    prefix = "schedule:acme:beat:"
    assert all(i.startswith(prefix) for i in ids)
    return sorted(datetime.strptime(i.removeprefix(prefix), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
                  .timestamp() for i in ids)


def test_each_tick_starts_one_run_with_its_arguments_and_time(make_app: Callable[..., cairn.App],
                                                              clock: FakeClock) -> None:
    app = make_app()
    sched = scheduler(app)
    assert sched.run_pass() == START + 1  # registered now: the next tick, nothing before
    assert ticks_run(app.store) == []
    clock.advance(3.2)
    assert sched.run_pass() == START + 4
    assert ticks_run(app.store) == [START + 1, START + 2, START + 3]
    run_id = tick_run_id("acme", "beat", START + 2)
    assert app.resume(run_id) == f"hi {datetime.fromtimestamp(START + 2, UTC).isoformat()}"
    record = app.get_run(run_id)
    assert (record.tenant, record.workflow, record.queue) == ("acme", "beat", "default")
    (view,) = app.schedules()
    assert (view.last_tick, view.last_run_id, view.fired, view.next_tick) == (
        START + 3, tick_run_id("acme", "beat", START + 3), 3, START + 4)


def test_three_workers_and_restarts_start_exactly_one_run_per_tick(make_app: Callable[..., cairn.App],
                                                                   clock: FakeClock) -> None:
    apps = [make_app() for _ in range(3)]
    schedulers = [scheduler(app) for app in apps]
    for sched in schedulers:
        sched.run_pass()
    for second in range(1, 31):
        clock.advance(1.0)
        if second % 7 == 0:  # a worker restarts: a new scheduler, no memory but the database
            schedulers[second % 3] = scheduler(apps[second % 3])
        errors: list[BaseException] = []

        def one_pass(sched: Scheduler, errors: list[BaseException] = errors) -> None:
            try:
                sched.run_pass()
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=one_pass, args=(s,)) for s in schedulers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert errors == []
    assert ticks_run(apps[0].store) == [START + s for s in range(1, 31)]
    assert sum(s.created for s in schedulers) <= 30
    (view,) = apps[0].schedules()
    assert view.fired == 30
    assert view.last_tick == START + 30


def test_while_one_worker_lives_no_tick_is_missed(make_app: Callable[..., cairn.App],
                                                  clock: FakeClock) -> None:
    a, b = make_app(missed="skip", grace=2.0), make_app(missed="skip", grace=2.0)
    sa, sb = scheduler(a), scheduler(b)
    sa.run_pass()
    for _ in range(5):  # a fires alone for a while
        clock.advance(1.0)
        sa.run_pass()
    for _ in range(5):  # a is dead; b carries on from what a left in the database
        clock.advance(1.0)
        sb.run_pass()
    assert ticks_run(a.store) == [START + s for s in range(1, 11)]


@pytest.mark.parametrize(("missed", "expected"), [
    # down from START+3 to START+100, grace 5: ticks START+4 .. START+95 were missed
    ("skip", [*range(1, 4), *range(96, 101)]),
    ("once", [*range(1, 4), 95, *range(96, 101)]),
    ("all", [*range(1, 101)]),
])
def test_the_missed_policy_after_every_worker_was_down(make_app: Callable[..., cairn.App], clock: FakeClock,
                                                       missed: str, expected: list[int]) -> None:
    app = make_app(missed=missed, grace=5.0)
    scheduler(app).run_pass()
    clock.advance(3.0)
    scheduler(app).run_pass()
    clock.advance(97.0)  # every worker down for 97 s
    restarted = scheduler(app)
    while restarted.run_pass() == clock.now:  # "all" may take a few passes (capped per pass)
        pass
    assert ticks_run(app.store) == [START + s for s in expected]
    clock.advance(1.0)
    restarted.run_pass()
    assert ticks_run(app.store)[-1] == START + 101  # and it carries on


def test_a_changed_timetable_keeps_its_place(make_app: Callable[..., cairn.App], clock: FakeClock) -> None:
    app = make_app(cron="* * * * * *")
    scheduler(app).run_pass()
    clock.advance(2.0)
    scheduler(app).run_pass()
    deployed = make_app(cron="*/10 * * * * *")  # a deploy: every ten seconds from now on
    clock.advance(18.0)
    scheduler(deployed).run_pass()
    # START is a multiple of ten; START+10 is more than grace old: the catch-up of missed="once"
    assert ticks_run(app.store) == [START + 1, START + 2, START + 10, START + 20]
    (view,) = deployed.schedules()
    assert view.cron == "*/10 * * * * *"


def test_a_ticks_run_acts_with_the_role_the_schedule_declares(backend: StoreBackend,
                                                               clock: FakeClock) -> None:
    """``role=`` is recorded on each tick's run (its row: what tools
    restricted by role read) and on the schedule's row (shown). The run
    takes it from the declaration: a tick's run whose own SQL rewrites its
    schedule's row to admin gets no admin rights at the next tick."""
    ran: list[str] = []
    app = cairn.App(store=backend.open_store(clock))
    try:
        @app.tool(effect="write", access=cairn.ToolAccess(role="admin"))
        def purge(label: str) -> str:
            ran.append(label)
            return f"purged {label}"

        @app.transaction(name="promote-my-schedule")
        def promote(tx: cairn.Tx) -> int:
            return tx.execute(sql(tx, "UPDATE schedules SET started_role = 'admin' WHERE name = ?"),
                              ("plain",)).rowcount

        @app.workflow(name="purge")
        def purge_flow(ctx: cairn.Context, label: str) -> str:
            if label == "plain":
                promote()
            return purge(label)

        app.schedule("* * * * * *", purge_flow, name="admin", tenant="acme", kwargs={"label": "admin"},
                     role="admin")
        app.schedule("* * * * * *", purge_flow, name="plain", tenant="acme", kwargs={"label": "plain"})
        with pytest.raises(cairn.InvalidArgument, match="role must be one of"):
            app.schedule("* * * * * *", purge_flow, name="root", tenant="acme", kwargs={"label": "x"},
                         role="root")
        sched = scheduler(app)
        sched.run_pass()
        clock.advance(1.0)
        sched.run_pass()
        admin, plain = tick_run_id("acme", "admin", START + 1), tick_run_id("acme", "plain", START + 1)
        assert app.store.started_with(admin) == ("admin", None)
        assert app.store.started_with(plain) == (None, None)
        created = app.history(admin)[0].detail or {}
        assert created["started_role"] == "admin"
        assert created["started_by"] == {"actor": "schedule:admin", "auth": "schedule", "tenant": "acme",
                                         "role": "admin"}
        assert {s.name: s.spec.started_role for s in app.store.list_schedules("acme")} == {
            "admin": "admin", "plain": None}
        assert {v.name: v.as_dict()["role"] for v in app.schedules()} == {"admin": "admin", "plain": None}

        assert app.resume(admin) == "purged admin"
        with pytest.raises(cairn.RunFailed, match="a run started without a token role may not call it"):
            app.resume(plain)  # its promotion step committed: the row now says admin
        assert {s.name: s.spec.started_role for s in app.store.list_schedules("acme")}["plain"] == "admin"
        clock.advance(1.0)
        sched.run_pass()
        later = tick_run_id("acme", "plain", START + 2)
        assert app.store.started_with(later) == (None, None)  # the declaration, not the edited row
        with pytest.raises(cairn.RunFailed, match="a run started without a token role may not call it"):
            app.resume(later)
        assert ran == ["admin"]
    finally:
        app.close()
