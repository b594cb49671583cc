"""State types that evolve, for graphs (``codec.upcasters``).

A graph run paused mid-way is moved (``app.migrate``) to a deployment
whose state type changed (a field renamed, version 2): it reads the old
checkpoints through the registered upcaster and goes on, and the first
checkpoint it writes sets every field at the new version. Without an
upcaster the run is parked ``incompatible`` (never failed, never claimed
again by itself) and a deployed upcaster lets it finish after a retry.
The readers read old checkpoints through the upcaster too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar

import pytest

import cairn
from cairn.codec import upcasters
from cairn.errors import IncompatiblePayload
from cairn.graph import checkpoints as format_
from cairn.store.records import EventType, RunStatus
from tests.engine.conftest import postgres_url
from tests.timing import NAP, wait_until_due

from .conftest import BACKENDS


@dataclass
class TallyV1:
    log: Annotated[list[str], cairn.append]
    n: int


@dataclass
class TallyV2:  # the deployed code's state: ``n`` is now ``count``
    __cairn_version__: ClassVar[int] = 2
    log: Annotated[list[str], cairn.append]
    count: int


def work_v1(state: TallyV1, ctx: cairn.Context) -> dict[str, Any]:
    if state.n == 1:
        ctx.sleep(NAP)  # the run waits here (suspended) while the new code is deployed
    return {"log": [f"v1:{state.n}"], "n": state.n + 1}


def work_v2(state: TallyV2, ctx: cairn.Context) -> dict[str, Any]:
    if state.count == 1:
        ctx.sleep(NAP)
    return {"log": [f"v2:{state.count}"], "count": state.count + 1}


def graph_v1() -> cairn.Graph:
    g = cairn.Graph(TallyV1)
    g.node(work_v1, name="work")
    g.edge(cairn.START, "work")
    g.route("work", lambda s: cairn.END if s.n >= 3 else "work")
    return g


def graph_v2() -> cairn.Graph:
    g = cairn.Graph(TallyV2)
    g.node(work_v2, name="work")
    g.edge(cairn.START, "work")
    g.route("work", lambda s: cairn.END if s.count >= 3 else "work")
    return g


def rename(data: dict[str, Any]) -> dict[str, Any]:
    return {"log": data["log"], "count": data["n"]}


def _drain(app: cairn.App, seconds: float = 0.3) -> None:
    app.worker(poll_interval=0.02).run(install_signals=False, max_idle=seconds)


@pytest.fixture(params=BACKENDS)
def apps(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[cairn.App, cairn.App]]:
    """Two deployments on one database: the old code's app and the new code's."""
    if request.param == "postgres":
        url = postgres_url(request.getfixturevalue("pg_url"))
    else:
        url = f"sqlite:///{tmp_path}/cairn.db"
    old, new = cairn.App(db=url, lease_seconds=1.0), cairn.App(db=url, lease_seconds=1.0)
    yield old, new
    old.close()
    new.close()


def paused(old: cairn.App) -> str:
    """A run of the old code, suspended in super-step 2 (checkpoints 0 and 1 written)."""
    run = old.start(old.graph("tally", graph_v1()), TallyV1([], 0))
    _drain(old, 0.1)
    assert old.get_run(run.run_id).status is RunStatus.SUSPENDED
    assert [c.step for c in old.checkpoints(run.run_id)] == [1, 0]
    wait_until_due(old, run.run_id)
    return run.run_id


def checkpoint_json(app: cairn.App, run_id: str, step: int) -> dict[str, Any]:
    for entry in app.history(run_id):
        if entry.step_kind == format_.KIND and entry.name == format_.entry_name(step) and entry.payload:
            found: dict[str, Any] = json.loads(app.runtime.payloads.raw(entry.payload, what="a checkpoint"))
            return found
    raise AssertionError(f"no checkpoint {step}")


def test_old_checkpoints_read_through_the_upcaster_and_the_run_goes_on(
        apps: tuple[cairn.App, cairn.App]) -> None:
    app, new_app = apps
    run_id = paused(app)
    new_app.graph("tally", graph_v2())
    new_app.upcaster(TallyV2, from_version=1)(rename)
    try:
        report, _ = new_app.migrate(run_id)  # the replay check reads the old checkpoint, upcast
        assert report.compatible, report.describe()
        _drain(new_app)
        assert new_app.get_run(run_id).status is RunStatus.COMPLETED, new_app.get_run(run_id).error
        final = new_app.handle(run_id).result(timeout=5)
        assert final == TallyV2(["v1:0", "v2:1", "v2:2"], 3)
        assert new_app.graph_state(run_id, 1) == TallyV2(["v1:0"], 1)  # an old checkpoint, upcast
        assert new_app.graph_state(run_id, 0) == TallyV2([], 0)
        resumed = checkpoint_json(new_app, run_id, 2)  # the first of version 2: every field set
        assert resumed["sv"] == 2
        assert resumed["set"] == {"log": ["v1:0", "v2:1"], "count": 2}
        assert resumed["versions"] == {"log": [2, 2], "count": [2, 2]}
        assert "sv" not in checkpoint_json(new_app, run_id, 1)
        after = checkpoint_json(new_app, run_id, 3)  # then by reference again
        assert after["add"] == {"log": ["v2:2"]}
        assert after["versions"]["log"] == [3, 2]
    finally:
        upcasters.unregister(TallyV2, 1)  # process-wide: the next backend's run starts without it


def test_with_no_upcaster_the_run_is_parked_until_one_is_deployed(apps: tuple[cairn.App, cairn.App]) -> None:
    app, new_app = apps
    run_id = paused(app)
    new_app.graph("tally", graph_v2())
    try:
        report, _ = new_app.migrate(run_id, force=True, reason="the state type changed")
        assert not report.compatible
        _drain(new_app)
        record = new_app.get_run(run_id)
        assert record.status is RunStatus.INCOMPATIBLE, (record.status, record.error)
        [parked] = [e for e in new_app.history(run_id) if e.event is EventType.RUN_INCOMPATIBLE]
        assert parked.detail is not None
        assert parked.detail["type"] == "TallyV2"
        assert "no upcaster from version 1" in parked.detail["why"]
        claims = sum(1 for e in new_app.history(run_id) if e.event is EventType.LEASE_CLAIMED)
        _drain(new_app)
        assert sum(1 for e in new_app.history(run_id) if e.event is EventType.LEASE_CLAIMED) == claims
        with pytest.raises(IncompatiblePayload):
            new_app.graph_state(run_id, 1)
        new_app.upcaster(TallyV2, from_version=1)(rename)  # the fix, deployed
        new_app.retry(run_id)
        _drain(new_app)
        assert new_app.handle(run_id).result(timeout=5) == TallyV2(["v1:0", "v2:1", "v2:2"], 3)
    finally:
        upcasters.unregister(TallyV2, 1)


@dataclass
class TallyGrown:  # a required field added, no version declared: old checkpoints cannot fill it
    log: Annotated[list[str], cairn.append]
    n: int
    owner: str


def test_a_state_type_that_gained_a_required_field_parks_the_run(apps: tuple[cairn.App, cairn.App]) -> None:
    app, new_app = apps
    run_id = paused(app)
    g = cairn.Graph(TallyGrown)
    g.node(lambda state: {"log": [state.owner], "n": state.n + 1}, name="work")
    g.edge(cairn.START, "work")
    g.route("work", lambda s: cairn.END if s.n >= 3 else "work")
    new_app.graph("tally", g)
    new_app.migrate(run_id, force=True, reason="the state type changed")
    _drain(new_app)
    record = new_app.get_run(run_id)
    assert record.status is RunStatus.INCOMPATIBLE, (record.status, record.error)


@dataclass
class ItemV1:
    name: str


@dataclass
class ItemV2:  # the item type changed; the state type around it did not declare a version
    __cairn_version__: ClassVar[int] = 2
    name: str
    qty: int


@dataclass
class CartV1:
    items: Annotated[list[ItemV1], cairn.append]
    n: int


@dataclass
class CartV2:
    items: Annotated[list[ItemV2], cairn.append]
    n: int


def cart_v1(state: CartV1, ctx: cairn.Context) -> dict[str, Any]:
    if state.n == 1:
        ctx.sleep(NAP)
    return {"items": [ItemV1(f"v1:{state.n}")], "n": state.n + 1}


def cart_v2(state: CartV2, ctx: cairn.Context) -> dict[str, Any]:
    if state.n == 1:
        ctx.sleep(NAP)
    return {"items": [ItemV2(f"v2:{state.n}", sum(i.qty for i in state.items))], "n": state.n + 1}


def cart(state: Any, node: Any) -> cairn.Graph:
    g = cairn.Graph(state)
    g.node(node, name="work")
    g.edge(cairn.START, "work")
    g.route("work", lambda s: cairn.END if s.n >= 3 else "work")
    return g


def test_a_changed_item_type_in_an_appended_list_reads_through_its_upcaster(
        apps: tuple[cairn.App, cairn.App]) -> None:
    app, new_app = apps
    run = app.start(app.graph("cart", cart(CartV1, cart_v1)), CartV1([], 0))
    _drain(app, 0.1)
    wait_until_due(app, run.run_id)
    new_app.graph("cart", cart(CartV2, cart_v2))
    new_app.upcaster(ItemV2, from_version=1)(lambda data: {**data, "qty": 1})
    try:
        report, _ = new_app.migrate(run.run_id)
        assert report.compatible, report.describe()
        _drain(new_app)
        assert new_app.handle(run.run_id).result(timeout=5) == CartV2(
            [ItemV2("v1:0", 1), ItemV2("v2:1", 1), ItemV2("v2:2", 2)], 3)
        assert new_app.graph_state(run.run_id, 1) == CartV2([ItemV2("v1:0", 1)], 1)
    finally:
        upcasters.unregister(ItemV2, 1)
