"""Context management (``ctx.model(..., context=policy)``): a long agent fits
its model's window, every compaction is a journal entry, each summary is
made once, and crashes during or right after a summarizing call neither
repeat a recorded summary nor lose one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

import cairn
from cairn.cli.main import main
from cairn.engine import modelcalls
from cairn.engine.contextwindow import Compaction
from cairn.models import ContextPolicy, Message, ModelRequest, ScriptedModel, ToolCall
from cairn.store.records import EventType, HistoryEvent
from tests.backends import StoreBackend
from tests.engine import context_app
from tests.engine.context_app import WINDOW, WindowModel, true_tokens
from tests.processes import run as run_child


def compactions(history: list[HistoryEvent]) -> list[HistoryEvent]:
    return [e for e in history if e.step_kind == "context" and e.event is EventType.STEP_COMPLETED]


def records_of(app: cairn.App, events: list[HistoryEvent]) -> list[Compaction]:
    return [app.runtime.payloads.load(e.payload, Compaction, what="a compaction")  # type: ignore[arg-type]
            for e in events]


def requests(app: cairn.App, run_id: str) -> list[ModelRequest]:
    return [r.request for r in modelcalls.records(app.history(run_id), app.runtime.payloads).values()]


def test_a_300_turn_agent_completes_within_a_16k_window(app: cairn.App) -> None:
    model = WindowModel(300)
    agent = context_app.register(app, model)
    assert app.run(agent, run_id="long") == 2 + 2 * 300 + 1
    sent = requests(app, "long")
    turns = [r for r in sent if r.messages[0] == context_app.SYSTEM]
    assert len(turns) == 301
    assert max(true_tokens(r.messages) for r in sent) <= WINDOW
    history = app.history("long")
    done = compactions(history)
    records = records_of(app, done)
    # each summary made once: one summarizing request per compaction that summarized
    assert model.summaries == sum(1 for r in records if "summarize" in r.strategy) >= 3
    assert len(sent) == 301 + model.summaries
    # consecutive ranges, each summary built on the last
    assert [r.first for r in records[1:]] == [r.upto for r in records[:-1]]
    assert all(r.tokens_after < r.threshold // 2 < r.tokens_before for r in records)
    assert {r.counted_by for r in records} == {"provider"}
    # the system prompt and the task are sent on every turn, the summary right after them
    assert all(r.messages[1] == context_app.TASK for r in turns)
    assert turns[-1].messages[2].text.startswith("Summary of the earlier conversation")


def test_without_a_policy_the_same_agent_overflows_the_window(app: cairn.App) -> None:
    """What the policy prevents: the provider refuses the growing request."""
    model = WindowModel(300)
    agent = context_app.register(app, model)
    context_app.POLICY_OFF = True
    try:
        with pytest.raises(cairn.RunFailed, match="context_length_exceeded"):
            app.run(agent, run_id="unmanaged")
    finally:
        context_app.POLICY_OFF = False


def test_a_replay_reuses_the_recorded_summaries(app: cairn.App) -> None:
    model = WindowModel(120)
    flow = context_app.register(app, model, sleep_every=50)
    app.run(flow, run_id="replayed")  # suspends twice: the rest runs on replays of the journal
    assert any(e.event is EventType.RUN_SUSPENDED for e in app.history("replayed"))
    assert model.summaries == len(compactions(app.history("replayed"))) >= 1
    assert model.asked == len(requests(app, "replayed"))


def test_cairn_show_marks_each_compaction(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/shown.db"
    with cairn.App(db=db) as app:
        app.run(context_app.register(app, WindowModel(100)), run_id="shown")
    out = CliRunner().invoke(main, ["show", "shown", "--db", db], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "compacted: summarized messages 0-" in out.output


def test_the_conversation_and_its_summaries_are_kept_in_thread_memory(app: cairn.App) -> None:
    """``thread=True``: every message is appended to the run's thread once;
    each summary replaces what it covers through the thread's compaction,
    with the range it covers (the thread ends up as the last summary and the
    messages after it)."""
    from dataclasses import replace

    model = WindowModel(150)
    agent = context_app.register(app, model, policy=replace(context_app.POLICY, thread=True))
    app.run(agent, run_id="threaded", thread_id="conversation-1")
    records = records_of(app, compactions(app.history("threaded")))
    last = records[-1]
    thread = app.operator.thread_messages("default", "conversation-1", limit=10_000)
    summary, *rest = thread
    assert summary.kind == "summary"
    assert summary.index == last.upto - 1
    assert summary.value == {"summary": last.summary, "covers": [last.first, last.upto], "policy": "context"}
    assert all(m.kind == "message" for m in rest)
    assert [m.index for m in rest] == list(range(last.upto, last.upto + len(rest)))
    sent = requests(app, "threaded")[-1]  # the last request holds every message the thread mirrored
    assert rest[-1].value == msgspec.to_builtins(sent.messages[-1])
    assert len(thread) == 1 + (2 + 2 * 150) - last.upto  # each mirrored message once, the answer not yet


def test_a_thread_policy_needs_a_thread(app: cairn.App) -> None:
    from dataclasses import replace

    agent = context_app.register(app, WindowModel(3), policy=replace(context_app.POLICY, thread=True))
    with pytest.raises(cairn.RunFailed, match=r"in the run's thread, and run 'lonely' has none"):
        app.run(agent, run_id="lonely")


# -- what is kept -------------------------------------------------------------------------


def tool_turn(i: int, size: int = 4000) -> list[Message]:
    call = ToolCall(id=f"c{i}", name="read", arguments="{}")
    return [Message(role="assistant", tool_calls=(call,)),
            Message(role="tool", tool_call_id=f"c{i}", content=f"out {i} " + "x" * size)]


def echo(request: ModelRequest, n: int) -> Message:
    if request.messages[0].content == context_app.SUMMARY_PROMPT:
        return Message(role="assistant", content="short summary")
    return Message(role="assistant", content=f"ok {n}")


def test_pinned_messages_survive_and_no_tool_result_is_separated_from_its_call(app: cairn.App) -> None:
    model = ScriptedModel(echo, model_id="small")
    pinned = Message(role="user", content="PINNED: the budget is 12 euros")
    policy = ContextPolicy(window=4000, keep_last=3, keep_tool_outputs=None, pin=(1, 2))

    @app.workflow(name="pins")
    def pins(ctx: cairn.Context) -> int:
        history = [Message(role="system", content="sys"), Message(role="user", content="task"), pinned]
        for i in range(12):
            history += tool_turn(i, 1500)
            ctx.model(model, history, context=policy)
        return len(history)

    app.run(pins, run_id="pins")
    sent = [r for r in requests(app, "pins") if r.messages[0].content == "sys"]
    for request in sent:
        assert request.messages[1:3] == (Message(role="user", content="task"), pinned)
        roles = [m.role for m in request.messages]
        for i, role in enumerate(roles):
            if role == "tool":  # its call is right before it (the summary never sits between)
                assert request.messages[i - 1].tool_calls[0].id == request.messages[i].tool_call_id
    assert any(m.text.startswith("Summary of") for m in sent[-1].messages)


def test_old_tool_outputs_are_trimmed_before_anything_is_summarized(app: cairn.App) -> None:
    model = ScriptedModel(echo, model_id="small")
    policy = ContextPolicy(window=8000, keep_last=4, keep_tool_outputs=2)

    @app.workflow(name="trims")
    def trims(ctx: cairn.Context) -> None:
        history = [Message(role="system", content="sys")]
        for i in range(6):
            history += tool_turn(i, 3000)
            ctx.model(model, history, context=policy)

    app.run(trims, run_id="trims")
    [entry] = compactions(app.history("trims"))
    [record] = records_of(app, [entry])
    assert record.strategy == "trim"
    assert record.summary is None
    last = requests(app, "trims")[-1]
    outputs = [m.text for m in last.messages if m.role == "tool"]
    assert [o.startswith("out") for o in outputs] == [False] * 4 + [True] * 2
    assert outputs[0] == "[tool output removed to save context: 3006 characters]"
    assert model.calls == 6  # no summarizing call


def test_kept_messages_over_the_window_fail_with_one_clear_line_and_nothing_is_sent(app: cairn.App) -> None:
    model = ScriptedModel(echo, model_id="small")
    policy = ContextPolicy(window=1000, keep_last=2)

    @app.workflow(name="huge")
    def huge(ctx: cairn.Context) -> None:
        ctx.model(model, [Message(role="system", content="s"), Message(role="user", content="y" * 9000)],
                  context=policy)

    with pytest.raises(cairn.RunFailed, match=r"cannot fit the request to 'small' into its 1000-token"):
        app.run(huge, run_id="huge")
    assert model.calls == 0


def test_a_history_rewritten_under_a_summary_is_refused(app: cairn.App) -> None:
    model = ScriptedModel(echo, model_id="small")
    policy = ContextPolicy(window=2000, keep_last=2, keep_tool_outputs=None)

    @app.workflow(name="rewrite")
    def rewrite(ctx: cairn.Context) -> None:
        history = [Message(role="user", content="start")]
        for i in range(8):
            history += tool_turn(i, 800)
            ctx.model(model, history, context=policy)
        ctx.model(model, history[5:], context=policy)  # the caller dropped messages itself

    with pytest.raises(cairn.RunFailed, match=r"the conversation given to ctx\.model changed"):
        app.run(rewrite, run_id="rewrite")


def test_tiktoken_is_used_only_when_asked_and_its_absence_is_one_clear_line() -> None:
    """Counts decide when a run compacts: a tokenizer that happens to be
    installed on one worker and not on another would make replays diverge,
    so the default is the approximation and tiktoken is asked for by name."""
    from cairn.errors import MissingExtra
    from cairn.models.window import TokenCounter, tiktoken_counter

    assert TokenCounter().name == "approx"
    assert ContextPolicy().tokens is None
    try:
        import tiktoken  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        with pytest.raises(MissingExtra, match=r"tiktoken token counts needs the 'tokens' extra"):
            tiktoken_counter()
    else:  # pragma: no cover - the dev environment has no tiktoken
        assert tiktoken_counter().name == "tiktoken:o200k_base"


def test_counts_come_from_the_provider_when_it_reported_the_last_call() -> None:
    from cairn.models import Usage
    from cairn.models.window import Sent, TokenCounter, count_request

    tokens = TokenCounter()
    first = (Message(role="user", content="x" * 3000),)
    answer = Message(role="assistant", content="ok")
    approx = count_request(tokens, (*first, answer), (), None)
    assert approx.source == "approx"
    told = count_request(tokens, (*first, answer, Message(role="user", content="y")), (),
                         Sent(first, answer, Usage(10, 2, 12)))
    assert told.source == "provider"
    assert told.tokens == 10 + tokens.message(answer) + tokens.message(Message(role="user", content="y"))
    # a request that does not extend the last one is counted, not guessed from it
    last = Sent(first, answer, Usage(10, 2, 12))
    other = count_request(tokens, (Message(role="user", content="z"),), (), last)
    assert other.source == "approx"


def test_an_unknown_model_needs_a_window(app: cairn.App) -> None:
    model = ScriptedModel(echo, model_id="homegrown-7b")

    @app.workflow(name="unknown")
    def unknown(ctx: cairn.Context) -> None:
        ctx.model(model, [Message(role="user", content="hi")], context=ContextPolicy())

    with pytest.raises(cairn.RunFailed, match=r"no known context window for model 'homegrown-7b'"):
        app.run(unknown, run_id="unknown")


# -- crashes during and right after the summarizing call -------------------------------------


@pytest.fixture
def agent_world(backend: StoreBackend, tmp_path: Path) -> dict[str, str]:
    """The store (SQLite or PostgreSQL) and the log of every request the model got."""
    return {"CAIRN_TEST_DB": backend.url, "CAIRN_TEST_ASKS": str(tmp_path / "asks")}


def asks(world: dict[str, str]) -> list[dict[str, Any]]:
    return [msgspec.json.decode(line) for line in Path(world["CAIRN_TEST_ASKS"]).read_bytes().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("when", ["during", "after"])
def test_a_sigkill_during_or_right_after_a_summary_makes_each_summary_once(
    agent_world: dict[str, str], when: str
) -> None:
    """The child dies while the 2nd summarizing call is answered (nothing of
    it recorded: it is asked again) or right after its answer is recorded
    (before the compaction entry: the recorded summary is used, never asked
    again). Resumed here, the run completes with one summary per range."""
    env = dict(agent_world)
    env.update({"CAIRN_TEST_DIE_IN_SUMMARY": "2"} if when == "during" else
               {"CAIRN_FAULTS": "context.after_summary@2"})
    child = run_child("tests.engine.context_app", ["crashy", "200"], env=env, timeout=120)
    assert child.returncode == -9, child.stderr[-2000:]
    before = asks(agent_world)
    assert sum(1 for a in before if a["kind"] == "summary") == 2
    app = cairn.App(db=agent_world["CAIRN_TEST_DB"], lease_seconds=0.5)
    try:
        model = WindowModel(200, agent_world["CAIRN_TEST_ASKS"])
        context_app.register(app, model)
        assert app.resume("crashy") == 2 + 2 * 200 + 1
        history = app.history("crashy")
        done = compactions(history)
        summary_calls = [a for a in asks(agent_world) if a["kind"] == "summary"]
        # during: the interrupted call had no answer to record, so it was asked again; after: never
        assert len(summary_calls) == len(done) + (1 if when == "during" else 0)
        records = records_of(app, done)
        assert [r.first for r in records[1:]] == [r.upto for r in records[:-1]]  # no range summarized twice
        assert max(a["tokens"] for a in asks(agent_world)) <= WINDOW
    finally:
        app.close()


def test_async_workflows_compact_the_same_way(app: cairn.App) -> None:
    from tests.engine.kinds import AsyncScriptedModel

    model = AsyncScriptedModel(echo, model_id="small")
    policy = ContextPolicy(window=3000, keep_last=2, keep_tool_outputs=None)

    @app.workflow(name="asynchronous")
    async def asynchronous(ctx: cairn.Context) -> int:
        history = [Message(role="system", content="sys")]
        for i in range(10):
            history += tool_turn(i, 1200)
            await ctx.model_async(model, history, context=policy)
        return len(history)

    assert app.run(asynchronous, run_id="async") == 21
    records = records_of(app, compactions(app.history("async")))
    assert records
    assert any("summarize" in r.strategy for r in records)
    assert max(true_tokens(r.messages) for r in requests(app, "async")) <= 3000
