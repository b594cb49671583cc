"""Model calls journal each message once, and are rebuilt exactly on read.

The stored size of a chat loop must grow with its messages, not with the
square of its turns; the rebuilt request must be byte-for-byte what was sent
(the input hash of the entry proves it); a crash between calls must replay
the recorded decisions; and after a cut of the journal (rewind, operator
retry) no entry may depend on content only a voided entry carries.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from bench.model_journal import measure

import cairn
from cairn.codec import values
from cairn.engine import modelcalls
from cairn.models import Message, ModelRequest, ToolCall
from cairn.store.records import EventType, HistoryEvent
from tests.engine.kinds import Flow, Kind, both
from tests.timing import NAP, napped

ROOT = Path(__file__).resolve().parents[2]


def model_entries(history: list[HistoryEvent]) -> list[HistoryEvent]:
    return [e for e in history if e.step_kind == "model" and e.event is EventType.STEP_COMPLETED]


def stored_entry(app: cairn.App, event: HistoryEvent) -> modelcalls.ModelEntry:
    assert event.payload is not None
    entry = modelcalls.decode_entry(app.runtime.payloads.raw(event.payload, what="entry"), what="entry")
    assert isinstance(entry, modelcalls.ModelEntry)
    return entry


def live(history: list[HistoryEvent]) -> list[HistoryEvent]:
    """``history`` without the journal entries a cut (retry, rewind) voided:
    what is left if voided entries were ever dropped."""
    kept: list[HistoryEvent] = []
    for event in history:
        if event.event in (EventType.RUN_RETRIED, EventType.RUN_REWOUND):
            cut = (event.detail or {}).get("from_position")
            if cut is not None:
                kept = [e for e in kept if e.position is None or e.position < int(cut)]
        kept.append(event)
    return kept


@pytest.mark.parametrize("turns", [10, 80])
def test_a_chat_loop_stores_each_message_once(app: cairn.App, turns: int) -> None:
    m = measure(app, turns, size=1024)
    assert m.after <= 1.3 * m.messages, f"{m.after:,} bytes stored for {m.messages:,} bytes of messages"
    if turns == 80:  # what a full request per call stored: quadratic in the turns
        assert m.before > 20 * m.after


def conversation_policy(request: ModelRequest, n: int) -> Message:
    call = ToolCall(id=f"call_{n}", name="lookup", arguments=f'{{"order": {n}, "note": "é\\u2028"}}')
    return Message(role="assistant", content=None if n % 2 else f"thinking {n}", tool_calls=(call,))


TOOLS = ({"type": "function", "function": {"name": "lookup", "parameters": {"type": "object",
                                                                            "properties": {}}}},)


@both
def test_rebuilt_requests_are_exactly_what_was_sent(app: cairn.App, kind: Kind) -> None:
    sent: list[bytes] = []

    def policy(request: ModelRequest, n: int) -> Message:
        sent.append(values.encode(request))
        return conversation_policy(request, n)

    model = kind.scripted(policy)

    @kind.workflow(app, "agent")
    def agent(ctx: cairn.Context) -> Flow[int]:
        system = Message(role="system", content="be terse")
        messages = [system, Message(role="user", content="where is order 7?", name="ada")]
        for turn in range(4):
            reply = yield kind.model(ctx, model, messages, tools=TOOLS, temperature=0.2 * turn)
            messages.append(reply.message)
            call = reply.message.tool_calls[0]
            messages.append(Message(role="tool", content=f"result {turn}", tool_call_id=call.id,
                                    name=call.name))
            if turn == 1:
                ctx.sleep(NAP)  # suspends: the next calls are written by a new execution
        # a trimmed context keeps a prefix; a fresh one shares only the system message
        yield kind.model(ctx, model, messages[:3], seed=1)
        yield kind.model(ctx, model, [system, Message(role="user", content="start over")])
        yield kind.model(ctx, model, messages[:-2])  # sent before: nothing new to store
        return len(messages)

    app.run(agent, run_id="exact")
    history = app.history("exact")
    before, after = napped(history)
    assert [e.step_kind for e in before].count("model") == 2  # turns 0 and 1; the rest came after
    assert [e.step_kind for e in after].count("model") == 5
    rebuilt = modelcalls.records(history, app.runtime.payloads)
    entries = model_entries(history)
    assert [values.encode(rebuilt[e.seq].request) for e in entries] == sent
    for entry in entries:  # the journal's own fingerprint of the request matches the rebuilt one
        assert entry.input_hash == values.digest(values.encode(rebuilt[entry.seq].request))
        assert modelcalls.request_of(history, entry, app.runtime.payloads) == rebuilt[entry.seq].request
    assert stored_entry(app, entries[-1]).blobs == {}
    assert rebuilt[entries[0].seq].response.message == conversation_policy(ModelRequest(()), 0)


def test_no_entry_depends_on_content_a_rewind_voided(app: cairn.App) -> None:
    sent: list[bytes] = []
    rewound = {"done": False}

    def policy(request: ModelRequest, n: int) -> Message:
        sent.append(values.encode(request))
        return Message(role="assistant", content=f"answer {n}")

    model = Kind("sync").scripted(policy, model_id="m")

    @app.workflow(name="rewinding")
    def rewinding(ctx: cairn.Context) -> str:
        messages = [Message(role="user", content="first question " * 20)]
        messages.append(ctx.model(model, messages).message)
        # the second call carries this question; a rewind voids that entry
        messages.append(Message(role="user", content="second question " * 20))
        messages.append(ctx.model(model, messages).message)
        if not rewound["done"]:
            rewound["done"] = True
            raise cairn.LogicalFailure("try the second question again", rewind_to="m")
        messages.append(Message(role="user", content="third question"))
        return ctx.model(model, messages).message.content or ""

    assert app.run(rewinding, run_id="rw") == "answer 3"
    history = app.history("rw")
    assert any(e.event is EventType.RUN_REWOUND for e in history)
    # rebuilt from the live entries alone, every request is still exactly what was sent
    kept = live(history)
    rebuilt = modelcalls.records(kept, app.runtime.payloads)
    assert [values.encode(rebuilt[e.seq].request) for e in model_entries(kept)] == [sent[0], *sent[2:]]


@pytest.fixture
def chat_world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    env = {"CAIRN_TEST_DB": f"sqlite:///{tmp_path}/chat.db", "CAIRN_TEST_ASKS": str(tmp_path / "asks")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    sys.modules.pop("tests.engine.chat_app", None)
    yield env
    module = sys.modules.pop("tests.engine.chat_app", None)
    if module is not None:
        module.app.close()


@pytest.mark.slow
def test_a_crash_between_model_calls_replays_the_recorded_decisions(chat_world: dict[str, str]) -> None:
    env = {**os.environ, **chat_world, "CAIRN_FAULTS": "step.before_record@3"}
    child = subprocess.run([sys.executable, "-m", "tests.engine.chat_app", "crash", "6"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    from tests.engine import chat_app

    assert len(Path(chat_world["CAIRN_TEST_ASKS"]).read_bytes().splitlines()) == 3
    answers = chat_app.app.resume("crash")
    # three decisions were recorded before the crash and replayed; three were asked here
    assert [a.split("(")[1].split(" ask")[0] for a in answers] == [f"pid {child_pid(answers)}"] * 3 + [
        f"pid {os.getpid()}"] * 3
    asks = Path(chat_world["CAIRN_TEST_ASKS"]).read_bytes().splitlines()
    assert len(asks) == 6  # never asked twice for a recorded decision
    history = chat_app.app.history("crash")
    rebuilt = modelcalls.records(history, chat_app.app.runtime.payloads)
    assert [values.encode(rebuilt[e.seq].request) for e in model_entries(history)] == asks


def child_pid(answers: list[str]) -> str:
    return answers[0].split("pid ")[1].split(" ")[0]


def test_entries_in_the_previous_format_are_replayed_and_referenced(app: cairn.App) -> None:
    """Runs journaled before this format (a full ``ModelRecord`` per call)
    replay their recorded decisions, and new calls build on their content."""
    from cairn.engine.execution import Execution
    from cairn.models import ModelRecord, ModelResponse

    model = Kind("sync").scripted(lambda request, n: Message(role="assistant", content=f"new answer {n}"),
                                  model_id="m")
    question = Message(role="user", content="an old question " * 20)

    @app.workflow(name="upgraded")
    def upgraded(ctx: cairn.Context) -> list[str]:
        messages = [question]
        messages.append(ctx.model(model, messages).message)
        messages.append(Message(role="user", content="and now?"))
        messages.append(ctx.model(model, messages).message)
        return [m.content or "" for m in messages if m.role == "assistant"]

    app.start(upgraded, run_id="old")
    claim = app.store.claim_run("old", "old-worker", 5.0, 5)
    assert claim is not None
    old = Execution(app.runtime, claim, "old-worker")
    request = ModelRequest((question,))
    call = old.begin("model", "m", values.digest(values.encode(request)))
    response = ModelResponse(message=Message(role="assistant", content="the old answer " * 20), model="m")
    old.complete_call(call, ModelRecord(request, response, 1.0), ModelRecord)
    old.release()

    assert app.resume("old") == ["the old answer " * 20, "new answer 0"]
    assert model.calls == 1
    history = app.history("old")
    first, second = model_entries(history)
    rebuilt = modelcalls.records(history, app.runtime.payloads)
    assert rebuilt[first.seq].request == request
    assert rebuilt[second.seq].request.messages == (question, response.message,
                                                    Message(role="user", content="and now?"))
    new_question = values.encode(Message(role="user", content="and now?"))
    assert list(stored_entry(app, second).blobs) == [modelcalls.content_ref(new_question)]


def test_an_async_workflow_asks_a_client_without_acomplete_in_a_thread(app: cairn.App) -> None:
    import threading

    threads: list[str] = []

    def policy(request: ModelRequest, n: int) -> Message:
        threads.append(threading.current_thread().name)
        return Message(role="assistant", content=f"answer {n}")

    model = Kind("sync").scripted(policy)  # no acomplete

    @app.workflow(name="asks")
    async def asks(ctx: cairn.Context) -> str:
        reply = await ctx.model_async(model, [Message(role="user", content="hi")])
        ctx.sleep(NAP)  # the second pass replays the recorded answer
        return reply.message.content or ""

    assert app.run(asks, run_id="thread") == "answer 0"
    assert [e.step_kind for e in napped(app.history("thread"))[0]] == ["model", "sleep"]
    assert len(threads) == 1
    assert threads[0] != threading.current_thread().name  # the loop was never blocked by the client
