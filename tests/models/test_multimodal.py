"""Multimodal message content (issue 10, item 5): ``content`` as a list of
parts is sent as given, journaled, and read back on replay. Before, the
request was sent (and paid for) and then the run failed: the journal could
not decode a list where it expected a string."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn.codec import values
from cairn.models.base import Message, ModelRequest
from cairn.models.openai import OpenAIChat
from cairn.store.records import EventType
from tests.models.fake_openai import FakeOpenAI, completion, json_reply
from tests.timing import NAP, napped

PARTS = [
    {"type": "text", "text": "What is in this picture?"},
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}},
]


@pytest.fixture
def app(tmp_path: Path) -> Iterator[cairn.App]:
    application = cairn.App(db=f"sqlite:///{tmp_path}/x.db")
    yield application
    application.close()


def test_message_with_parts_round_trips_through_the_codec() -> None:
    message = Message(role="user", content=tuple(PARTS))
    assert values.decode(values.encode(message), Message) == message
    assert message.text == "What is in this picture?"
    request = ModelRequest(messages=(Message(role="user", content=PARTS),))  # a list, as users write it
    assert values.decode(values.encode(request), ModelRequest).messages[0].content == tuple(PARTS)


def test_multimodal_request_is_sent_journaled_and_replayed(
    app: cairn.App, server: FakeOpenAI, make_chat: Callable[..., OpenAIChat]
) -> None:
    server.script(completion("a cat"))
    chat = make_chat("gpt-test")

    @app.workflow(name="describe")
    def describe(ctx: cairn.Context) -> Any:
        reply = ctx.model(chat, [Message(role="user", content=PARTS)])
        ctx.sleep(NAP)  # suspends: the next execution replays the model call from the journal
        return reply.message.content

    assert app.run(describe, run_id="img") == "a cat"
    napped(app.history("img"))
    [received] = server.requests  # asked once: the replay after the timer did not ask again
    assert received.body["messages"] == [{"role": "user", "content": PARTS}]
    completed = [e.step_kind for e in app.history("img") if e.event is EventType.STEP_COMPLETED]
    assert completed == ["model", "sleep"]


def test_response_content_as_parts_is_kept(server: FakeOpenAI, make_chat: Callable[..., OpenAIChat]) -> None:
    body: dict[str, Any] = {
        "id": "x", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": [{"type": "text", "text": "hi"}]}}],
    }
    server.script(json_reply(body))
    response = make_chat().complete(ModelRequest(messages=(Message(role="user", content="hey"),)))
    assert response.message.content == ({"type": "text", "text": "hi"},)
    assert response.message.text == "hi"


def test_a_request_the_journal_could_not_read_back_is_not_sent(
    app: cairn.App, server: FakeOpenAI, make_chat: Callable[..., OpenAIChat]
) -> None:
    chat = make_chat("gpt-test")

    @app.workflow(name="bad")
    def bad(ctx: cairn.Context) -> str:
        return ctx.model(chat, [Message(role="user", content=42)]).message.text  # type: ignore[arg-type]

    with pytest.raises(cairn.RunFailed, match="request to model"):
        app.run(bad, run_id="bad")
    assert server.requests == []
