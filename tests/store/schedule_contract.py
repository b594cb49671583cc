"""The schedule part of the store contract: registration and exactly-once firing.

Mixed into both backends' contract classes (``test_sqlite_contract``,
``test_postgres_contract``). The rules under test are documented on
``Store.register_schedule`` / ``fire_schedule`` / ``list_schedules`` and in
``cairn.store.schedules``.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import pytest

from cairn.engine.schedules import tick_run_id
from cairn.errors import InvalidArgument
from cairn.store.contract import Store
from cairn.store.records import EventType, NewRun, RunFilter, RunStatus
from cairn.store.schedules import Fired, ScheduleSpec
from tests.store.contract import FakeClock, ev, new_run

TICK = 1_000_060.0


def spec(name: str = "nightly", tenant: str = "acme", **overrides: Any) -> ScheduleSpec:
    fields: dict[str, Any] = {"tenant": tenant, "name": name, "workflow": "wf", "cron": "* * * * *",
                              "timezone": "Europe/Paris", "missed": "once", "grace": 60.0}
    fields.update(overrides)
    return ScheduleSpec(**fields)


def tick_run(tick: float = TICK, name: str = "nightly", tenant: str = "acme") -> Any:
    return new_run(tick_run_id(tenant, name, tick), tenant=tenant)


def runs_of(store: Store, tenant: str | None = None) -> list[str]:
    return sorted(r.run_id for r in store.list_runs(RunFilter(None, tenant, None, None, None, 1000)))


class ScheduleContract:
    def test_register_records_the_definition_and_its_origin(self, store: Store, clock: FakeClock) -> None:
        state = store.register_schedule(spec())
        assert state.spec == spec()
        assert (state.created_at, state.updated_at) == (clock.now, clock.now)
        assert (state.last_tick, state.last_run_id, state.fired_at, state.fired) == (None, None, None, 0)
        assert state.after == clock.now  # no tick before the first registration ever fires
        assert store.list_schedules() == [state]

    def test_registering_again_replaces_the_definition_and_keeps_the_firing_state(
        self, store: Store, clock: FakeClock
    ) -> None:
        first = store.register_schedule(spec())
        assert store.fire_schedule("acme", "nightly", TICK, tick_run()) is Fired.CREATED
        clock.advance(100)
        again = store.register_schedule(spec(cron="*/5 * * * *", timezone="UTC", missed="skip", grace=5.0))
        assert again.spec == spec(cron="*/5 * * * *", timezone="UTC", missed="skip", grace=5.0)
        assert again.created_at == first.created_at
        assert again.updated_at == clock.now
        assert (again.last_tick, again.last_run_id, again.fired) == (TICK, tick_run().run_id, 1)

    def test_a_tick_creates_its_run_and_moves_last_tick(self, store: Store, clock: FakeClock) -> None:
        store.register_schedule(spec())
        clock.advance(61)
        run = tick_run()
        assert store.fire_schedule("acme", "nightly", TICK, run) is Fired.CREATED
        record = store.get_run(run.run_id)
        assert record is not None
        assert record.status is RunStatus.PENDING
        assert record.tenant == "acme"
        assert [e.event for e in store.history(run.run_id)] == [EventType.RUN_CREATED]
        (state,) = store.list_schedules()
        assert (state.last_tick, state.last_run_id, state.fired_at, state.fired) == (TICK, run.run_id,
                                                                                      clock.now, 1)

    def test_a_tick_fires_once_whoever_fires_it_again(self, store: Store, clock: FakeClock) -> None:
        store.register_schedule(spec())
        assert store.fire_schedule("acme", "nightly", TICK, tick_run()) is Fired.CREATED
        assert store.fire_schedule("acme", "nightly", TICK, tick_run()) is Fired.STALE
        # an earlier tick, fired late by a worker that read the state before: too late
        assert store.fire_schedule("acme", "nightly", TICK - 60, tick_run(TICK - 60)) is Fired.STALE
        assert runs_of(store) == [tick_run().run_id]
        (state,) = store.list_schedules()
        assert (state.last_tick, state.fired) == (TICK, 1)

    def test_a_passed_over_tick_creates_nothing_and_cannot_fire_later(
        self, store: Store, clock: FakeClock
    ) -> None:
        store.register_schedule(spec())
        assert store.fire_schedule("acme", "nightly", TICK, None) is Fired.PASSED
        assert runs_of(store) == []
        (state,) = store.list_schedules()
        assert (state.last_tick, state.last_run_id, state.fired) == (TICK, None, 0)
        assert store.fire_schedule("acme", "nightly", TICK, tick_run()) is Fired.STALE
        assert runs_of(store) == []

    def test_a_run_already_under_the_tick_id_is_kept(self, store: Store, clock: FakeClock) -> None:
        store.register_schedule(spec())
        store.create_run(tick_run())  # the state was lost after the run was made, say
        assert store.fire_schedule("acme", "nightly", TICK, tick_run()) is Fired.EXISTED
        assert runs_of(store) == [tick_run().run_id]
        assert len(store.history(tick_run().run_id)) == 1
        (state,) = store.list_schedules()
        assert (state.last_tick, state.fired) == (TICK, 0)

    def write_legacy_run(self, store: Store, run: NewRun) -> None:
        """Write ``run``'s row as a version without the rule of reserved tick
        ids did (``store.runids``): each backend's contract class does it."""
        raise NotImplementedError

    @pytest.mark.parametrize(("tenant", "run_id"), [
        ("globex", tick_run_id("acme", "nightly", TICK)),  # another tenant's tick
        ("acme:nightly", tick_run_id("acme", "nightly", TICK)),  # a tenant named to look like the prefix
        ("acme", tick_run_id("acme:x", "nightly", TICK)),  # a tenant whose name extends acme's
        ("acm", tick_run_id("acme", "nightly", TICK)),  # a prefix of the owner's name
        ("acme", "schedule:"),  # the bare prefix
    ])
    @pytest.mark.parametrize("creation", ["create_run", "create_claimed_run", "start_child"])
    def test_a_tick_id_outside_the_tenants_own_prefix_cannot_be_taken(
        self, store: Store, clock: FakeClock, tenant: str, run_id: str, creation: str
    ) -> None:
        """Tick ids are predictable and run ids are one namespace: a tenant
        taking another's tick id before its time would make that tick start
        nothing. Every way of creating a run refuses it, and writes nothing."""
        squatter = new_run(run_id, tenant=tenant)
        if creation == "start_child":
            parent = store.create_claimed_run(new_run("parent", tenant=tenant), "w1", 30.0)
            assert parent is not None
            before = store.history("parent")
            with pytest.raises(InvalidArgument, match="is reserved"):
                store.start_child("parent", parent.run.epoch, ev(clock, "parent", parent.next_seq,
                                                                parent.run.epoch), squatter)
            assert store.history("parent") == before
        else:
            create = store.create_run if creation == "create_run" else functools.partial(
                store.create_claimed_run, worker="w1", lease_seconds=30.0)
            with pytest.raises(InvalidArgument, match="is reserved"):
                create(squatter)
        assert store.get_run(run_id) is None
        assert store.history(run_id) == []

    @pytest.mark.parametrize("tenant", ["acme", "acme:nightly", "Ünïcødé ☃/%", "a b'c\"d"])
    def test_a_tenants_own_tick_ids_are_its_to_take(
        self, store: Store, clock: FakeClock, tenant: str
    ) -> None:
        own = tick_run_id(tenant, "nightly", TICK)
        assert store.create_run(new_run(own, tenant=tenant))[1] is True
        claimed = store.create_claimed_run(new_run(own + "-2", tenant=tenant), "w1", 30.0)
        assert claimed is not None
        assert store.get_run(own).tenant == tenant  # type: ignore[union-attr]
        assert store.create_run(new_run("schedule-ish", tenant="globex"))[1] is True  # no colon: not reserved
        store.register_schedule(spec(tenant=tenant))
        later = tick_run(TICK + 60, tenant=tenant)
        assert store.fire_schedule(tenant, "nightly", TICK + 60, later) is Fired.CREATED

    def test_another_tenants_earlier_run_under_the_id_does_not_block_later_ticks(
        self, store: Store, clock: FakeClock
    ) -> None:
        """A squatter's row from before the rule: that tick is skipped, the next ones fire."""
        store.register_schedule(spec())
        squatter = new_run(tick_run_id("acme", "nightly", TICK), tenant="globex")
        self.write_legacy_run(store, squatter)
        assert store.fire_schedule("acme", "nightly", TICK, tick_run()) is Fired.TAKEN
        record = store.get_run(squatter.run_id)
        assert record is not None
        assert record.tenant == "globex"
        assert store.fire_schedule("acme", "nightly", TICK + 60, tick_run(TICK + 60)) is Fired.CREATED
        (state,) = store.list_schedules()
        assert (state.last_tick, state.fired) == (TICK + 60, 1)

    def test_an_unregistered_schedule_fires_nothing(self, store: Store, clock: FakeClock) -> None:
        assert store.fire_schedule("acme", "nightly", TICK, tick_run()) is Fired.MISSING
        assert runs_of(store) == []

    def test_a_run_of_another_tenant_is_refused_before_anything_is_written(
        self, store: Store, clock: FakeClock
    ) -> None:
        store.register_schedule(spec())
        with pytest.raises(ValueError, match="tenant"):
            store.fire_schedule("acme", "nightly", TICK, tick_run(tenant="globex"))
        assert runs_of(store) == []
        assert store.list_schedules()[0].last_tick is None

    def test_tenants_have_schedules_of_their_own(self, store: Store, clock: FakeClock) -> None:
        store.register_schedule(spec(tenant="globex"))
        store.register_schedule(spec(tenant="acme"))
        store.register_schedule(spec("hourly", tenant="acme"))
        assert [(s.tenant, s.name) for s in store.list_schedules()] == [
            ("acme", "hourly"), ("acme", "nightly"), ("globex", "nightly")]
        assert [s.name for s in store.list_schedules("acme")] == ["hourly", "nightly"]
        assert store.fire_schedule("acme", "nightly", TICK, tick_run()) is Fired.CREATED
        # the same name and tick for another tenant: another run id, another run
        assert store.fire_schedule("globex", "nightly", TICK, tick_run(tenant="globex")) is Fired.CREATED
        assert runs_of(store, "acme") == [tick_run_id("acme", "nightly", TICK)]
        assert runs_of(store, "globex") == [tick_run_id("globex", "nightly", TICK)]
        assert {s.tenant: s.fired for s in store.list_schedules() if s.name == "nightly"} == {
            "acme": 1, "globex": 1}

    def test_concurrent_firings_of_one_tick_create_one_run(self, store: Store, clock: FakeClock) -> None:
        store.register_schedule(spec())
        results: list[Fired] = []
        errors: list[BaseException] = []
        barrier = threading.Barrier(6)

        def fire() -> None:
            try:
                barrier.wait(5)
                for tick in (TICK, TICK + 60, TICK + 120):
                    results.append(store.fire_schedule("acme", "nightly", tick, tick_run(tick)))
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=fire) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert errors == []
        assert results.count(Fired.CREATED) == 3
        assert results.count(Fired.STALE) == 15
        assert runs_of(store) == sorted(tick_run(t).run_id for t in (TICK, TICK + 60, TICK + 120))
        (state,) = store.list_schedules()
        assert (state.last_tick, state.fired) == (TICK + 120, 3)
