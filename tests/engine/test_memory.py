"""Memory in workflows, steps and tools (issue 14 item 2), sync and async.

A step's or tool's ``memory`` writes commit with its journal entry: replay
of a recorded step does not write again, a failed attempt's writes never
land. ``ctx.memory`` reads are journaled (replay sees what the first
execution saw) and its writes are journaled calls of their own.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

import cairn
from cairn.store.records import EventType
from tests.engine.conftest import execute_once
from tests.engine.kinds import Flow, Kind, both

NS = ("users", "u1")


def _item(app: cairn.App, key: str, tenant: str = "default") -> cairn.Item | None:
    return app.operator.memory_item(tenant, NS, key)


def _memory_entries(app: cairn.App, run_id: str) -> list[str]:
    return [e.name or "" for e in app.history(run_id)
            if e.event is EventType.STEP_COMPLETED and e.step_kind == "memory"]


@both
def test_a_step_writes_with_its_record_and_replay_does_not_write_again(app: cairn.App, kind: Kind) -> None:
    ran: list[int] = []

    def remember(text: str) -> str:
        ran.append(1)
        info = cairn.step_info()
        info.memory.put(NS, "pref", {"text": text}, index=text, metadata={"src": "step"})
        info.memory.run.put("scratch", [1, 2])
        info.memory.thread("th").append({"role": "user", "content": text})
        return text.upper()

    step = app.step()(kind.fn(remember))

    @kind.workflow(app, "writer")
    def writer(ctx: cairn.Context, text: str) -> Flow[str]:
        out = yield step(text)
        ctx.sleep(0.5)  # the next execution replays the step (never due at once: commits are slow)
        return out

    app.start(writer, "dark <b>mode</b> \u202e", run_id="w1", thread_id="th")
    assert execute_once(app, "w1") == "suspended"
    time.sleep(0.55)
    assert app.resume("w1") == "DARK <B>MODE</B> \u202e"
    assert ran == [1]
    item = _item(app, "pref")
    assert item is not None
    expected = ({"text": "dark <b>mode</b> \u202e"}, 1, {"src": "step"})
    assert (item.value, item.version, item.metadata) == expected
    step_entry = next(e for e in app.history("w1") if e.step_kind == "step")
    assert (item.run_id, item.position, item.operation_id) == (
        "w1", step_entry.position, cairn.operation_id("w1", step_entry.position or 0))
    assert app.operator.run_memory("w1") == {"scratch": [1, 2]}
    assert [m.value for m in app.operator.thread_messages("default", "th")] == [
        {"role": "user", "content": "dark <b>mode</b> \u202e"}]


@both
def test_a_failed_attempt_writes_nothing(app: cairn.App, kind: Kind) -> None:
    attempts: list[int] = []

    def flaky() -> int:
        attempts.append(1)
        cairn.step_info().memory.put(NS, f"attempt-{len(attempts)}", len(attempts))
        if len(attempts) == 1:
            raise RuntimeError("first attempt fails after writing")
        return len(attempts)

    step = app.step(retry=cairn.RetryPolicy(max_attempts=2, initial_delay=0.0, jitter=0.0))(kind.fn(flaky))

    @kind.workflow(app, "flaky")
    def flow(ctx: cairn.Context) -> Flow[int]:
        return (yield step())

    assert app.run(flow) == 2
    assert _item(app, "attempt-1") is None
    got = _item(app, "attempt-2")
    assert got is not None
    assert got.value == 2


@both
def test_a_tool_writes_with_its_result(app: cairn.App, kind: Kind) -> None:
    def send(op: cairn.Operation, to: str) -> str:
        op.memory.put(NS, "last-sent", {"to": to, "op": op.operation_id})
        return f"sent to {to}"

    tool = app.tool(effect="idempotent")(kind.fn(send))

    @kind.workflow(app, "sender")
    def flow(ctx: cairn.Context) -> Flow[str]:
        return (yield tool("bob"))

    run = app.start(flow, run_id="t1")
    assert app.resume(run.run_id) == "sent to bob"
    item = _item(app, "last-sent")
    assert item is not None
    assert item.value == {"to": "bob", "op": item.operation_id}
    assert item.run_id == "t1"


@both
def test_workflow_reads_are_journaled_and_writes_are_entries(app: cairn.App, kind: Kind) -> None:
    app.operator.memory("default").put(NS, "mode", "A")

    @kind.workflow(app, "reader")
    def reader(ctx: cairn.Context) -> Flow[str]:
        first = ctx.memory.get(NS, "mode")
        ctx.memory.put(NS, "seen", first.value if first else None)
        ctx.memory.run.put("k", "v")
        ctx.memory.thread().append("one", "two")
        window = ctx.memory.thread().window(last=1)
        ctx.sleep(0.5)  # never due at once, however slow the commits before it
        second = ctx.memory.get(NS, "mode")
        yield None
        return f"{first.value if first else '-'}/{second.value if second else '-'}/{window[0].value}"

    app.start(reader, run_id="r1", thread_id="th1")
    assert execute_once(app, "r1") == "suspended"
    app.operator.memory("default").put(NS, "mode", "B")  # changed between the executions
    time.sleep(0.55)
    assert app.resume("r1") == "A/B/two"  # the first read replayed as it was
    seen = _item(app, "seen")
    assert seen is not None
    assert (seen.value, seen.version, seen.run_id) == ("A", 1, "r1")  # written once
    assert _memory_entries(app, "r1") == ["get", "put", "run.put", "thread.append", "thread.window", "get"]
    assert [m.value for m in app.operator.thread_messages("default", "th1")] == ["one", "two"]


def test_a_later_run_of_the_thread_reads_what_an_earlier_wrote(app: cairn.App) -> None:
    @app.workflow(name="chat")
    def chat(ctx: cairn.Context, text: str) -> list[Any]:
        thread = ctx.memory.thread()
        thread.append(text)
        return [m.value for m in thread.window()]

    assert app.run(chat, "hi", thread_id="c1") == ["hi"]
    assert app.run(chat, "again", thread_id="c1") == ["hi", "again"]
    assert app.run(chat, "other", thread_id="c2") == ["other"]


def test_compaction_replaces_a_prefix_by_a_summary(app: cairn.App) -> None:
    @app.step()
    def summarize(texts: list[str]) -> str:
        return "summary: " + " ".join(texts)

    @app.workflow(name="compact")
    def compact(ctx: cairn.Context) -> list[tuple[int, str, Any]]:
        thread = ctx.memory.thread("long")
        thread.append(*[f"m{i}" for i in range(5)])
        assert thread.compact_with(2, lambda older: summarize([m.value for m in older]))
        return [(m.index, m.kind, m.value) for m in thread.window()]

    expected = [(2, "summary", "summary: m0 m1 m2"), (3, "message", "m3"), (4, "message", "m4")]
    assert app.run(compact) == expected


def test_retention_policy_sets_the_ttl(tmp_path: Any) -> None:
    policy = cairn.MemoryPolicy(namespaces={("sessions",): cairn.Retention(ttl=60.0)})
    app = cairn.App(db=f"sqlite:///{tmp_path}/p.db", memory=policy)
    try:
        app.operator.memory("default").put(("sessions", "s1"), "k", 1)
        app.operator.memory("default").put(("users",), "k", 1)
        [session] = app.operator.memory_items("default", ("sessions",))
        [user] = app.operator.memory_items("default", ("users",))
        assert session.expires_at is not None
        assert session.expires_at - session.updated_at == pytest.approx(60.0)
        assert user.expires_at is None
        assert session.actor == app.operator.actor
        app.operator.memory("default").thread("t1", ttl=30.0).append("x")
        [thread] = app.operator.memory_threads("default")
        assert thread["expires_at"] - thread["updated_at"] == pytest.approx(30.0)
        with pytest.raises(cairn.InvalidArgument, match="TTL"):
            app.operator.memory("default").thread("t1", ttl=0)
    finally:
        app.close()


@pytest.mark.parametrize("bad", [("a\x1fb",), ("",), ("a\x00",), "users"])
def test_bad_namespaces_are_refused_naming_the_label(app: cairn.App, bad: Any) -> None:
    with pytest.raises(cairn.InvalidArgument):
        app.operator.memory("default").put(bad, "k", 1)
    assert app.operator.memory_items(None) == []


@both
def test_a_tool_body_that_raised_writes_nothing_even_when_reconciled_done(app: cairn.App, kind: Kind) -> None:
    """The effect may have happened (reconcile says so), but the body did not
    finish: its buffered writes are not the recorded outcome's."""
    def charge(op: cairn.Operation, cents: int) -> int:
        op.memory.put(NS, "charged", cents)
        raise ConnectionError("the reply was lost")

    def reconcile(op: cairn.Operation) -> cairn.Done[int]:
        return cairn.Done(op.arguments["cents"])

    tool = app.tool(effect="write", reconcile=kind.fn(reconcile))(kind.fn(charge))

    @kind.workflow(app, "charger")
    def flow(ctx: cairn.Context) -> Flow[int]:
        return (yield tool(1250))

    assert app.run(flow) == 1250
    assert _item(app, "charged") is None


def test_prune_sweeps_expired_memory(app: cairn.App) -> None:
    """The sweep is part of pruning: expired rows (invisible already) are deleted by it."""
    memory = app.operator.memory("default")
    memory.put(NS, "short", 1, ttl=0.05)
    memory.put(NS, "long", 2)
    memory.thread("th").append("kept")
    deadline = time.time() + 0.06
    while time.time() < deadline:  # until the TTL has certainly passed (not a timing assert)
        time.sleep(0.01)
    assert [i.key for i in app.operator.memory_items("default")] == ["long"]  # invisible at once
    app.prune(3600)
    assert app.store.sweep_memory() == 0  # nothing expired left for a second sweep
    assert [i.key for i in app.operator.memory_items("default")] == ["long"]
    assert [m.value for m in app.operator.thread_messages("default", "th")] == ["kept"]
