"""The write tool's short path (``engine.tools``, ``engine.journal``) gives
what the general rules it skips would have given.

Each shortcut of the per-call path is pinned here against the rule it
replaces: the arguments zipped with the parameter names against
``Signature.bind``, the operation id from the run's hashed prefix against
``uuid5``, the ``Operation`` built slot by slot against the dataclass, the
journal's filing of intents and tool results against what a replay of the
same history reports, and the recorded intent against a mutation of the
arguments by the tool itself.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
import uuid
from typing import Any

import pytest

import cairn
from cairn.codec import values
from cairn.engine import tools
from cairn.engine.execution import operation_id
from cairn.engine.journal import Journal
from cairn.store.records import EventType, HistoryEvent, Payload

NAMESPACE = uuid.UUID("6f1d3c2e-8a4b-4c7d-9e0f-0c41a1b2c3d4")


def _reference_id(run_id: str, position: int, generation: int = 0) -> str:
    key = f"{run_id}\x00{position}" if not generation else f"{run_id}\x00{position}\x00{generation}"
    return str(uuid.uuid5(NAMESPACE, key))


@pytest.mark.parametrize("run_id", ["r", "run-ä-\x00-x", "0" * 200])
@pytest.mark.parametrize(("position", "generation"), [(0, 0), (7, 0), (12345, 0), (3, 1), (3, 12)])
def test_operation_id_is_the_documented_uuid5(run_id: str, position: int, generation: int) -> None:
    assert operation_id(run_id, position, generation) == _reference_id(run_id, position, generation)


def _positional(a: int, b: str) -> None: ...
def _defaults(a: int, b: str = "x", c: int = 3) -> None: ...
def _keyword_only(a: int, *, b: str) -> None: ...
def _variadic(a: int, *rest: int, **more: Any) -> None: ...
def _positional_only(a: int, /, b: int) -> None: ...
def _none() -> None: ...


CALLS: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = [
    (_positional, (1, "s"), {}),
    (_positional, (1,), {"b": "s"}),
    (_positional, (), {"b": "s", "a": 1}),
    (_positional, (1,), {}),  # missing: TypeError
    (_positional, (1, "s", 3), {}),  # too many: TypeError
    (_defaults, (1,), {}),
    (_defaults, (1, "y"), {}),
    (_defaults, (1, "y", 4), {}),
    (_defaults, (1,), {"c": 9}),
    (_keyword_only, (1,), {"b": "s"}),
    (_keyword_only, (1, "s"), {}),  # TypeError
    (_variadic, (1, 2, 3), {"k": 1}),
    (_variadic, (1,), {}),
    (_positional_only, (1, 2), {}),
    (_positional_only, (1,), {"b": 2}),
    (_none, (), {}),
    (_none, (1,), {}),  # TypeError
]


@pytest.mark.parametrize(("fn", "args", "kwargs"), CALLS)
def test_arguments_bind_as_the_signature_binds_them(
    fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    definition = tools.ToolDef.build(fn, name=None, effect="write", reconcile=None, timeout=None,
                                     schema=None, retry=None, reconcile_retry=None)
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
        expected: dict[str, Any] | type[TypeError] = dict(bound.arguments)
    except TypeError:
        expected = TypeError
    if expected is TypeError:
        with pytest.raises(TypeError):
            tools.bind(definition, args, kwargs)
    else:
        got = tools.bind(definition, args, kwargs)
        assert got == expected
        assert list(got) == list(expected)  # the same order, too


def test_the_engines_operation_is_the_frozen_dataclass() -> None:
    fields = ("id-1", "pay", cairn.Effect.WRITE, "run", "acme", "t-1", 4, 2, {"to": "ada"})
    built = tools._operation_of(*fields)
    assert built == cairn.Operation(*fields)
    assert [getattr(built, f.name) for f in dataclasses.fields(cairn.Operation)] == list(fields)
    assert hash(dataclasses.astuple(built)[:8]) == hash(dataclasses.astuple(cairn.Operation(*fields))[:8])
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.operation_id = "other"  # type: ignore[misc]


def _event(seq: int, kind: EventType, position: int | None, step_kind: str | None = "tool") -> HistoryEvent:
    return HistoryEvent("r", seq, kind, float(seq), 1, "w", position, step_kind, "pay", None, 1, None,
                        Payload(data=b"{}"), {"operation_id": "x"})


def test_the_journal_files_intents_and_tool_results_as_replay_reads_them() -> None:
    history = [
        _event(1, EventType.OP_INTENT, 0),
        _event(2, EventType.STEP_COMPLETED, 0),
        _event(3, EventType.OP_INTENT, 1),  # uncertain: no result
        _event(4, EventType.STEP_COMPLETED, 2, "step"),
        _event(5, EventType.OP_INTENT, 5),
    ]
    journal = Journal(history)
    assert journal.intents == {0: history[0], 1: history[2], 5: history[4]}
    assert journal.op_state == {0: history[0], 1: history[2], 5: history[4]}
    assert journal.outcomes == {0: history[1], 2: history[3]}
    assert journal.end == 6
    assert journal.usage.tool_calls == 1  # a tool result counts; an intent and a step do not
    assert journal.uncertain(0) is None
    assert journal.uncertain(1) is history[2]
    # a cut forgets them as it forgets everything filed
    journal.record(HistoryEvent("r", 6, EventType.RUN_RETRIED, 6.0, 1, detail={"from_position": 1}))
    assert journal.intents == {0: history[0]}
    assert journal.end == 1


def test_a_tool_that_mutates_its_arguments_does_not_change_its_recorded_intent(app: cairn.App) -> None:
    seen: list[dict[str, Any]] = []

    @app.tool(effect="write")
    def ship(op: cairn.Operation, items: list[str], to: dict[str, str]) -> int:
        items.append("smuggled")
        to["city"] = "elsewhere"
        seen.append(op.arguments)
        return len(items)

    @app.workflow(name="shipping")
    def shipping(ctx: cairn.Context) -> list[int]:
        items, to = ["a"], {"city": "here"}
        first = ship(items, to)
        second = ship(items, to)  # the mutated values: a new call with new arguments
        return [first, second]

    assert app.run(shipping, run_id="ship") == [2, 3]
    intents = [e for e in app.history("ship") if e.event is EventType.OP_INTENT]
    recorded = [values.decode(e.payload.data, Any) for e in intents if e.payload and e.payload.data]
    assert recorded == [{"items": ["a"], "to": {"city": "here"}},
                        {"items": ["a", "smuggled"], "to": {"city": "elsewhere"}}]
    # what the tool saw as its operation's arguments is what the intent recorded, not its own mutation
    assert seen == recorded
    assert [e.detail["operation_id"] for e in intents if e.detail] == [
        _reference_id("ship", 0), _reference_id("ship", 1)]



def _journal_of(app: cairn.App, run_id: str) -> list[tuple[Any, ...]]:
    """What a run recorded, without the times and the worker."""
    return [(e.event, e.position, e.step_kind, e.name, e.input_hash, e.attempt,
             e.payload.data if e.payload else None, e.detail)
            for e in app.history(run_id) if e.position is not None]


def test_both_read_tool_paths_record_the_same_journal(
    app: cairn.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read tool asking for nothing a step lacks is journaled by the step's
    protocol (``ToolDef.as_step``); the general path must have left the very
    same entries, a failed attempt and its retry included, and a replay runs
    no body again."""
    attempts: list[str] = []
    flaky: set[str] = set()  # keys whose next call fails once

    @app.tool(effect="read", retry=cairn.RetryPolicy(max_attempts=2, initial_delay=0.0))
    def lookup(key: str, qty: int = 1) -> dict[str, Any]:
        attempts.append(key)
        if key in flaky:
            flaky.discard(key)
            raise ConnectionError("flaky")
        return {"key": key, "qty": qty}

    assert lookup.definition.as_step  # type: ignore[attr-defined]

    @app.workflow(name="lookups")
    def lookups(ctx: cairn.Context) -> list[dict[str, Any]]:
        return [lookup("a"), lookup("b", qty=3)]

    expected = [{"key": "a", "qty": 1}, {"key": "b", "qty": 3}]
    flaky.add("b")
    assert app.run(lookups, run_id="as-step") == expected
    monkeypatch.setattr(lookup, "_as_step", False)
    flaky.add("b")
    assert app.run(lookups, run_id="general") == expected
    fast, slow = _journal_of(app, "as-step"), _journal_of(app, "general")
    assert [(event, position, kind, attempt) for event, position, kind, _, _, attempt, _, _ in fast] == [
        (EventType.STEP_COMPLETED, 0, "tool", 1), (EventType.STEP_RETRIED, 1, "tool", 1),
        (EventType.STEP_COMPLETED, 1, "tool", 2)]
    # the retry entry's detail carries its own time: compare it without that
    for entries in (fast, slow):
        entries[1] = (*entries[1][:7], entries[1][7]["error"])
    assert fast == slow
    assert attempts == ["a", "b", "b"] * 2
    assert app.resume("as-step") == expected  # replayed: no body runs again
    assert attempts == ["a", "b", "b"] * 2


@pytest.mark.parametrize("general", [False, True], ids=["as-step", "general"])
def test_a_read_tool_counts_toward_the_tool_call_budget_on_either_path(
    app: cairn.App, monkeypatch: pytest.MonkeyPatch, general: bool
) -> None:
    calls: list[int] = []

    @app.tool(effect="read")
    def look(i: int) -> int:
        calls.append(i)
        return i

    if general:
        monkeypatch.setattr(look, "_as_step", False)

    @app.workflow(name="looks")
    def looks(ctx: cairn.Context) -> int:
        return look(1) + look(2) + look(3)

    with pytest.raises(cairn.RunSuspended):
        app.run(looks, run_id="budgeted", budget=cairn.Budget(tool_calls=2))
    assert calls == [1, 2]  # the third call was refused before its body


def test_a_read_tool_with_an_approval_is_not_journaled_as_a_step(app: cairn.App) -> None:
    """``as_step`` leaves out a tool that asks for an approval: the run must
    wait for the decision before the body runs, as for any protected tool."""
    from tests.approvals.conftest import one_pass

    calls: list[str] = []

    @app.tool(effect="read", approval=True)
    def reveal(record: str) -> str:
        calls.append(record)
        return f"contents of {record}"

    assert not reveal.definition.as_step  # type: ignore[attr-defined]

    @app.workflow(name="reveals")
    def reveals(ctx: cairn.Context) -> str:
        return reveal("patient-7")

    handle = app.start(reveals)
    assert one_pass(app, handle.run_id) == "suspended"
    assert calls == []
    (view,) = app.approvals(run_id=handle.run_id)
    app.approve(handle.run_id, view.request_id)
    assert one_pass(app, handle.run_id) == "completed"
    assert calls == ["patient-7"]


def test_a_read_tool_with_a_timeout_is_bounded(app: cairn.App) -> None:
    """``as_step`` leaves out a tool with a timeout: a body that overruns it
    is the call's failure (``ToolTimeout``), not a late result recorded."""

    @app.tool(effect="read", timeout=0.1)
    def slow() -> str:
        time.sleep(1.0)  # the execution waits for it to return before it ends (a straggler)
        return "late"

    assert not slow.definition.as_step  # type: ignore[attr-defined]

    @app.workflow(name="slows")
    def slows(ctx: cairn.Context) -> str:
        return slow()

    with pytest.raises(cairn.RunFailed, match="ToolTimeout"):
        app.run(slows, run_id="slow")
