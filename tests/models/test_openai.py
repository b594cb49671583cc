"""The OpenAI-compatible client against a real (fake) HTTP server: the wire
format it sends, what it makes of the answers, how failures are classified,
and how it behaves inside durable workflows."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn.models import Message, ModelRequest, ModelResponse, ToolCall, Usage
from cairn.models.openai import DEFAULT_BASE_URL, ModelRequestError, ModelUnavailable, OpenAIChat
from cairn.store.records import EventType
from tests.models.fake_openai import FakeOpenAI, Reply, completion, error, json_reply
from tests.timing import NAP, napped

MakeChat = Callable[..., OpenAIChat]

SECRET = "sk-test-DO-NOT-LEAK-4f1c9a"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def ask(content: str = "hi") -> ModelRequest:
    return ModelRequest(messages=(Message(role="user", content=content),))


@pytest.fixture
def app(tmp_path: Path) -> Iterator[cairn.App]:
    application = cairn.App(db=f"sqlite:///{tmp_path}/x.db")
    yield application
    application.close()


# -- what is sent -----------------------------------------------------------------------


def test_request_wire_format(server: FakeOpenAI, make_chat: MakeChat) -> None:
    server.script(completion("sunny"))
    chat = make_chat("gpt-test", api_key=SECRET, extra_headers={"OpenAI-Organization": "org-1"})
    call = ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}')
    request = ModelRequest(
        messages=(
            Message(role="system", content="You are terse."),
            Message(role="user", content="Weather in Paris?"),
            Message(role="assistant", tool_calls=(call,)),
            Message(role="tool", content='{"temp": 21}', tool_call_id="call_1", name="get_weather"),
        ),
        tools=(WEATHER_TOOL,),
        params={"temperature": 0.2, "max_tokens": 50, "seed": 7},
    )
    chat.complete(request)

    [received] = server.requests
    assert received.method == "POST"
    assert received.path == "/v1/chat/completions"
    assert received.headers["authorization"] == f"Bearer {SECRET}"
    assert received.headers["content-type"] == "application/json"
    assert received.headers["openai-organization"] == "org-1"
    assert received.body == {
        "model": "gpt-test",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            ]},
            {"role": "tool", "content": '{"temp": 21}', "tool_call_id": "call_1", "name": "get_weather"},
        ],
        "tools": [WEATHER_TOOL],
        "temperature": 0.2,
        "max_tokens": 50,
        "seed": 7,
    }


def test_no_tools_key_and_no_authorization_without_a_key(server: FakeOpenAI, make_chat: MakeChat) -> None:
    server.script(completion())
    make_chat().complete(ask())
    [received] = server.requests
    assert received.body == {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
    assert "authorization" not in received.headers


def test_trailing_slash_in_base_url_is_tolerated(server: FakeOpenAI, make_chat: MakeChat) -> None:
    server.script(completion())
    make_chat(base_url=server.url + "/").complete(ask())
    assert server.requests[0].path == "/v1/chat/completions"


# -- what is understood ---------------------------------------------------------------------


def test_text_reply_is_parsed(server: FakeOpenAI, make_chat: MakeChat) -> None:
    usage = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    server.script(completion("Hello there.", model="gpt-test-0613", usage=usage))
    response = make_chat().complete(ask())
    assert response.message == Message(role="assistant", content="Hello there.")
    assert response.model == "gpt-test-0613"
    assert response.finish_reason == "stop"
    assert response.usage == Usage(12, 3, 15)
    assert response.cost is None


@pytest.mark.parametrize(("usage", "counted"), [
    ({"prompt_tokens": 5, "completion_tokens": False, "total_tokens": -1}, Usage(5, 0, 5)),
    ({"prompt_tokens": 5, "completion_tokens": 2.0, "total_tokens": 9}, Usage(5, 0, 9)),
    (["not", "an", "object"], Usage()),
])
def test_a_malformed_usage_count_counts_zero(server: FakeOpenAI, make_chat: MakeChat, usage: Any,
                                             counted: Usage) -> None:
    """A count that is negative, a bool or not an integer counts 0 (``transport.token_counts``),
    and a total that is not a count is the sum of the others."""
    server.script(completion("ok", usage=usage))
    assert make_chat().complete(ask()).usage == counted


def test_a_reply_naming_no_model_and_an_odd_finish_reason(server: FakeOpenAI, make_chat: MakeChat) -> None:
    """A gateway may name no model, or send a finish reason that is not a string: the
    response names the adapter's model, and no reason (``transport.HTTPModel._answer``)."""
    server.script(completion("ok", model="", finish_reason=7))  # type: ignore[arg-type]
    response = make_chat().complete(ask())
    assert (response.model, response.finish_reason) == ("gpt-test", None)


def test_tool_call_reply_is_parsed(server: FakeOpenAI, make_chat: MakeChat) -> None:
    server.script(completion(
        None,
        finish_reason="tool_calls",
        tool_calls=[
            {"id": "call_abc", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
            # lenient servers: no id, arguments as an object
            {"type": "function", "function": {"name": "get_time", "arguments": {"tz": "UTC"}}},
        ],
    ))
    response = make_chat().complete(ask())
    first, second = response.message.tool_calls
    assert response.message.content is None
    assert response.finish_reason == "tool_calls"
    assert first == ToolCall(id="call_abc", name="get_weather", arguments='{"city": "Oslo"}')
    assert first.parsed_arguments() == {"city": "Oslo"}
    assert second.id == "call_1"
    assert second.name == "get_time"
    assert second.parsed_arguments() == {"tz": "UTC"}


def test_missing_usage_counts_as_zero_and_missing_total_is_summed(
    server: FakeOpenAI, make_chat: MakeChat
) -> None:
    server.script(completion("a"), completion("b", usage={"prompt_tokens": 4, "completion_tokens": 6}))
    chat = make_chat()
    assert chat.complete(ask()).usage == Usage(0, 0, 0)
    assert chat.complete(ask()).usage == Usage(4, 6, 10)


def test_cost_uses_the_prices_per_thousand_tokens(server: FakeOpenAI, make_chat: MakeChat) -> None:
    usage = {"prompt_tokens": 1200, "completion_tokens": 300, "total_tokens": 1500}
    server.script(completion(usage=usage), completion(usage=usage))
    priced = make_chat(price_per_1k_input=0.5, price_per_1k_output=1.5)
    assert priced.complete(ask()).cost == pytest.approx(1200 * 0.5 / 1000 + 300 * 1.5 / 1000)
    input_only = make_chat(price_per_1k_input=0.5)
    assert input_only.complete(ask()).cost == pytest.approx(0.6)


# -- how failures are classified ------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 500, 502, 503])
def test_rate_limits_and_server_errors_are_unavailable(
    server: FakeOpenAI, make_chat: MakeChat, status: int
) -> None:
    server.script(error(status, "slow down\nplease", **{"Retry-After": "7"}))
    with pytest.raises(ModelUnavailable, match=rf"HTTP {status}: slow down please$") as caught:
        make_chat().complete(ask())
    assert caught.value.status_code == status
    assert caught.value.retry_after == 7.0


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_client_errors_carry_status_and_the_servers_message(
    server: FakeOpenAI, make_chat: MakeChat, status: int
) -> None:
    server.script(error(status, "Invalid value for 'temperature':\n  must be <= 2."))
    with pytest.raises(ModelRequestError) as caught:
        make_chat(api_key=SECRET).complete(ask())
    assert caught.value.status_code == status
    message = str(caught.value)
    assert message.endswith(f"HTTP {status}: Invalid value for 'temperature': must be <= 2.")
    assert "\n" not in message
    assert SECRET not in message
    assert not isinstance(caught.value, ModelUnavailable)


def test_error_without_an_openai_body_keeps_the_start_of_the_text(
    server: FakeOpenAI, make_chat: MakeChat
) -> None:
    server.script(Reply(403, b"<html>\n<body>Forbidden " + b"x" * 1000 + b"</body></html>"))
    with pytest.raises(ModelRequestError, match=r"HTTP 403: <html> <body>Forbidden x+\.\.\.$") as caught:
        make_chat().complete(ask())
    assert len(str(caught.value)) < 400


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        (Reply(200, b"<html>oops</html>", {"Content-Type": "text/html"}), r"response is not JSON"),
        (json_reply({"choices": []}), r"malformed chat completion: no choices"),
        (json_reply({"object": "list", "data": []}), r"malformed chat completion: no choices"),
        (json_reply([1, 2]), r"expected a JSON object, got list"),
        (json_reply({"choices": [{"index": 0}]}), r"the first choice has no message"),
        (json_reply({"choices": [{"message": {"role": "assistant", "content": [1]}}]}), r"content is a list"),
        (json_reply({"choices": [{"message": {"tool_calls": [{"id": "x"}]}}]}), r"tool call 0 has no func"),
    ],
)
def test_malformed_bodies_are_request_errors(
    server: FakeOpenAI, make_chat: MakeChat, reply: Reply, problem: str
) -> None:
    server.script(reply)
    with pytest.raises(ModelRequestError, match=problem) as caught:
        make_chat().complete(ask())
    assert caught.value.status_code == 200


def test_refused_connection_is_unavailable(make_chat: MakeChat) -> None:
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens on it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ModelUnavailable, match="unreachable") as caught:
        make_chat(base_url=f"http://127.0.0.1:{port}/v1").complete(ask())
    assert caught.value.status_code is None


def test_dropped_connection_is_unavailable(server: FakeOpenAI, make_chat: MakeChat) -> None:
    server.script(Reply(drop=True))
    with pytest.raises(ModelUnavailable, match="unreachable"):
        make_chat().complete(ask())


def test_timeout_is_unavailable(server: FakeOpenAI, make_chat: MakeChat) -> None:
    server.script(Reply(delay=5.0, body=b"{}"))
    with pytest.raises(ModelUnavailable, match="timed out"):
        make_chat(timeout=0.2).complete(ask())


def test_unsupported_url_is_a_request_error_not_an_outage(make_chat: MakeChat) -> None:
    with pytest.raises(ModelRequestError, match="cannot send request"):
        make_chat(base_url="ftp://127.0.0.1/v1").complete(ask())


# -- async ---------------------------------------------------------------------------------------


def test_acomplete_sends_the_same_request_and_parses_the_reply(
    server: FakeOpenAI, make_chat: MakeChat
) -> None:
    server.script(completion("async hello", usage={"prompt_tokens": 2, "completion_tokens": 2}),
                  error(429, "rate limited"))
    chat = make_chat(api_key=SECRET)

    async def scenario() -> None:
        response = await chat.acomplete(ask())
        assert response.message.content == "async hello"
        assert response.usage == Usage(2, 2, 4)
        with pytest.raises(ModelUnavailable, match="HTTP 429: rate limited"):
            await chat.acomplete(ask())
        await chat.aclose()

    asyncio.run(scenario())
    assert [r.body for r in server.requests] == [{"model": "gpt-test", "messages": [{"role": "user",
                                                                                      "content": "hi"}]}] * 2
    assert server.requests[0].headers["authorization"] == f"Bearer {SECRET}"


def test_each_event_loop_gets_its_own_async_connections(server: FakeOpenAI, make_chat: MakeChat) -> None:
    """Cairn runs one loop per worker thread; a client shared by workflows on
    several loops must not hand one loop's pooled connection to another."""
    server.script(completion("a"), completion("b"), completion("c"))
    chat = make_chat()
    first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        answers = [loop.run_until_complete(chat.acomplete(ask())).message.content
                   for loop in (first, second, first)]
        assert answers == ["a", "b", "c"]
        chat.close()  # closes both loops' clients on their own (idle) loops
    finally:
        first.close()
        second.close()


def test_close_releases_clients_which_reopen_on_demand(server: FakeOpenAI, make_chat: MakeChat) -> None:
    server.script(completion("before"), completion("after"))
    with make_chat() as chat:
        assert chat.complete(ask()).message.content == "before"
        pooled = chat._sync_client()
    assert pooled.is_closed
    assert chat.complete(ask()).message.content == "after"


# -- configuration ---------------------------------------------------------------------------


def test_base_url_and_key_come_from_the_environment(
    server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.script(completion(), completion(), completion())
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/never")
    monkeypatch.setenv("CAIRN_OPENAI_BASE_URL", server.url)  # the Cairn-specific one wins
    monkeypatch.setenv("OPENAI_API_KEY", "sk-generic")
    monkeypatch.setenv("CAIRN_OPENAI_API_KEY", "sk-cairn")
    with OpenAIChat("m") as chat:
        assert chat.base_url == server.url
        chat.complete(ask())
    monkeypatch.delenv("CAIRN_OPENAI_BASE_URL")
    monkeypatch.delenv("CAIRN_OPENAI_API_KEY")
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    with OpenAIChat("m") as chat:
        chat.complete(ask())
    with OpenAIChat("m", api_key="sk-explicit") as chat:  # an explicit key beats the environment
        chat.complete(ask())
    assert [r.headers["authorization"] for r in server.requests] == [
        "Bearer sk-cairn", "Bearer sk-generic", "Bearer sk-explicit"
    ]


def test_defaults_without_environment() -> None:
    chat = OpenAIChat("gpt-4o-mini")
    assert chat.base_url == DEFAULT_BASE_URL == "https://api.openai.com/v1"
    assert chat.model_id == "gpt-4o-mini"
    assert repr(chat) == "OpenAIChat(model='gpt-4o-mini', base_url='https://api.openai.com/v1', api_key=None)"


def test_repr_hides_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    explicit = OpenAIChat("m", base_url="http://localhost:1/v1", api_key=SECRET)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    from_env = OpenAIChat("m", base_url="http://localhost:1/v1")
    for chat in (explicit, from_env):
        assert SECRET not in repr(chat)
        assert SECRET not in str(chat)
        assert "api_key='***'" in repr(chat)
        assert not any(SECRET in str(value) for value in vars(chat).values() if not isinstance(value, dict))


# -- inside durable workflows ------------------------------------------------------------------


def test_a_recorded_model_call_is_not_repeated_after_suspension(
    app: cairn.App, server: FakeOpenAI, make_chat: MakeChat, tmp_path: Path
) -> None:
    usage = {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}
    server.script(completion("the recorded answer", usage=usage))
    chat = make_chat("gpt-test", api_key=SECRET, price_per_1k_input=1.0, price_per_1k_output=2.0)

    @app.workflow(name="ask_once")
    def ask_once(ctx: cairn.Context) -> str:
        response = ctx.model(chat, [Message(role="user", content="hi")], temperature=0)
        ctx.sleep(NAP)  # suspends: the run is replayed from its journal after the timer
        return response.message.content or ""

    assert app.run(ask_once, run_id="once") == "the recorded answer"

    assert len(server.requests) == 1
    assert server.requests[0].body["temperature"] == 0
    history = app.history("once")
    assert any(e.event is EventType.RUN_SUSPENDED for e in history)
    [model_step] = [e for e in history if e.event is EventType.STEP_COMPLETED and e.step_kind == "model"]
    assert model_step.name == "gpt-test"
    detail = model_step.detail or {}
    assert detail["model"] == "fake-model-2024"
    assert detail["latency_ms"] > 0
    assert detail["usage"] == usage
    assert detail["cost"] == pytest.approx((9 * 1.0 + 4 * 2.0) / 1000)

    # the journal holds the answer, but never the key
    stored = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("x.db"))
    assert b"the recorded answer" in stored
    assert SECRET.encode() not in stored


def test_an_unavailable_model_is_retried_by_the_policy(
    app: cairn.App, server: FakeOpenAI, make_chat: MakeChat
) -> None:
    server.script(error(503, "overloaded"), completion("second time lucky"))
    chat = make_chat()

    @app.workflow(name="retrying")
    def retrying(ctx: cairn.Context) -> str:
        policy = cairn.RetryPolicy(max_attempts=3, initial_delay=0.01, jitter=0)
        response = ctx.model(chat, [Message(role="user", content="hi")], retry=policy)
        return response.message.content or ""

    assert app.run(retrying, run_id="retrying") == "second time lucky"
    assert len(server.requests) == 2
    [retried] = [e for e in app.history("retrying") if e.event is EventType.STEP_RETRIED]
    assert retried.step_kind == "model"
    assert retried.detail is not None
    assert retried.detail["error"]["type"] == "ModelUnavailable"


def test_a_rejected_request_is_not_retried_when_the_policy_retries_outages_only(
    app: cairn.App, server: FakeOpenAI, make_chat: MakeChat
) -> None:
    server.script(error(400, "Unknown parameter: 'temprature'."), completion("never sent"))
    chat = make_chat()

    @app.workflow(name="rejected")
    def rejected(ctx: cairn.Context) -> str:
        policy = cairn.RetryPolicy(max_attempts=3, initial_delay=0.01, retry_on=(ModelUnavailable,))
        response = ctx.model(chat, [Message(role="user", content="hi")], retry=policy, temprature=0)
        return response.message.content or ""

    with pytest.raises(cairn.RunFailed, match=r"ModelRequestError.*Unknown parameter: 'temprature'"):
        app.run(rejected)
    assert len(server.requests) == 1


def test_async_workflows_use_acomplete(app: cairn.App, server: FakeOpenAI, make_chat: MakeChat) -> None:
    server.script(completion("from the async client"))
    chat = make_chat()
    used: list[str] = []
    real_acomplete = chat.acomplete

    async def spy(request: ModelRequest) -> ModelResponse:
        used.append("acomplete")
        return await real_acomplete(request)

    chat.acomplete = spy  # type: ignore[method-assign]

    @app.workflow(name="async_ask")
    async def async_ask(ctx: cairn.Context) -> str:
        response = await ctx.model_async(chat, [Message(role="user", content="hi")])
        ctx.sleep(NAP)  # suspends: the answer below is the journal's on the replay, not a second call
        return response.message.content or ""

    answer: object = app.run(async_ask, run_id="async-ask")
    assert answer == "from the async client"
    assert used == ["acomplete"]
    assert len(server.requests) == 1
    before, after = napped(app.history("async-ask"))
    assert [e.step_kind for e in before] == ["model", "sleep"]
    assert after == []
    assert server.requests[0].body["messages"] == [{"role": "user", "content": "hi"}]
