"""``OpenAIChat(api_key=cairn.Secret(...))``: the key is resolved on every
call through the running App's secrets, refreshed on a 401, and never held
by the client or written to the journal. Against a real HTTP server
(``tests.models.fake_openai``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import cairn
from cairn.models import Message, ModelRequest
from cairn.models.openai import ModelRequestError, OpenAIChat
from tests.models.fake_openai import FakeOpenAI, completion, error
from tests.security.world import Service, recorded_text


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


def test_the_key_is_resolved_per_call_and_refreshed_on_401(app: cairn.App, server: FakeOpenAI) -> None:
    service = Service()
    app.secrets = {"vault": cairn.CallableSecrets(service.issue)}
    chat = OpenAIChat("gpt-test", base_url=server.url, api_key=cairn.Secret("openai", provider="vault"))
    assert repr(chat) == ("OpenAIChat(model='gpt-test', base_url=" + repr(chat.base_url)
                          + ", api_key=Secret(name='openai', provider='vault', version=None, scope=None))")
    server.script(completion("first"), error(401, "Incorrect API key provided: tok-..."),
                  completion("second"))

    @app.workflow(name="chat")
    def talk(ctx: cairn.Context) -> list[str]:
        one = ctx.model(chat, [Message(role="user", content="hi")])
        service.revoke_all()  # the key is rotated between the calls
        two = ctx.model(chat, [Message(role="user", content="again")])
        return [one.message.text, two.message.text]

    try:
        assert app.run(talk, run_id="c") == ["first", "second"]
    finally:
        chat.close()
    first, second = service.tokens()
    sent = [r.headers.get("authorization") for r in server.requests]
    assert sent == [f"Bearer {first}", f"Bearer {first}", f"Bearer {second}"]
    text = recorded_text(app, "c")
    assert first not in text
    assert second not in text
    assert first not in repr(vars(chat))
    assert second not in repr(vars(chat))


def test_a_key_refused_after_the_refresh_is_a_request_error_without_the_key(
    app: cairn.App, server: FakeOpenAI
) -> None:
    service = Service()
    app.secrets = cairn.CallableSecrets(service.issue)
    chat = OpenAIChat("gpt-test", base_url=server.url, api_key=cairn.Secret("openai"))
    server.script(error(401, "bad key"), error(401, "still bad"))

    @app.workflow(name="refused")
    def refused(ctx: cairn.Context) -> str:
        try:
            ctx.model(chat, [Message(role="user", content="hi")])
        except cairn.StepFailed as failed:
            return failed.message
        return "?"

    try:
        message = app.run(refused, run_id="r")
    finally:
        chat.close()
    assert "HTTP 401: still bad" in message
    assert len(server.requests) == 2  # one refresh, then the answer stands
    assert [t for t in service.tokens() if t in recorded_text(app, "r")] == []


def test_outside_a_run_the_key_needs_an_explicit_resolver(server: FakeOpenAI) -> None:
    request = ModelRequest(messages=(Message(role="user", content="hi"),))
    with OpenAIChat("gpt-test", base_url=server.url, api_key=cairn.Secret("openai")) as chat, \
            pytest.raises(cairn.SecretError, match="only be resolved inside a run"):
        chat.complete(request)
    assert server.requests == []
    resolver = cairn.Secrets(cairn.EnvSecrets(environ={"CAIRN_SECRET_OPENAI": "sk-explicit-0001"}))
    server.script(completion("hello"), error(400, "echoing your key sk-explicit-0001"))
    with OpenAIChat("gpt-test", base_url=server.url, api_key=cairn.Secret("openai"),
                    secrets=resolver) as chat:
        assert chat.complete(request).message.text == "hello"
        with pytest.raises(ModelRequestError) as err:
            chat.complete(request)
    assert "sk-explicit-0001" not in str(err.value)
    assert "***" in str(err.value)
    assert server.requests[0].headers["authorization"] == "Bearer sk-explicit-0001"


def test_an_async_call_resolves_and_refreshes_the_key_too(app: cairn.App, server: FakeOpenAI) -> None:
    service = Service()
    app.secrets = cairn.CallableSecrets(service.issue)
    chat = OpenAIChat("gpt-test", base_url=server.url, api_key=cairn.Secret("openai"))
    server.script(error(401, "expired"), completion("async answer"))

    @app.workflow(name="async-chat")
    async def talk(ctx: cairn.Context) -> str:
        response = await ctx.model_async(chat, [Message(role="user", content="hi")])
        return response.message.text

    try:
        assert app.run(talk, run_id="ac") == "async answer"
    finally:
        chat.close()
    first, second = service.tokens()
    sent = [r.headers.get("authorization") for r in server.requests]
    assert sent == [f"Bearer {first}", f"Bearer {second}"]
    assert [t for t in service.tokens() if t in recorded_text(app, "ac")] == []
