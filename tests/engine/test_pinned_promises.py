"""Issue 10 item 13: promises that no test pinned.

Each was broken on purpose (one line) and the relevant suite still passed.
Every test here names the line whose removal makes it fail:

* the ``cost`` and ``wall_seconds`` limits of a budget (``Budget.exceeded``);
* non-determinism detected on the call *kind*, not only the name
  (``Execution._check``: ``recorded.step_kind == kind``);
* ``TerminalError`` from a ``write`` tool is a definite failure, not an
  uncertain effect (``_ToolCall._failed``);
* the lease keeper stops a stale worker at its next step boundary, before a
  step body runs (``LeaseKeeper.renew_now`` and ``Execution.checkpoint``),
  where the fence alone would let the body run and only refuse its record;
* the decoder produces only types the code named (``codec.values.dec_hook``).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn.codec import values
from cairn.engine.executor import execute
from cairn.errors import PayloadError
from cairn.models import Message, ModelRequest, ModelResponse, Usage
from cairn.store.records import EventType, RunStatus
from cairn.store.sqlite import SQLiteStore
from cairn.worker.leases import LeaseKeeper
from tests.acceptance.harness import FakeClock, wait_until
from tests.engine.conftest import Calls, execute_once
from tests.timing import NAP, wait_out_nap


def _suspension(app: cairn.App, run_id: str) -> dict[str, Any]:
    suspended = [e for e in app.history(run_id) if e.event is EventType.RUN_SUSPENDED][-1]
    assert suspended.detail is not None
    return suspended.detail


# -- budgets: cost and wall time ----------------------------------------------------------------


class PricedModel:
    """A model whose every answer costs 0.3 (and almost no tokens)."""

    model_id = "priced-1"

    def __init__(self) -> None:
        self.calls = 0

    def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        return ModelResponse(message=Message(role="assistant", content="ok"), model=self.model_id,
                             usage=Usage(1, 1, 2), cost=0.3)


def test_the_cost_limit_suspends_before_the_next_model_call(app: cairn.App) -> None:
    model = PricedModel()

    @app.workflow(name="spender")
    def spender(ctx: cairn.Context) -> int:
        for _ in range(3):
            ctx.model(model, [Message(role="user", content="go")])
        return model.calls

    app.start(spender, run_id="cost", budget=cairn.Budget(cost=0.5, tokens=10_000))
    assert execute_once(app, "cost") == "suspended"
    detail = _suspension(app, "cost")
    assert (detail["reason"], detail["limit"]) == ("budget_exceeded", "cost")
    assert detail["used"] == pytest.approx(0.6)
    assert model.calls == 2  # the second call crossed 0.5; the third was never sent
    app.set_budget("cost", cairn.Budget(cost=5.0))
    assert app.resume("cost") == 3


def test_the_wall_time_limit_suspends_before_the_next_tool_call(app: cairn.App, calls: Calls) -> None:
    @app.tool(effect="read")
    def look() -> int:
        calls.hit("look")
        return 1

    @app.workflow(name="late")
    def late(ctx: cairn.Context) -> int:
        return int(look())

    app.start(late, run_id="wall", budget=cairn.Budget(wall_seconds=0.3, tool_calls=100))
    created = app.get_run("wall").created_at
    wait_until(lambda: time.time() - created > 0.35, 5, "the run to be older than its wall-time limit")
    assert execute_once(app, "wall") == "suspended"
    detail = _suspension(app, "wall")
    assert (detail["reason"], detail["limit"]) == ("budget_exceeded", "wall_seconds")
    assert calls["look"] == 0
    app.set_budget("wall", cairn.Budget(wall_seconds=3600))
    assert app.resume("wall") == 1
    assert calls["look"] == 1


# -- non-determinism on the call kind -----------------------------------------------------------


def test_a_tool_where_the_journal_has_a_step_of_the_same_name_is_non_determinism(
    app: cairn.App, calls: Calls
) -> None:
    """Same name, same arguments, same position; only the kind changed (a
    step became a tool in a deploy). Replaying the step's record as the
    tool's result would skip a side effect that never happened."""
    version = {"v": 1}

    @app.step(name="charge")
    def charge_step(amount: int) -> str:
        calls.hit("step")
        return f"step charged {amount}"

    @app.tool(name="charge", effect="write")
    def charge_tool(amount: int) -> str:
        calls.hit("tool")
        return f"tool charged {amount}"

    @app.workflow(name="billing")
    def billing(ctx: cairn.Context) -> str:
        result = charge_step(5) if version["v"] == 1 else charge_tool(5)
        ctx.sleep(NAP)
        return str(result)

    app.start(billing, run_id="kind")
    assert execute_once(app, "kind") == "suspended"
    version["v"] = 2
    wait_out_nap()
    with pytest.raises(cairn.RunFailed, match="NonDeterminismError"):
        app.resume("kind")
    assert calls.counts == {"step": 1}


# -- TerminalError from a write tool ------------------------------------------------------------


def test_a_terminal_error_from_a_write_tool_is_a_definite_failure(app: cairn.App, calls: Calls) -> None:
    """The tool itself says the request was refused (card declined): the
    run fails at once; nothing is left uncertain, no operator is asked, and
    the reconciler is never consulted."""

    def reconcile(op: cairn.Operation, amount: int) -> Any:
        calls.hit("reconcile")
        raise AssertionError("a definite failure must not be reconciled")

    @app.tool(effect="write", reconcile=reconcile)
    def pay(op: cairn.Operation, amount: int) -> str:
        calls.hit("pay")
        raise cairn.TerminalError("card declined")

    @app.tool(effect="write")
    def pay_unreconciled(op: cairn.Operation, amount: int) -> str:
        calls.hit("pay_unreconciled")
        raise cairn.TerminalError("card declined")

    @app.workflow(name="declined")
    def declined(ctx: cairn.Context, which: str) -> str:
        return str(pay(10) if which == "reconciled" else pay_unreconciled(10))

    for which in ("reconciled", "unreconciled"):
        app.start(declined, which, run_id=which)
        assert execute_once(app, which) == "failed"  # one pass: no reconciliation, no operator
        run = app.get_run(which)
        assert run.status is RunStatus.FAILED
        assert run.error is not None
        assert "card declined" in run.error["message"]
        assert [op["status"] for op in app.operations(which)] == ["failed"]
    assert calls.counts == {"pay": 1, "pay_unreconciled": 1}


# -- the lease keeper stops a stale worker at the next step boundary ----------------------------


@pytest.mark.parametrize("app", ["sqlite"], indirect=True)  # the store below runs on a fake clock
def test_a_stale_worker_stops_at_the_next_step_boundary(app: cairn.App, tmp_path: Path, calls: Calls) -> None:
    """Worker w1 recorded step ``first`` and is between steps when its lease
    expires and w2 takes the run over. w1's keeper notices at its next
    renewal; w1 must then stop before ``second``'s body, which would
    otherwise run (a duplicate side effect) and only have its record
    refused by the fence."""
    clock = FakeClock(time.time())
    store = SQLiteStore(tmp_path / "stale.db", clock=clock)
    stale_app = cairn.App(store=store)
    between, go_on = threading.Event(), threading.Event()

    @stale_app.step()
    def first() -> int:
        calls.hit("first")
        return 1

    @stale_app.step()
    def second() -> int:
        calls.hit("second")
        return 2

    @stale_app.workflow(name="two")
    def two(ctx: cairn.Context) -> int:
        a = first()
        between.set()
        assert go_on.wait(10)
        return a + second()

    try:
        stale_app.start(two, run_id="s")
        claim = store.claim_run("s", "w1", 5.0, 5)
        assert claim is not None
        keeper = LeaseKeeper(store, "w1", 300.0)  # its own beat (every 100 s) never fires here
        outcome: list[str] = []

        def run_w1() -> None:
            outcome.append(execute(stale_app.runtime, claim, "w1", keeper).status)

        w1 = threading.Thread(target=run_w1)
        w1.start()
        assert between.wait(10)
        clock.advance(10)  # w1's lease expired ...
        assert store.claim_run("s", "w2", 5.0, 5) is not None  # ... and w2 took the run over
        keeper.renew_now()  # w1's next heartbeat
        go_on.set()
        w1.join(timeout=10)
        keeper.close()
        assert outcome in (["abandoned"], ["lost"])
        assert calls.counts == {"first": 1}  # second's body never ran on the stale worker
    finally:
        stale_app.close()


# -- the decoder makes only the types the code named --------------------------------------------


@dataclasses.dataclass
class Refund:
    order: str
    amount: int


class Opaque:
    """A plain class: msgspec cannot build it, and Cairn must not pretend to."""

    def __init__(self, secret: str) -> None:
        self.secret = secret


CRAFTED = b'{"__class__": "subprocess.Popen", "__module__": "subprocess", "args": ["rm", "-rf", "/"]}'


def test_the_decoder_refuses_a_type_it_cannot_build_instead_of_passing_the_data_through() -> None:
    with pytest.raises(PayloadError, match="cannot decode"):
        values.decode(b'{"secret": "x"}', Opaque)
    with pytest.raises(PayloadError, match="cannot decode"):
        values.decode(CRAFTED, Opaque)


def test_stored_bytes_never_choose_the_type() -> None:
    """A crafted payload that names a class becomes plain JSON, or the
    type the code asked for, or an error: never the class it names."""
    assert values.decode(CRAFTED, Any) == {"__class__": "subprocess.Popen", "__module__": "subprocess",
                                           "args": ["rm", "-rf", "/"]}
    assert type(values.decode(CRAFTED, object)) is dict
    with pytest.raises(PayloadError):
        values.decode(CRAFTED, Refund)
    refund = values.decode(b'{"order": "o1", "amount": 5, "__class__": "subprocess.Popen"}', Refund)
    assert type(refund) is Refund
    assert refund == Refund("o1", 5)


def test_a_pydantic_payload_cannot_choose_a_subclass() -> None:
    pydantic = pytest.importorskip("pydantic")

    class Base(pydantic.BaseModel):  # type: ignore[misc, name-defined]
        name: str

    class Admin(Base):  # type: ignore[misc, valid-type]
        is_admin: bool = True

    decoded = values.decode(b'{"name": "eve", "is_admin": true, "__class__": "Admin"}', Base)
    assert type(decoded) is Base
