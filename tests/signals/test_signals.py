"""Signals: ``ctx.wait_for_signal``, ``app.signal``, ``ctx.signal`` (issue 11, item 1).

Every test runs on SQLite and PostgreSQL (the ``app`` fixture) and, where a
workflow is involved, as a sync and as an async workflow (``both``): the
async one awaits ``ctx.wait_for_signal_async``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import pytest
from pydantic import BaseModel

import cairn
from cairn.store.records import Delivery, EventType, RunStatus
from tests.engine.conftest import execute_once
from tests.engine.kinds import Flow, Kind, both
from tests.signals.conftest import worker_thread
from tests.timing import NAP, SLACK, wait_out_nap


def recv(kind: Kind, ctx: cairn.Context, name: str, **options: Any) -> Any:
    """What a workflow body yields to wait: the value (sync) or an awaitable (async)."""
    if kind.is_async:
        return ctx.wait_for_signal_async(name, **options)
    return ctx.wait_for_signal(name, **options)


class Approval(BaseModel):
    approved: bool
    by: str


@both
def test_a_waiting_run_is_suspended_and_a_signal_resumes_it_with_typed_data(
    app: cairn.App, kind: Kind
) -> None:
    @kind.workflow(app, "approve")
    def flow(ctx: cairn.Context) -> Flow[str]:
        decision = yield recv(kind, ctx, "approve", type_=Approval)
        assert isinstance(decision, Approval)
        return f"{decision.approved} by {decision.by}"

    run_id = app.start(flow).run_id
    assert execute_once(app, run_id) == "suspended"
    record = app.get_run(run_id)
    assert record.status is RunStatus.SUSPENDED
    assert record.waiting_for == "signal:approve"
    assert record.owner is None
    assert record.wake_at is None
    assert app.store.claim_run(run_id, "w", 5.0, 5) is None  # not runnable until the signal

    delivery = app.signal(run_id, "approve", {"approved": True, "by": "ada"})
    assert delivery.sender == cairn.api.operator.app_actor()
    assert execute_once(app, run_id) == "completed"
    assert app.handle(run_id).result(timeout=5) == "True by ada"
    taken = [e for e in app.history(run_id) if e.step_kind == "signal"]
    assert len(taken) == 1
    assert taken[0].detail is not None
    assert taken[0].detail["delivery"] == delivery.seq
    assert taken[0].detail["sender"] == delivery.sender


@both
def test_a_signal_sent_before_the_wait_is_kept(app: cairn.App, kind: Kind) -> None:
    gate = threading.Event()

    @app.step
    def hold() -> None:
        gate.wait(10)

    @kind.workflow(app, "early")
    def flow(ctx: cairn.Context) -> Flow[int]:
        yield hold()
        value = yield recv(kind, ctx, "n", type_=int)
        return value

    run_id = app.start(flow).run_id
    app.signal(run_id, "n", 7)  # before the run even started
    gate.set()
    assert execute_once(app, run_id) == "completed"
    assert app.handle(run_id).result(timeout=5) == 7


@both
def test_several_signals_are_received_in_order_each_once(app: cairn.App, kind: Kind) -> None:
    @kind.workflow(app, "three")
    def flow(ctx: cairn.Context) -> Flow[list[int]]:
        got = []
        for _ in range(3):
            got.append((yield recv(kind, ctx, "n", type_=int)))
        return got

    run_id = app.start(flow).run_id
    for n in (3, 1, 2):
        app.signal(run_id, "n", n)
    app.signal(run_id, "other", 99)  # another name is not taken by a wait for "n"
    status = execute_once(app, run_id)
    assert status == "completed"
    assert app.handle(run_id).result(timeout=5) == [3, 1, 2]
    mailbox = app.operator.mailbox(run_id)
    positions = [m.taken_position for m in mailbox if m.key == "signal:n"]
    assert None not in positions
    assert len(set(positions)) == 3
    assert [m.taken_at for m in mailbox if m.key == "signal:other"] == [None]


@both
def test_a_timeout_raises_signal_timeout_and_is_journaled(app: cairn.App, kind: Kind) -> None:
    @kind.workflow(app, "timeout")
    def flow(ctx: cairn.Context) -> Flow[str]:
        try:
            yield recv(kind, ctx, "late", timeout=NAP)  # not due before its entry commits
        except cairn.SignalTimeout as timeout:
            return f"timed out: {timeout.name}"
        return "signalled"

    run_id = app.start(flow).run_id
    assert execute_once(app, run_id) == "suspended"
    record = app.get_run(run_id)
    assert record.waiting_for == "signal:late"
    assert record.wake_at is not None
    wait_out_nap()
    assert execute_once(app, run_id) == "completed"
    assert app.handle(run_id).result(timeout=5) == "timed out: late"
    failed = [e for e in app.history(run_id) if e.step_kind == "signal"]
    assert [e.event for e in failed] == [EventType.STEP_FAILED]
    with pytest.raises(cairn.CairnError, match="completed: it takes no more deliveries"):  # too late
        app.signal(run_id, "late", 1)


@both
def test_the_deadline_is_recorded_once_and_fires_on_another_app(app: cairn.App, kind: Kind) -> None:
    """The timeout is a durable deadline: a replay (here on a second App,
    as a restarted worker would be) uses the recorded one, not a new one."""

    @kind.workflow(app, "deadline")
    def flow(ctx: cairn.Context) -> Flow[str]:
        try:
            value = yield recv(kind, ctx, "go", timeout=NAP)
        except cairn.SignalTimeout:
            return "timeout"
        return str(value)

    run_id = app.start(flow).run_id
    assert execute_once(app, run_id) == "suspended"
    deadline = next(e for e in app.history(run_id) if e.step_kind == "signal_deadline")
    wait_out_nap()
    other = cairn.App(db=app.db_url)
    try:
        kind.workflow(other, "deadline")(flow.definition.fn.__wrapped__)
        assert execute_once(other, run_id) == "completed"
    finally:
        other.close()
    assert app.handle(run_id).result(timeout=5) == "timeout"
    assert [e.seq for e in app.history(run_id) if e.step_kind == "signal_deadline"] == [deadline.seq]


@both
def test_data_that_does_not_fit_the_type_is_consumed_and_raises_invalid_signal(
    app: cairn.App, kind: Kind
) -> None:
    @kind.workflow(app, "typed")
    def flow(ctx: cairn.Context) -> Flow[list[Any]]:
        seen: list[Any] = []
        while True:
            try:
                value = yield recv(kind, ctx, "n", type_=int)
            except cairn.InvalidSignal as bad:
                seen.append(f"bad from {bad.sender}")
                continue
            seen.append(value)
            return seen

    run_id = app.start(flow).run_id
    app.signal(run_id, "n", "not a number")
    app.signal(run_id, "n", 5)
    assert execute_once(app, run_id) == "completed"
    assert app.handle(run_id).result(timeout=5) == [f"bad from {cairn.api.operator.app_actor()}", 5]
    assert all(m.taken_at is not None for m in app.operator.mailbox(run_id))


def test_a_signal_to_an_unknown_or_finished_run_is_refused(app: cairn.App) -> None:
    @app.workflow(name="done")
    def done(ctx: cairn.Context) -> int:
        return 1

    with pytest.raises(cairn.RunNotFound, match="no run with id 'nope'"):
        app.signal("nope", "go", 1)
    run_id = app.start(done).run_id
    assert execute_once(app, run_id) == "completed"
    with pytest.raises(cairn.CairnError, match="is completed"):
        app.signal(run_id, "go", 1)
    assert app.operator.mailbox(run_id) == []


@pytest.mark.parametrize("name", ["", "a\nb", "x" * 201])
def test_bad_signal_names_are_refused(app: cairn.App, name: str) -> None:
    @app.workflow(name="w")
    def w(ctx: cairn.Context) -> int:
        return 1

    run_id = app.start(w).run_id
    with pytest.raises(cairn.InvalidArgument):
        app.signal(run_id, name, 1)
    with pytest.raises(cairn.PayloadError):
        app.signal(run_id, "ok", float("nan"))  # nothing JSON cannot hold is delivered
    assert app.operator.mailbox(run_id) == []


def test_app_signal_with_a_dedupe_key_delivers_once(app: cairn.App) -> None:
    @app.workflow(name="w")
    def w(ctx: cairn.Context) -> int:
        return int(ctx.wait_for_signal("n"))

    run_id = app.start(w).run_id
    first = app.signal(run_id, "n", 1, dedupe="k")
    again = app.signal(run_id, "n", 2, dedupe="k")
    assert again.seq == first.seq
    assert [m.payload for m in app.operator.mailbox(run_id)] == [first.payload]


# -- between runs -----------------------------------------------------------------------------


@both
def test_ctx_signal_delivers_once_and_replay_sends_nothing_more(app: cairn.App, kind: Kind) -> None:
    @kind.workflow(app, "receiver")
    def receiver(ctx: cairn.Context) -> Flow[str]:
        value = yield recv(kind, ctx, "go", type_=str)
        return value

    @kind.workflow(app, "sender")
    def sender(ctx: cairn.Context, target: str) -> Flow[int]:
        seq = ctx.signal(target, "go", "from the sender")
        yield ctx.sleep(NAP)  # a suspension: the next execution replays the send
        return seq

    receiver_id = app.start(receiver).run_id
    sender_id = app.start(sender, receiver_id).run_id
    assert execute_once(app, sender_id) == "suspended"
    wait_out_nap()
    assert execute_once(app, sender_id) == "completed"
    mailbox = app.operator.mailbox(receiver_id)
    assert len(mailbox) == 1
    assert mailbox[0].sender == f"run:{sender_id}"
    assert app.handle(sender_id).result(timeout=5) == mailbox[0].seq
    assert execute_once(app, receiver_id) == "completed"
    assert app.handle(receiver_id).result(timeout=5) == "from the sender"


def test_ctx_signal_to_another_tenant_is_refused_like_an_unknown_run(app: cairn.App) -> None:
    @app.workflow(name="victim")
    def victim(ctx: cairn.Context) -> str:
        return str(ctx.wait_for_signal("go"))

    @app.workflow(name="attacker")
    def attacker(ctx: cairn.Context, target: str) -> str:
        try:
            ctx.signal(target, "go", "pwned")
        except cairn.SignalRefused as refused:
            return str(refused)
        return "sent"

    victim_id = app.start(victim, tenant="acme").run_id
    other = app.start(attacker, victim_id, tenant="globex").run_id
    unknown = app.start(attacker, "no-such-run", tenant="globex").run_id
    for run_id in (other, unknown):
        assert execute_once(app, run_id) == "completed"
    told_other = app.handle(other).result(timeout=5)
    told_unknown = app.handle(unknown).result(timeout=5)
    assert told_other == f"no run with id {victim_id!r}"
    assert told_unknown == "no run with id 'no-such-run'"
    assert app.operator.mailbox(victim_id) == []


def test_ctx_signal_to_a_finished_run_is_refused_and_recorded(app: cairn.App) -> None:
    @app.workflow(name="quick")
    def quick(ctx: cairn.Context) -> int:
        return 1

    @app.workflow(name="late")
    def late(ctx: cairn.Context, target: str) -> str:
        try:
            ctx.signal(target, "go", 1)
        except cairn.SignalRefused as refused:
            ctx.sleep(NAP)  # replay must raise the same refusal, not send
            return refused.reason
        return "sent"

    target = app.start(quick).run_id
    assert execute_once(app, target) == "completed"
    run_id = app.start(late, target).run_id
    assert execute_once(app, run_id) == "suspended"
    wait_out_nap()
    assert execute_once(app, run_id) == "completed"
    assert "is completed" in app.handle(run_id).result(timeout=5)
    refused = [e for e in app.history(run_id) if e.step_kind == "send_signal"]
    assert [e.event for e in refused] == [EventType.STEP_FAILED]


# -- workers ----------------------------------------------------------------------------------------


@both
def test_a_waiting_run_holds_no_worker_slot(app: cairn.App, kind: Kind) -> None:
    @kind.workflow(app, "waiter")
    def waiter(ctx: cairn.Context) -> Flow[str]:
        value = yield recv(kind, ctx, "go", type_=str)
        return value

    @app.workflow(name="other")
    def other(ctx: cairn.Context) -> str:
        return "done"

    with worker_thread(app, concurrency=1):
        waiting = app.start(waiter).run_id
        deadline = time.monotonic() + 10 * SLACK
        while app.get_run(waiting).status is not RunStatus.SUSPENDED:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        # the only slot is free: another run goes through while this one waits
        assert app.start(other).result(timeout=10) == "done"
        app.signal(waiting, "go", "resumed")
        assert app.handle(waiting).result(timeout=10) == "resumed"


def test_a_worker_wakes_on_a_signal_without_polling(app: cairn.App) -> None:
    """With a poll interval of a minute, only the store's wake-up (SQLite's
    datagram, PostgreSQL's NOTIFY) can start the run's next step in time."""

    @app.workflow(name="woken")
    def woken(ctx: cairn.Context) -> str:
        return str(ctx.wait_for_signal("go"))

    with worker_thread(app, poll=60.0):
        run_id = app.start(woken).run_id  # a new run: woken by the store too
        deadline = time.monotonic() + 10 * SLACK
        while app.get_run(run_id).status is not RunStatus.SUSPENDED:
            assert time.monotonic() < deadline, "the new run was not claimed: no wake-up"
            time.sleep(0.01)
        app.signal(run_id, "go", "now")
        assert app.handle(run_id).result(timeout=10) == "now"


@both
def test_app_run_waits_for_a_signal_sent_from_another_thread(app: cairn.App, kind: Kind) -> None:
    @kind.workflow(app, "inline")
    def flow(ctx: cairn.Context) -> Flow[str]:
        value = yield recv(kind, ctx, "go", type_=str)
        with contextlib.suppress(cairn.SignalTimeout):
            yield recv(kind, ctx, "never", timeout=0.1)
        return value

    def send_later() -> None:
        deadline = time.monotonic() + 10 * SLACK
        while time.monotonic() < deadline:
            runs = app.list_runs(workflow="inline", status="suspended")
            if runs:
                app.signal(runs[0].run_id, "go", "hello")
                return
            time.sleep(0.01)

    sender = threading.Thread(target=send_later)
    sender.start()
    assert app.run(flow) == "hello"
    sender.join()


def test_a_rewind_past_the_receive_reads_the_same_signal_again(app: cairn.App) -> None:
    """A logical rewind voids the entry that consumed the message: the
    re-executed code receives that very message again, not the next one."""

    @app.step(name="plan")
    def plan() -> int:
        return 1

    @app.workflow(name="rewound")
    def rewound(ctx: cairn.Context) -> list[int]:
        plan()
        first = int(ctx.wait_for_signal("n", type_=int))
        if not ctx.rewinds():
            raise cairn.LogicalFailure("think again", rewind_to="plan")
        return [first, len(ctx.rewinds())]

    run_id = app.start(rewound).run_id
    app.signal(run_id, "n", 10)
    app.signal(run_id, "n", 20)
    for _ in range(3):
        if execute_once(app, run_id) == "completed":
            break
    assert app.handle(run_id).result(timeout=5) == [10, 1]
    mailbox = app.operator.mailbox(run_id)
    assert [m.taken_at is not None for m in mailbox] == [True, False]  # 20 is still there


def test_a_message_freed_by_a_rewind_is_received_again_later(app: cairn.App) -> None:
    """Position p takes M1 (signal "a"); a rewind voids it and the re-executed
    p takes M2 (signal "b") instead: M1 is free again, and a later receive
    of "a" gets M1, not a suspension."""

    @app.step(name="plan")
    def plan() -> int:
        return 1

    @app.workflow(name="freed")
    def freed(ctx: cairn.Context) -> list[int]:
        plan()
        name = "b" if ctx.rewinds() else "a"
        first = int(ctx.wait_for_signal(name, type_=int))  # position p, both times
        if not ctx.rewinds():
            raise cairn.LogicalFailure("think again", rewind_to="plan")
        later = int(ctx.wait_for_signal("a", type_=int))
        return [first, later]

    run_id = app.start(freed).run_id
    app.signal(run_id, "a", 10)
    app.signal(run_id, "b", 20)
    for _ in range(3):
        if execute_once(app, run_id) == "completed":
            break
    assert app.handle(run_id).result(timeout=5) == [20, 10]
    mailbox = app.operator.mailbox(run_id)
    assert [m.taken_at is not None for m in mailbox] == [True, True]
    assert len({m.taken_position for m in mailbox}) == 2  # M1 was taken again, at the later receive


def _count_mailbox_rows(app: cairn.App, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """An instrumented store: every mailbox message any store method hands
    the engine is counted (``rows[0]``), whatever the method."""
    rows = [0]
    store = app.store
    for name in dir(type(store)):
        method = getattr(store, name, None)
        if name.startswith("_") or not callable(method):
            continue

        def counting(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
            result = _method(*args, **kwargs)
            found = result if isinstance(result, list) else [result]
            rows[0] += sum(1 for item in found if isinstance(item, Delivery))
            return result

        monkeypatch.setattr(store, name, counting)
    return rows


@both
def test_taking_queued_signals_reads_one_message_each(
    app: cairn.App, kind: Kind, monkeypatch: pytest.MonkeyPatch
) -> None:
    """N signals queued for a suspended run: each receive reads the message it
    takes, not the run's whole mailbox for its key (which made taking N of
    them read N²/2 rows: 1,000 signals, ~500,000 rows)."""
    count = 60

    @kind.workflow(app, "drain")
    def flow(ctx: cairn.Context) -> Flow[int]:
        total = 0
        for _ in range(count):
            total += yield recv(kind, ctx, "n", type_=int)
        return total

    run_id = app.start(flow).run_id
    assert execute_once(app, run_id) == "suspended"
    for n in range(count):
        app.signal(run_id, "n", n)
    rows = _count_mailbox_rows(app, monkeypatch)
    assert execute_once(app, run_id) == "completed"
    assert app.handle(run_id).result(timeout=5) == sum(range(count))
    assert rows[0] <= count + 1, f"{rows[0]} mailbox rows read to take {count} messages"
