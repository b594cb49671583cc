"""The Anthropic Messages API adapter against a real (fake) HTTP server: the
wire format it sends, what it makes of the answers (tool use, cache usage,
blocks kept verbatim), how failures are classified (429/529 with
Retry-After, refusals, malformed answers), secrets, and journaling in
durable workflows."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import cairn
from cairn.cli.main import main
from cairn.models import (
    Message,
    ModelRequest,
    ModelRequestError,
    ModelResponse,
    ModelUnavailable,
    ToolCall,
    Usage,
)
from cairn.models.anthropic import API_VERSION, AnthropicChat
from cairn.retry import RetryPolicy
from cairn.store.records import EventType
from tests.models.fake_anthropic import error, message, text, tool_use
from tests.models.fake_openai import FakeOpenAI, Reply, json_reply
from tests.timing import NAP, napped

MakeClaude = Callable[..., AnthropicChat]
SECRET = "sk-ant-api03-LEAKME-5b2e9d"
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Current weather for a city",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


def ask(content: str = "hi", **params: Any) -> ModelRequest:
    return ModelRequest(messages=(Message(role="user", content=content),), params=params)


@pytest.fixture
def make_claude(server: FakeOpenAI) -> Iterator[MakeClaude]:
    made: list[AnthropicChat] = []

    def make(model: str = "claude-test", **options: Any) -> AnthropicChat:
        options.setdefault("base_url", server.url.removesuffix("/v1"))
        chat = AnthropicChat(model, **options)
        made.append(chat)
        return chat

    yield make
    for chat in made:
        chat.close()


@pytest.fixture
def app(tmp_path: Path) -> Iterator[cairn.App]:
    application = cairn.App(db=f"sqlite:///{tmp_path}/x.db")
    yield application
    application.close()


# -- what is sent -------------------------------------------------------------------------


def test_request_wire_format(server: FakeOpenAI, make_claude: MakeClaude) -> None:
    server.script(message())
    claude = make_claude(api_key=SECRET, beta=("context-management-2025-06-27",))
    call = ToolCall(id="toolu_1", name="get_weather", arguments='{"city": "Paris"}')
    claude.complete(ModelRequest(
        messages=(
            Message(role="system", content="You are terse."),
            Message(role="user", content="Weather in Paris and Rome?"),
            Message(role="assistant", content="Checking.", tool_calls=(call,)),
            Message(role="tool", content='{"temp": 21}', tool_call_id="toolu_1", name="get_weather"),
            Message(role="tool", content='{"temp": 25}', tool_call_id="toolu_2", name="get_weather"),
            Message(role="user", content="And?"),
        ),
        tools=(WEATHER, {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}),
        params={"temperature": 0.2, "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
    ))
    [received] = server.requests
    assert received.path == "/v1/messages"
    assert received.headers["x-api-key"] == SECRET
    assert "authorization" not in received.headers
    assert received.headers["anthropic-version"] == API_VERSION
    assert received.headers["anthropic-beta"] == "context-management-2025-06-27"
    assert received.body == {
        "model": "claude-test",
        "max_tokens": 4096,
        "system": [{"type": "text", "text": "You are terse."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Rome?"}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            ]},
            # both results and the next question in one user turn, right after the call
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": '{"temp": 21}'},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": '{"temp": 25}'},
                {"type": "text", "text": "And?"},
            ]},
        ],
        "tools": [
            {"name": "get_weather", "input_schema": WEATHER["function"]["parameters"],  # type: ignore[index]
             "description": "Current weather for a city"},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 2},
        ],
        "temperature": 0.2,
        "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
    }


def test_max_tokens_from_the_params_wins_and_no_key_sends_no_header(
    server: FakeOpenAI, make_claude: MakeClaude
) -> None:
    server.script(message())
    make_claude(max_tokens=100).complete(ask(max_tokens=7))
    [received] = server.requests
    assert received.body["max_tokens"] == 7
    assert "x-api-key" not in received.headers


def test_an_image_url_part_becomes_an_image_block(server: FakeOpenAI, make_claude: MakeClaude) -> None:
    server.script(message())
    parts = ({"type": "text", "text": "What is this?"},
             {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
             {"type": "image_url", "image_url": {"url": "https://example.org/cat.png"}})
    make_claude().complete(ModelRequest(messages=(Message(role="user", content=parts),)))
    assert server.requests[0].body["messages"][0]["content"] == [
        {"type": "text", "text": "What is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
        {"type": "image", "source": {"type": "url", "url": "https://example.org/cat.png"}},
    ]


@pytest.mark.parametrize(("messages", "why"), [
    ((Message(role="assistant", tool_calls=(ToolCall("t1", "f", "{not json"),)),), "are not JSON"),
    ((Message(role="assistant", tool_calls=(ToolCall("t1", "f", "[1]"),)),), "not a JSON object"),
    ((Message(role="tool", content="x"),), "no tool_call_id"),
    ((Message(role="critic", content="x"),), "role 'critic'"),
    ((Message(role="user", content=({"type": "image_url", "image_url": {"url": "data:image/png,raw"}},)),),
     "must be base64"),
])
def test_a_request_the_api_cannot_express_is_refused_before_sending(
    server: FakeOpenAI, make_claude: MakeClaude, messages: tuple[Message, ...], why: str
) -> None:
    with pytest.raises(ModelRequestError, match=why):
        make_claude().complete(ModelRequest(messages=messages))
    assert server.requests == []


def test_streaming_is_refused_before_anything_is_sent(server: FakeOpenAI, make_claude: MakeClaude) -> None:
    with pytest.raises(ModelRequestError, match="stream=True is not supported"):
        make_claude().complete(ask(stream=True))
    assert server.requests == []


# -- what is understood -------------------------------------------------------------------


def test_text_answer_usage_with_cache_tokens_and_cost(server: FakeOpenAI, make_claude: MakeClaude) -> None:
    usage = {"input_tokens": 100, "output_tokens": 20, "cache_creation_input_tokens": 1000,
             "cache_read_input_tokens": 4000}
    server.script(message(text("Hello "), text("there."), usage=usage, model="claude-fake-0613"))
    claude = make_claude(price_per_1k_input=3.0, price_per_1k_output=15.0, price_per_1k_cache_read=0.3,
                         price_per_1k_cache_write=3.75)
    response = claude.complete(ask())
    assert response.message == Message(role="assistant", content="Hello there.")
    assert response.model == "claude-fake-0613"
    assert response.finish_reason == "end_turn"
    assert response.usage == Usage(5100, 20, 5120, cache_read_tokens=4000, cache_write_tokens=1000)
    assert response.cost == pytest.approx((100 * 3.0 + 4000 * 0.3 + 1000 * 3.75 + 20 * 15.0) / 1000)
    assert response.provider is None


@pytest.mark.parametrize(("usage", "counted"), [
    ({"input_tokens": 7, "output_tokens": -3, "cache_read_input_tokens": True,
      "cache_creation_input_tokens": "9"}, Usage(7, 0, 7)),
    ("not an object", Usage()),
])
def test_a_malformed_usage_count_counts_zero(server: FakeOpenAI, make_claude: MakeClaude, usage: Any,
                                             counted: Usage) -> None:
    """A count that is negative, a bool or not an integer counts 0 (``transport.token_counts``):
    the answer still arrives and no budget sees a negative or ``True``."""
    server.script(message(text("ok"), usage=usage))
    assert make_claude().complete(ask()).usage == counted


def test_an_answer_naming_no_model_and_an_odd_stop_reason(server: FakeOpenAI,
                                                          make_claude: MakeClaude) -> None:
    """A gateway may name no model, or send a stop reason that is not a string: the
    response names the adapter's model, and no reason (``transport.HTTPModel._answer``)."""
    server.script(message(text("ok"), model="", stop_reason=7))  # type: ignore[arg-type]
    response = make_claude().complete(ask())
    assert (response.model, response.finish_reason) == ("claude-test", None)


def test_tool_use_answer_becomes_tool_calls(server: FakeOpenAI, make_claude: MakeClaude) -> None:
    server.script(message(text("Let me check."), tool_use("toolu_9", "get_weather", {"city": "Oslo"}),
                          stop_reason="tool_use"))
    response = make_claude().complete(ask())
    assert response.message == Message(
        role="assistant", content="Let me check.",
        tool_calls=(ToolCall(id="toolu_9", name="get_weather", arguments='{"city":"Oslo"}'),))
    assert response.finish_reason == "tool_use"
    assert response.message.tool_calls[0].parsed_arguments() == {"city": "Oslo"}


THINKING = {"type": "thinking", "thinking": "The user wants Oslo.", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA"}
COMPACTION = {"type": "compaction", "content": "Summary of the earlier conversation: <b>kept</b> as sent."}
EDITS = {"applied_edits": [{"type": "clear_tool_uses_20250919", "cleared_tool_uses": 3,
                            "cleared_input_tokens": 5000}]}


def test_thinking_compaction_and_context_edits_are_kept_verbatim_and_sent_back(
    app: cairn.App, server: FakeOpenAI, make_claude: MakeClaude
) -> None:
    """The blocks come back exactly in the next request (signatures and
    compaction items must), from the journal after a replay too."""
    first = [COMPACTION, THINKING, text("Checking."), tool_use("toolu_1", "get_weather", {"city": "Oslo"})]
    server.script(message(*first, stop_reason="tool_use", context_management=EDITS), message(text("Cold.")))
    claude = make_claude()

    @app.workflow(name="verbatim")
    def verbatim(ctx: cairn.Context) -> list[Any]:
        history = [Message(role="user", content="Weather in Oslo?")]
        answer = ctx.model(claude, history)
        ctx.sleep(NAP)  # suspends: the rest runs on a replay of the journal
        call = answer.message.tool_calls[0]
        history += [answer.message, Message(role="tool", content="-5 C", tool_call_id=call.id)]
        final = ctx.model(claude, history)
        return [answer.provider, answer.message.text, final.message.content]

    assert app.run(verbatim, run_id="v") == [{"context_management": EDITS}, "Checking.", "Cold."]
    assert len(server.requests) == 2
    before, after = napped(app.history("v"))
    assert [e.step_kind for e in before] == ["model", "sleep"]
    assert [e.step_kind for e in after] == ["model"]
    assert server.requests[1].body["messages"][1] == {"role": "assistant", "content": first}
    assert server.requests[1].body["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "-5 C"}]


@pytest.mark.parametrize(("reply", "why"), [
    (Reply(200, b"<html>gateway</html>", {"Content-Type": "text/html"}), "not JSON"),
    (json_reply([1, 2]), "expected a JSON object"),
    (json_reply({"type": "message", "role": "assistant"}), "no content list"),
    (json_reply({"type": "message", "content": ["hi"]}), "content block 0 has no type"),
    (json_reply({"type": "message", "content": [{"type": "text"}]}), "text block 0 has no text"),
    (message(tool_use("", "f", {})), "tool_use block 0 has no id"),
    (message(tool_use("t", "", {})), "tool_use block 0 has no name"),
    (message({"type": "tool_use", "id": "t", "name": "f", "input": "oops"}), "has no input object"),
    (error(200, "invalid_request_error", "bad field"), "error body: bad field"),
])
def test_malformed_answers_are_request_errors(
    server: FakeOpenAI, make_claude: MakeClaude, reply: Reply, why: str
) -> None:
    server.script(reply)
    with pytest.raises(ModelRequestError, match=why):
        make_claude().complete(ask())


# -- failures -----------------------------------------------------------------------------


@pytest.mark.parametrize(("reply", "status", "wait"), [
    (error(429, "rate_limit_error", "Number of request tokens has exceeded your rate limit",
           **{"retry-after": "7"}), 429, 7.0),
    (error(529, "overloaded_error", "Overloaded", **{"retry-after": "2"}), 529, 2.0),
    (error(500, "api_error", "Internal server error"), 500, None),
    (error(408, "timeout_error", "Request timed out"), 408, None),
    (error(200, "overloaded_error", "Overloaded (through a proxy)"), 200, None),
])
def test_rate_limits_overload_and_server_errors_are_unavailable(
    server: FakeOpenAI, make_claude: MakeClaude, reply: Reply, status: int, wait: float | None
) -> None:
    server.script(reply)
    with pytest.raises(ModelUnavailable) as caught:
        make_claude().complete(ask())
    assert caught.value.status_code == status
    assert caught.value.retry_after == wait


@pytest.mark.parametrize(("status", "kind"), [
    (400, "invalid_request_error"), (401, "authentication_error"), (403, "permission_error"),
    (404, "not_found_error"), (413, "request_too_large"),
])
def test_refusals_are_request_errors_with_the_servers_message(
    server: FakeOpenAI, make_claude: MakeClaude, status: int, kind: str
) -> None:
    server.script(error(status, kind, f"the {kind}\nexplained"))
    with pytest.raises(ModelRequestError) as caught:
        make_claude().complete(ask())
    assert caught.value.status_code == status
    assert str(caught.value).endswith(f"HTTP {status}: the {kind} explained")


def test_retry_after_sets_the_next_attempts_delay_in_a_workflow(
    app: cairn.App, server: FakeOpenAI, make_claude: MakeClaude
) -> None:
    server.script(error(529, "overloaded_error", "Overloaded", **{"retry-after": "1.5"}), message(text("ok")))
    claude = make_claude()

    @app.workflow(name="patient")
    def patient(ctx: cairn.Context) -> str:
        policy = RetryPolicy(max_attempts=3, initial_delay=0.01, jitter=0, retry_on=(ModelUnavailable,))
        return ctx.model(claude, [Message(role="user", content="hi")], retry=policy).message.text

    assert app.run(patient, run_id="patient") == "ok"
    [retried] = [e for e in app.history("patient") if e.event is EventType.STEP_RETRIED]
    assert retried.detail is not None
    assert retried.detail["next_at"] - retried.at == pytest.approx(1.5, abs=0.2)


def test_a_key_echoed_by_the_server_reaches_no_error_journal_or_cli(
    app: cairn.App, server: FakeOpenAI, make_claude: MakeClaude, tmp_path: Path
) -> None:
    server.script(error(401, "authentication_error", f"invalid x-api-key {SECRET}"))
    claude = make_claude(api_key=SECRET)
    assert SECRET not in repr(claude)
    assert "'***'" in repr(claude)

    @app.workflow(name="leaky")
    def leaky(ctx: cairn.Context) -> str:
        return ctx.model(claude, [Message(role="user", content="hi")]).message.text

    with pytest.raises(cairn.RunFailed) as caught:
        app.run(leaky, run_id="leaky")
    assert "invalid x-api-key ***" in str(caught.value)
    assert SECRET not in str(caught.value)
    out = CliRunner().invoke(main, ["show", "leaky", "--db", f"sqlite:///{tmp_path}/x.db"])
    assert out.exit_code == 0, out.output
    assert SECRET not in "".join(out.output.split())
    app.close()
    stored = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("x.db"))
    assert SECRET.encode() not in stored


def test_the_key_and_url_come_from_the_environment(
    server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url.removesuffix("/v1"))
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    server.script(message())
    with AnthropicChat("claude-env") as claude:
        claude.complete(ask())
    assert server.requests[0].headers["x-api-key"] == SECRET


def test_acomplete_sends_the_same_request(server: FakeOpenAI, make_claude: MakeClaude) -> None:
    import asyncio

    server.script(message(text("async")), message(text("sync")))
    claude = make_claude()

    async def once() -> ModelResponse:
        async with claude:
            return await claude.acomplete(ask())

    response = asyncio.run(once())
    assert response.message.text == "async"
    assert claude.complete(ask()).message.text == "sync"
    assert server.requests[0].body == server.requests[1].body


def test_provider_compaction_is_asked_for_and_its_block_sent_back(
    app: cairn.App, server: FakeOpenAI, make_claude: MakeClaude
) -> None:
    """``ContextPolicy(provider=True)``: the API is asked to compact at the
    threshold (with its beta feature); its compaction block is journaled and
    sent back verbatim, and what precedes it no longer counts, so Cairn does
    not compact on its own."""
    from cairn.models import ContextPolicy
    from cairn.models.anthropic import COMPACTION_BETA

    old = "an old message that the provider's compaction made irrelevant " * 40  # ~2,600 bytes
    # the provider read the whole history (more than the window) before it compacted it
    server.script(message(COMPACTION, text("Compacted; go on."), context_management=EDITS,
                          usage={"input_tokens": 1300, "output_tokens": 5}),
                  message(text("Still here.")))
    claude = make_claude(beta=("interleaved-thinking-2025-05-14",))
    policy = ContextPolicy(window=1200, trigger=0.5, provider=True)

    @app.workflow(name="provider")
    def provider(ctx: cairn.Context) -> list[str]:
        history = [Message(role="system", content="sys"), Message(role="user", content="task")]
        history += [Message(role="user", content=old)]
        first = ctx.model(claude, history, context=policy)
        history += [first.message, Message(role="user", content="next")]
        second = ctx.model(claude, history, context=policy)
        return [first.message.text, second.message.text]

    assert app.run(provider, run_id="p") == ["Compacted; go on.", "Still here."]
    first, second = server.requests
    assert first.body["context_management"] == {
        "edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 600}}]}
    assert first.headers["anthropic-beta"] == f"interleaved-thinking-2025-05-14,{COMPACTION_BETA}"
    # the whole history is sent (the API wants it), the compaction block verbatim
    assert second.body["messages"][1] == {"role": "assistant",
                                          "content": [COMPACTION, text("Compacted; go on.")]}
    assert second.body["messages"][0]["content"][-1] == text(old)
    # Cairn did not summarize or trim: the provider compacts
    assert not [e for e in app.history("p") if e.step_kind == "context"]
