"""State types that evolve (``cairn.codec.upcasters``): chains of upcasters,
and a payload with no path to its type's current version parking the run as
``incompatible`` (never a retry loop) until an upcaster is deployed and the
run is retried (SQLite and PostgreSQL)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

import cairn
from cairn.codec import upcasters, values
from cairn.engine.definitions import StepDef
from cairn.engine.steps import Step
from cairn.errors import IncompatiblePayload, InvalidRunState
from cairn.retry import NO_RETRY
from cairn.store.records import EventType, RunStatus
from tests.timing import NAP, wait_until_due


@dataclass
class Chained:
    __cairn_version__: ClassVar[int] = 3
    order_id: int
    cents: int
    currency: str


def test_an_upcaster_chain_runs_one_version_at_a_time() -> None:
    seen: list[int] = []

    def one_to_two(data: dict[str, Any]) -> dict[str, Any]:
        seen.append(1)
        return {"order_id": data["id"], "cents": data["cents"]}

    def two_to_three(data: dict[str, Any]) -> dict[str, Any]:
        seen.append(2)
        return {**data, "currency": "EUR"}

    upcasters.register(Chained, 1, one_to_two)
    upcasters.register(Chained, 2, two_to_three)
    # a payload recorded before the type had a version reads as version 1
    assert values.decode(b'{"id": 7, "cents": 1250}', Chained) == Chained(7, 1250, "EUR")
    assert seen == [1, 2]
    version_2 = b'{"__cairn_version__": 2, "order_id": 7, "cents": 5}'
    assert values.decode(version_2, Chained) == Chained(7, 5, "EUR")
    current = values.encode(Chained(1, 2, "USD"))
    assert b'"__cairn_version__":3' in current
    assert values.decode(current, Chained) == Chained(1, 2, "USD")
    with pytest.raises(IncompatiblePayload, match="version 4, the code's is 3: it was recorded by newer"):
        values.decode(b'{"__cairn_version__": 4, "order_id": 1}', Chained)


@dataclass
class Gapped:
    __cairn_version__: ClassVar[int] = 3
    n: int


def test_a_missing_link_names_the_type_and_versions() -> None:
    upcasters.register(Gapped, 1, lambda data: data)
    with pytest.raises(IncompatiblePayload) as info:
        values.decode(b'{"n": 1}', Gapped)
    assert (info.value.type_name, info.value.found, info.value.current) == ("Gapped", 1, 3)
    assert "no upcaster from version 2" in str(info.value)
    with pytest.raises(ValueError, match="out of range"):
        upcasters.register(Gapped, 3, lambda data: data)
    with pytest.raises(TypeError, match="declares no schema version"):
        upcasters.register(int, 1, lambda data: data)


# -- a run whose recorded state no longer reads -------------------------------------------------


@dataclass
class OrderV1:
    order_id: int
    cents: int


@dataclass
class OrderV2:  # the deployed code's Order: it gained a required field
    __cairn_version__: ClassVar[int] = 2
    order_id: int
    cents: int
    currency: str


def _make_v1() -> OrderV1:
    return OrderV1(42, 1250)


def _make_v2() -> OrderV2:
    return OrderV2(42, 1250, "EUR")


#: which deployment's ``make_order`` the workflow calls: the workflow's own code is the
#: same in both (the state type changed, not the workflow), so both serve its bundle
DEPLOYED: list[Step[[], Any]] = [Step(StepDef.build(_make_v1, "make_order", NO_RETRY))]


def order_flow(ctx: cairn.Context, pause: float) -> str:
    order = DEPLOYED[0]()
    ctx.sleep(pause)
    return f"{order.order_id}:{order.cents}:{getattr(order, 'currency', '-')}"


def _drain(app: cairn.App, seconds: float = 0.3) -> None:
    app.worker(poll_interval=0.02).run(install_signals=False, max_idle=seconds)


def _claims(app: cairn.App, run_id: str) -> int:
    return sum(1 for e in app.history(run_id) if e.event is EventType.LEASE_CLAIMED)


def test_an_unreadable_payload_parks_the_run_until_an_upcaster_is_deployed(db_url: str) -> None:
    DEPLOYED[0] = Step(StepDef.build(_make_v1, "make_order", NO_RETRY))
    old = cairn.App(db=db_url, lease_seconds=1.0)
    new = cairn.App(db=db_url, lease_seconds=1.0)
    try:
        old.workflow(name="order")(order_flow)
        new.workflow(name="order")(order_flow)
        run = old.start("order", NAP)
        _drain(old, 0.1)
        assert old.get_run(run.run_id).status is RunStatus.SUSPENDED
        DEPLOYED[0] = Step(StepDef.build(_make_v2, "make_order", NO_RETRY))  # the deploy
        wait_until_due(old, run.run_id)
        _drain(new, 0.3)
        record = new.get_run(run.run_id)
        assert record.status is RunStatus.INCOMPATIBLE
        [parked] = [e for e in new.history(run.run_id) if e.event is EventType.RUN_INCOMPATIBLE]
        assert parked.detail is not None
        assert parked.detail["type"] == "OrderV2"
        assert (parked.detail["found_version"], parked.detail["current_version"]) == (1, 2)
        assert parked.detail["position"] == 0
        assert "no upcaster from version 1" in parked.detail["why"]
        claims = _claims(new, run.run_id)
        _drain(new, 0.3)
        assert _claims(new, run.run_id) == claims  # parked: never claimed again by itself
        with pytest.raises(cairn.RunSuspended, match="incompatible"):
            new.resume(run.run_id)

        @new.upcaster(OrderV2, from_version=1)
        def add_currency(data: dict[str, Any]) -> dict[str, Any]:
            return {**data, "currency": "USD"}

        retried = new.retry(run.run_id)
        assert retried.status is RunStatus.PENDING
        _drain(new, 0.3)
        assert new.handle(run.run_id).result(timeout=5) == "42:1250:USD"  # the recorded order, upcast
        with pytest.raises(InvalidRunState, match="only failed or quarantined runs can be retried"):
            new.retry(run.run_id)
    finally:
        DEPLOYED[0] = Step(StepDef.build(_make_v1, "make_order", NO_RETRY))
        upcasters.unregister(OrderV2, 1)  # upcasters are process-wide: the next backend's run has none
        old.close()
        new.close()


def test_an_incompatible_payload_cannot_be_swallowed_by_workflow_code(db_url: str) -> None:
    DEPLOYED[0] = Step(StepDef.build(_make_v1, "make_order", NO_RETRY))
    app = cairn.App(db=db_url, lease_seconds=1.0)

    def swallowing(ctx: cairn.Context, pause: float) -> str:
        try:
            order = DEPLOYED[0]()
        except Exception:  # an IncompatiblePayload is not an Exception: this never hides it
            return "swallowed"
        ctx.sleep(pause)
        return str(order.order_id)

    try:
        app.workflow(name="swallow")(swallowing)
        run = app.start("swallow", NAP)
        _drain(app, 0.1)
        DEPLOYED[0] = Step(StepDef.build(_make_v2, "make_order", NO_RETRY))
        wait_until_due(app, run.run_id)
        _drain(app, 0.3)
        assert app.get_run(run.run_id).status is RunStatus.INCOMPATIBLE
    finally:
        DEPLOYED[0] = Step(StepDef.build(_make_v1, "make_order", NO_RETRY))
        app.close()




# -- an upcaster that raises, a changed type nested in a list or a dataclass (issue 21) ---------


@dataclass
class BoxV1:
    order: OrderV1
    note: str


@dataclass
class BoxV2:  # the same box; the order inside it changed
    order: OrderV2
    note: str


def _list_v1() -> list[OrderV1]:
    return [OrderV1(42, 1250), OrderV1(43, 5)]


def _list_v2() -> list[OrderV2]:
    return [OrderV2(42, 1250, "EUR")]


def _box_v1() -> BoxV1:
    return BoxV1(OrderV1(42, 1250), "gift")


def _box_v2() -> BoxV2:
    return BoxV2(OrderV2(42, 1250, "EUR"), "gift")


def nested_flow(ctx: cairn.Context, pause: float) -> str:
    made = DEPLOYED[0]()
    ctx.sleep(pause)
    orders = made if isinstance(made, list) else [getattr(made, "order", made)]
    return ";".join(f"{o.order_id}:{o.cents}:{getattr(o, 'currency', '-')}" for o in orders)


def _park(db_url: str, before: Any, after: Any, workflow: str = "nested") -> tuple[cairn.App, str]:
    """A run records ``before``'s result, the deploy replaces it by ``after``
    and a worker replays it: the run must be parked ``incompatible``."""
    DEPLOYED[0] = Step(StepDef.build(before, "make_order", NO_RETRY))
    app = cairn.App(db=db_url, lease_seconds=1.0)
    app.workflow(name=workflow)(nested_flow)
    run = app.start(workflow, NAP)
    _drain(app, 0.1)
    assert app.get_run(run.run_id).status is RunStatus.SUSPENDED
    DEPLOYED[0] = Step(StepDef.build(after, "make_order", NO_RETRY))  # the deploy
    wait_until_due(app, run.run_id)
    _drain(app, 0.3)
    record = app.get_run(run.run_id)
    assert record.status is RunStatus.INCOMPATIBLE, record.error
    return app, run.run_id


@pytest.mark.parametrize(("before", "after", "expected"), [
    (_list_v1, _list_v2, "42:1250:USD;43:5:USD"),
    (_box_v1, _box_v2, "42:1250:USD"),
], ids=["in a list", "in a dataclass"])
def test_a_changed_type_nested_in_a_payload_parks_the_run_until_an_upcaster_is_deployed(
    db_url: str, before: Any, after: Any, expected: str
) -> None:
    app, run_id = _park(db_url, before, after)
    try:
        [parked] = [e for e in app.history(run_id) if e.event is EventType.RUN_INCOMPATIBLE]
        assert parked.detail is not None
        assert parked.detail["type"] == "OrderV2"
        assert parked.detail["position"] == 0
        upcasters.register(OrderV2, 1, lambda data: {**data, "currency": "USD"})
        app.retry(run_id)
        _drain(app, 0.3)
        assert app.handle(run_id).result(timeout=5) == expected
    finally:
        DEPLOYED[0] = Step(StepDef.build(_make_v1, "make_order", NO_RETRY))
        upcasters.unregister(OrderV2, 1)
        app.close()


def test_an_upcaster_that_raises_parks_the_run_until_it_is_fixed(db_url: str) -> None:
    def broken(data: dict[str, Any]) -> dict[str, Any]:
        return {**data, "currency": data["currency_code"]}  # KeyError: v1 orders had none

    upcasters.register(OrderV2, 1, broken)
    try:
        app, run_id = _park(db_url, _make_v1, _make_v2)
        try:
            [parked] = [e for e in app.history(run_id) if e.event is EventType.RUN_INCOMPATIBLE]
            assert parked.detail is not None
            assert "the upcaster from version 1 raised KeyError" in parked.detail["why"]
            upcasters.register(OrderV2, 1, lambda data: {**data, "currency": "CHF"})  # the fix, deployed
            app.retry(run_id)
            _drain(app, 0.3)
            assert app.handle(run_id).result(timeout=5) == "42:1250:CHF"
        finally:
            app.close()
    finally:
        DEPLOYED[0] = Step(StepDef.build(_make_v1, "make_order", NO_RETRY))
        upcasters.unregister(OrderV2, 1)


@dataclass
class Plain:
    order_id: int
    currency: str  # a required field the recorded payload lacks


def _plain() -> Plain:
    return Plain(1, "EUR")


def test_an_unversioned_type_that_no_longer_reads_parks_the_run(db_url: str) -> None:
    """Not every recorded payload that no longer decodes has a version: the
    run is parked (a deployable fix: give the type a version and an
    upcaster, or a default), not failed."""
    app, run_id = _park(db_url, _make_v1, _plain, workflow="plain")
    try:
        [parked] = [e for e in app.history(run_id) if e.event is EventType.RUN_INCOMPATIBLE]
        assert parked.detail is not None
        assert "currency" in parked.detail["why"]
    finally:
        DEPLOYED[0] = Step(StepDef.build(_make_v1, "make_order", NO_RETRY))
        app.close()


def test_a_nested_versioned_value_records_its_version_and_reads_back() -> None:
    values.decoder_for(list[OrderV2])  # what StepDef.build does for a step's result type
    values.decoder_for(BoxV2)
    seen: list[dict[str, Any]] = []

    def recorded(data: dict[str, Any]) -> dict[str, Any]:
        seen.append(data)
        return {**data, "currency": "USD"}

    upcasters.register(OrderV2, 1, recorded)
    try:
        listed = values.encode([OrderV2(1, 2, "EUR")], list[OrderV2])
        assert b'"__cairn_version__":2' in listed
        assert values.decode(listed, list[OrderV2]) == [OrderV2(1, 2, "EUR")]
        boxed = values.encode(BoxV2(OrderV2(1, 2, "EUR"), "n"), BoxV2)
        assert b'"__cairn_version__":2' in boxed
        assert values.decode(boxed, BoxV2) == BoxV2(OrderV2(1, 2, "EUR"), "n")
        # recorded nested by the current code before nested values carried a version: read as is
        assert values.decode(b'[{"order_id": 1, "cents": 2, "currency": "EUR"}]', list[OrderV2]) == \
            [OrderV2(1, 2, "EUR")]
        assert seen == []
        assert values.decode(b'{"order": {"order_id": 1, "cents": 2}, "note": "n"}', BoxV2) == \
            BoxV2(OrderV2(1, 2, "USD"), "n")  # version 1 shaped: upcast
    finally:
        upcasters.unregister(OrderV2, 1)
