"""Issue 10 item 8: every shape the real API answers with is kept, in the
response and in the journal, and sent back exactly on the next turn.

The bodies are built with the official ``openai`` package's own pydantic
types and served over real HTTP, so a field the adapter drops or a shape it
cannot read shows up here, not on a customer's first refusal.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import cairn
from cairn.models import FunctionCall, Message, ModelRequest, ModelResponse, ToolCall
from cairn.models.openai import OpenAIChat
from cairn.store.records import EventType
from tests.models.fake_openai import FakeOpenAI, Reply
from tests.timing import NAP

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessage


def served(message: ChatCompletionMessage, finish: str = "stop") -> Reply:
    """A ``ChatCompletion`` built and serialized by the openai package itself."""
    from openai.types.chat import ChatCompletion
    from openai.types.chat.chat_completion import Choice
    from openai.types.completion_usage import CompletionUsage

    body = ChatCompletion(
        id="chatcmpl-real", object="chat.completion", created=1_700_000_000, model="gpt-4o-2024-08-06",
        choices=[Choice(index=0, message=message, finish_reason=finish, logprobs=None)],  # type: ignore[arg-type]
        usage=CompletionUsage(prompt_tokens=11, completion_tokens=7, total_tokens=18),
    )
    return Reply(200, body.model_dump_json().encode(), {"Content-Type": "application/json"})


def shape(name: str) -> ChatCompletionMessage:
    """The message of each shape, built with the openai package's types. The
    package (the dev extra has it) is imported here, in the tests that use it,
    not when pytest collects this module: it costs a second of CPU per process."""
    from openai.types.chat import (
        ChatCompletionMessage,
        ChatCompletionMessageCustomToolCall,
        ChatCompletionMessageFunctionToolCall,
    )
    from openai.types.chat.chat_completion_message import FunctionCall as OpenAIFunctionCall
    from openai.types.chat.chat_completion_message_custom_tool_call import Custom
    from openai.types.chat.chat_completion_message_function_tool_call import Function

    if name == "refusal":
        return ChatCompletionMessage(
            role="assistant", content=None, refusal="I can't help with wiring money to that account.")
    if name == "function_call":
        return ChatCompletionMessage(
            role="assistant", content=None,
            function_call=OpenAIFunctionCall(name="get_weather", arguments='{"city": "Paris"}'))
    assert name == "custom", name
    return ChatCompletionMessage(
        role="assistant", content=None,
        tool_calls=[
            ChatCompletionMessageFunctionToolCall(
                id="call_fn", type="function",
                function=Function(name="get_weather", arguments='{"city": "Oslo"}')),
            ChatCompletionMessageCustomToolCall(
                id="call_sql", type="custom", custom=Custom(name="run_sql", input="SELECT 1; -- not JSON")),
        ],
    )


@pytest.fixture
def app(tmp_path: Path) -> Iterator[cairn.App]:
    application = cairn.App(db=f"sqlite:///{tmp_path}/x.db")
    yield application
    application.close()


def ask(chat: OpenAIChat) -> ModelResponse:
    return chat.complete(ModelRequest(messages=(Message(role="user", content="hi"),)))


def test_a_refusal_is_kept(server: FakeOpenAI, make_chat: Any) -> None:
    server.script(served(shape("refusal")))
    response = ask(make_chat())
    assert response.message.refusal == "I can't help with wiring money to that account."
    assert response.message.content is None


def test_a_legacy_function_call_is_kept(server: FakeOpenAI, make_chat: Any) -> None:
    server.script(served(shape("function_call"), "function_call"))
    response = ask(make_chat())
    assert response.message.function_call == FunctionCall(name="get_weather", arguments='{"city": "Paris"}')
    assert response.finish_reason == "function_call"


def test_custom_tool_calls_are_kept_beside_function_calls(server: FakeOpenAI, make_chat: Any) -> None:
    server.script(served(shape("custom"), "tool_calls"))
    response = ask(make_chat())
    assert response.message.tool_calls == (
        ToolCall(id="call_fn", name="get_weather", arguments='{"city": "Oslo"}'),
        ToolCall(id="call_sql", name="run_sql", arguments="SELECT 1; -- not JSON", type="custom"),
    )


@pytest.mark.parametrize("name", ["refusal", "function_call", "custom"])
def test_each_shape_is_journaled_and_sent_back_exactly(
    app: cairn.App, server: FakeOpenAI, make_chat: Any, tmp_path: Path, name: str
) -> None:
    """The answer survives the journal (a replay after the suspension reads
    it back) and goes back to the server on the next turn as the API wrote
    it: the openai package's own dump of the message, field for field."""
    from openai.types.chat import ChatCompletionMessage

    message = shape(name)
    server.script(served(message), served(ChatCompletionMessage(role="assistant", content="done")))
    chat = make_chat()

    @app.workflow(name="two_turns")
    def two_turns(ctx: cairn.Context) -> list[Any]:
        first = ctx.model(chat, [Message(role="user", content="hi")])
        ctx.sleep(NAP)  # the run is replayed: `first` now comes from the journal
        ctx.model(chat, [Message(role="user", content="hi"), first.message])
        return [first.message.refusal, first.message.function_call is not None, len(first.message.tool_calls)]

    app.run(two_turns, run_id="shapes")
    assert len(server.requests) == 2
    sent_back = server.requests[1].body["messages"][1]
    assert sent_back == message.model_dump(exclude_none=True)
    assert any(e.event is EventType.RUN_SUSPENDED for e in app.history("shapes"))
    if message.refusal:
        stored = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("x.db"))
        assert message.refusal.encode() in stored


def test_function_tool_calls_hash_as_before() -> None:
    """Adding ``ToolCall.type`` must not change how existing function calls
    encode: input hashes of runs journaled before would no longer match."""
    import msgspec

    call = ToolCall(id="c", name="n", arguments="{}")
    assert msgspec.json.encode(call) == b'{"id":"c","name":"n","arguments":"{}"}'
