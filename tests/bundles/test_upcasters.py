"""State types that evolve (``cairn.codec.upcasters``): chains of upcasters,
and a payload with no path to its type's current version parking the run as
``incompatible`` (never a retry loop) until an upcaster is deployed and the
run is retried (SQLite and PostgreSQL)."""

from __future__ import annotations

import time
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
        run = old.start("order", 1.0)
        _drain(old, 0.1)
        assert old.get_run(run.run_id).status is RunStatus.SUSPENDED
        DEPLOYED[0] = Step(StepDef.build(_make_v2, "make_order", NO_RETRY))  # the deploy
        time.sleep(1.0)
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
        run = app.start("swallow", 1.0)
        _drain(app, 0.1)
        DEPLOYED[0] = Step(StepDef.build(_make_v2, "make_order", NO_RETRY))
        time.sleep(1.0)
        _drain(app, 0.3)
        assert app.get_run(run.run_id).status is RunStatus.INCOMPATIBLE
    finally:
        DEPLOYED[0] = Step(StepDef.build(_make_v1, "make_order", NO_RETRY))
        app.close()


