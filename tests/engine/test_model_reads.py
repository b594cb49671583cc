"""A read of a few model calls reads what they need, not the journal before
them (issue 21: a page of a long run rebuilt its calls from seq 0).

Each model entry names the entries its rebuild needs (``ModelEntry.needs``);
``rebuild_some`` rebuilds a window of calls from the window and those
entries alone, read by seq from the store (``Store.history_at``, both
backends). Checked against the rebuild from the whole history over random
windows of a run that grows, trims, restarts and repeats its context, is
rewound and resumed by a new execution; and the number of entries needed
by one call of a sliding-window agent stays put however deep in the run.
"""

from __future__ import annotations

import random

import pytest

import cairn
from cairn.codec import values
from cairn.engine import modelcalls
from cairn.errors import PayloadError
from cairn.models import Message, ModelRequest, ToolCall
from cairn.store.records import EventType, HistoryEvent
from tests.engine.kinds import Kind
from tests.timing import NAP, napped

SYSTEM = Message(role="system", content="You are terse. " * 10)


def model_entries(history: list[HistoryEvent]) -> list[HistoryEvent]:
    return [e for e in history if modelcalls.is_model_call(e)]


def rebuilt_from_needs(app: cairn.App, run_id: str, window: list[HistoryEvent]) -> dict[int, object]:
    needed = modelcalls.needs(window, app.runtime.payloads)
    assert needed is not None, "an entry written now names what it needs"
    have = {e.seq for e in window}
    fetched = app.store.history_at(run_id, needed - have)
    assert {e.seq for e in fetched} == needed - have  # the store returns exactly the seqs asked
    return dict(modelcalls.rebuild_some(window, fetched, app.runtime.payloads))


def test_packed_needs_round_trip() -> None:
    rng = random.Random(7)
    for _ in range(200):
        seqs = sorted(rng.sample(range(1, 400), rng.randrange(0, 40)))
        assert modelcalls.unpacked(modelcalls._packed(seqs), 400) == seqs
    assert modelcalls._packed(list(range(4, 400, 4))) == (4, 99)  # a chat's stride packs flat
    for damaged in ((4,), (0, 3), (4, -1), (1, 10**12)):  # never a loop past the needing entry
        with pytest.raises(PayloadError, match="malformed"):
            modelcalls.unpacked(damaged, 400)


def test_any_window_of_calls_rebuilds_as_the_whole_history_does(app: cairn.App) -> None:
    rewound = {"done": False}

    def policy(request: ModelRequest, n: int) -> Message:
        call = ToolCall(id=f"call_{n}", name="note", arguments=f'{{"n": {n}}}')
        return Message(role="assistant", content=f"answer {n} " * 8, tool_calls=(call,) if n % 3 else ())

    model = Kind("sync").scripted(policy, model_id="m")
    tools = ({"type": "function", "function": {"name": "note", "parameters": {"type": "object"}}},)

    @app.step
    def note(n: int) -> str:
        return f"noted {n}"

    @app.workflow(name="mixed")
    def mixed(ctx: cairn.Context) -> int:
        messages = [SYSTEM]
        for turn in range(14):
            messages.append(Message(role="user", content=f"turn {turn} " * 20))
            reply = ctx.model(model, messages, tools=tools if turn % 2 else ())
            messages.append(reply.message)
            messages.append(Message(role="tool", content=note(turn), name="note"))
            if turn == 5:
                ctx.sleep(NAP)  # the next calls are written by a new execution, its log read back
            if turn == 8 and not rewound["done"]:
                rewound["done"] = True
                raise cairn.LogicalFailure("again", rewind_to="m")
        ctx.model(model, messages[:4])  # a trimmed context
        ctx.model(model, [SYSTEM, Message(role="user", content="start over")])  # a fresh one
        ctx.model(model, messages[:4])  # sent before: nothing new
        alpha, beta = Message(role="user", content="alpha " * 20), Message(role="user", content="beta " * 20)
        ctx.model(model, [SYSTEM, alpha])
        ctx.model(model, [SYSTEM, beta])
        ctx.model(model, [SYSTEM, beta, alpha])  # a list of messages it does not carry: a link only
        ctx.model(model, [SYSTEM, beta, alpha, Message(role="user", content="gamma")])  # built on that link
        window = messages[:1] + messages[-5:]
        for turn in range(6):  # a sliding window over a growing conversation
            window = window[:1] + window[-5:] + [Message(role="user", content=f"slide {turn} " * 20)]
            window.append(ctx.model(model, window).message)
        return len(messages)

    app.run(mixed, run_id="mixed")
    history = app.history("mixed")
    assert any(e.event is EventType.RUN_REWOUND for e in history)
    before, after = napped(history)  # turns 0 to 5 first; a new execution wrote the rest
    assert [e.step_kind for e in before].count("model") == 6
    assert after[0].step_kind == "model"
    full = modelcalls.records(history, app.runtime.payloads)
    calls = model_entries(history)
    assert len(calls) > 20
    for call in calls:  # one call alone, then random windows of the journal
        assert rebuilt_from_needs(app, "mixed", [call]) == {call.seq: full[call.seq]}
    rng = random.Random(21)
    for _ in range(40):
        a = rng.randrange(len(history))
        b = rng.randrange(a, min(len(history), a + 30)) + 1
        window = history[a:b]
        expected = {e.seq: full[e.seq] for e in model_entries(window)}
        assert rebuilt_from_needs(app, "mixed", window) == expected
        for seq, record in expected.items():  # exactly what was sent: the entry's own input hash
            entry = next(e for e in window if e.seq == seq)
            assert entry.input_hash == values.digest(values.encode(record.request))


@pytest.mark.parametrize("app", ["sqlite"], indirect=True)  # counts entries only: one backend is enough
def test_a_sliding_window_agent_needs_the_same_few_entries_at_any_depth(app: cairn.App) -> None:
    model = Kind("sync").scripted(lambda request, n: Message(role="assistant", content=f"answer {n} " * 8),
                                  model_id="m")

    @app.workflow(name="sliding")
    def sliding(ctx: cairn.Context, turns: int) -> int:
        recent: list[Message] = []
        for turn in range(turns):
            recent = [*recent[-4:], Message(role="user", content=f"question {turn} " * 20)]
            recent.append(ctx.model(model, [SYSTEM, *recent]).message)
        return turns

    app.run(sliding, 120, run_id="sliding")
    history = app.history("sliding")
    calls = model_entries(history)
    counts = []
    for call in calls:
        needed = modelcalls.needs([call], app.runtime.payloads)
        assert needed is not None
        counts.append(len(needed))
    # the system prompt's carrier and the window's: never the calls before them
    assert max(counts) <= 5, counts
    assert counts[-1] == counts[60]
    deep = calls[100]
    full = modelcalls.records(history, app.runtime.payloads)
    assert rebuilt_from_needs(app, "sliding", [deep]) == {deep.seq: full[deep.seq]}
