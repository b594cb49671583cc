"""Issue 10 items 9 and 10: the adapter against hostile or unusual servers.

Item 9: the server's ``Retry-After`` decides the next attempt's delay; an
exhausted quota is not retried; ``timeout`` bounds the whole call against a
server that trickles its answer; a 200 carrying ``{"error": ...}`` reports
the server's message; ``stream=True`` is refused before anything is sent.

Item 10: a key never reaches an error, ``repr``, the journal or the CLI,
whether the server echoes it or it sits in ``base_url`` (``user:KEY@``,
``?api-key=KEY``); a ``base_url`` with a query string builds a correct URL.
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import cairn
from cairn.cli.main import main
from cairn.models import Message, ModelRequest
from cairn.models.openai import ModelRequestError, ModelUnavailable, OpenAIChat
from cairn.retry import RetryPolicy
from cairn.store.records import EventType
from tests.models.fake_openai import FakeOpenAI, Reply, completion, error, json_reply

SECRET = "sk-proj-LEAKME-7d1e0c2b9a"


def ask(content: str = "hi", **params: Any) -> ModelRequest:
    return ModelRequest(messages=(Message(role="user", content=content),), params=params)


@pytest.fixture
def app(tmp_path: Path) -> Iterator[cairn.App]:
    application = cairn.App(db=f"sqlite:///{tmp_path}/x.db")
    yield application
    application.close()


def stored_bytes(tmp_path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("x.db"))


# -- item 9: Retry-After, quota, whole-call timeout, error bodies, streaming -------------------


def test_retry_after_seconds_sets_the_next_attempts_delay(
    app: cairn.App, server: FakeOpenAI, make_chat: Any
) -> None:
    """The policy alone would wait 10 ms; the server asked for 1.5 s."""
    server.script(error(429, "Rate limit reached", **{"Retry-After": "1.5"}), completion("after the wait"))
    chat = make_chat()

    @app.workflow(name="patient")
    def patient(ctx: cairn.Context) -> str:
        policy = RetryPolicy(max_attempts=3, initial_delay=0.01, jitter=0, retry_on=(ModelUnavailable,))
        return ctx.model(chat, [Message(role="user", content="hi")], retry=policy).message.content or ""

    assert app.run(patient, run_id="patient") == "after the wait"
    [retried] = [e for e in app.history("patient") if e.event is EventType.STEP_RETRIED]
    assert retried.detail is not None
    assert retried.detail["next_at"] - retried.at == pytest.approx(1.5, abs=0.2)
    assert len(server.requests) == 2


def test_retry_after_as_an_http_date(server: FakeOpenAI, make_chat: Any) -> None:
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    server.script(error(503, "maintenance", **{"Retry-After": when}))
    with pytest.raises(ModelUnavailable) as caught:
        make_chat().complete(ask())
    assert caught.value.retry_after == pytest.approx(30, abs=2)
    policy = RetryPolicy(initial_delay=0.01, jitter=0)
    assert policy.delay(1, caught.value) == pytest.approx(30, abs=2)


def test_a_hostile_retry_after_is_capped_by_the_policy(server: FakeOpenAI, make_chat: Any) -> None:
    server.script(error(429, "slow down", **{"Retry-After": "99999999"}))
    with pytest.raises(ModelUnavailable) as caught:
        make_chat().complete(ask())
    assert RetryPolicy(max_delay=60).delay(1, caught.value) == 60


def test_an_exhausted_quota_is_not_retried(app: cairn.App, server: FakeOpenAI, make_chat: Any) -> None:
    quota = json_reply({"error": {"message": "You exceeded your current quota, please check your plan.",
                                  "type": "insufficient_quota", "param": None, "code": "insufficient_quota"}},
                       429)
    server.script(quota, completion("never asked"))
    chat = make_chat()

    @app.workflow(name="broke")
    def broke(ctx: cairn.Context) -> str:
        policy = RetryPolicy(max_attempts=5, initial_delay=0.01, retry_on=(ModelUnavailable,))
        return ctx.model(chat, [Message(role="user", content="hi")], retry=policy).message.content or ""

    with pytest.raises(cairn.RunFailed, match=r"ModelRequestError.*exceeded your current quota"):
        app.run(broke)
    assert len(server.requests) == 1


TRICKLE = Reply(200, b" " * 400 + completion("too late").body, {"Content-Type": "application/json"},
                trickle=0.2)


def test_the_timeout_bounds_the_whole_sync_call(server: FakeOpenAI, make_chat: Any) -> None:
    """Every read gets a byte within 0.2 s; without a whole-call bound the
    call would last 400 * 0.2 s."""
    server.script(TRICKLE)
    started = time.monotonic()
    with pytest.raises(ModelUnavailable, match="timed out after 1 s"):
        make_chat(timeout=1.0).complete(ask())
    assert time.monotonic() - started < 3.0  # the trickle alone would last 80 s


def test_the_timeout_bounds_the_whole_async_call(server: FakeOpenAI, make_chat: Any) -> None:
    server.script(TRICKLE)
    chat = make_chat(timeout=1.0)

    async def call() -> None:
        try:
            await chat.acomplete(ask())
        finally:
            await chat.aclose()

    started = time.monotonic()
    with pytest.raises(ModelUnavailable, match="timed out after 1 s"):
        asyncio.run(call())
    assert time.monotonic() - started < 3.0  # the trickle alone would last 80 s


def test_a_pooled_connection_still_answers_after_a_bounded_call(server: FakeOpenAI, make_chat: Any) -> None:
    """The deadline belongs to one call: the next call on the same client has its own."""
    server.script(completion("one"), completion("two", model="m2"))
    chat = make_chat(timeout=1.0)
    assert chat.complete(ask()).message.content == "one"
    time.sleep(1.1)
    assert chat.complete(ask()).message.content == "two"


def test_a_200_with_an_error_body_reports_the_servers_message(server: FakeOpenAI, make_chat: Any) -> None:
    server.script(json_reply({"error": {"message": "Upstream provider rejected the prompt", "code": 400}}))
    with pytest.raises(ModelRequestError, match="Upstream provider rejected the prompt") as caught:
        make_chat().complete(ask())
    assert caught.value.status_code == 200


@pytest.mark.parametrize("code", [429, 502])
def test_a_200_with_an_outage_code_in_its_error_body_is_unavailable(
    server: FakeOpenAI, make_chat: Any, code: int
) -> None:
    server.script(json_reply({"error": {"message": "Provider returned error", "code": code}}))
    with pytest.raises(ModelUnavailable, match="Provider returned error"):
        make_chat().complete(ask())


def test_streaming_is_refused_before_anything_is_sent(server: FakeOpenAI, make_chat: Any) -> None:
    chat = make_chat()
    with pytest.raises(ModelRequestError, match="stream=True is not supported"):
        chat.complete(ask(stream=True))
    with pytest.raises(ModelRequestError, match="stream=True is not supported"):
        asyncio.run(chat.acomplete(ask(stream=True)))
    assert server.requests == []


# -- item 10: secrets, URLs ---------------------------------------------------------------------


def test_a_key_echoed_by_the_server_reaches_no_error_journal_or_cli(
    app: cairn.App, server: FakeOpenAI, make_chat: Any, tmp_path: Path
) -> None:
    echoed = f"Incorrect API key provided: {SECRET}. You can find your API key at https://example/keys."
    server.script(error(401, echoed))
    chat = make_chat(api_key=SECRET)

    @app.workflow(name="leaky")
    def leaky(ctx: cairn.Context) -> str:
        return ctx.model(chat, [Message(role="user", content="hi")]).message.content or ""

    with pytest.raises(cairn.RunFailed) as caught:
        app.run(leaky, run_id="leaky")
    assert "Incorrect API key provided: ***" in str(caught.value)
    assert SECRET not in str(caught.value)
    db = f"sqlite:///{tmp_path}/x.db"
    for command in (["show", "leaky", "--db", db], ["events", "leaky", "--db", db],
                    ["show", "leaky", "--json", "--db", db]):
        out = CliRunner().invoke(main, command, env={"COLUMNS": "100"})
        assert out.exit_code == 0, out.output
        if command[0] == "show":  # `events` cuts long messages
            assert "Incorrect API key provided" in " ".join(out.output.split()), out.output
        assert SECRET not in "".join(out.output.split())  # not even cut by a line wrap
    app.close()
    assert SECRET.encode() not in stored_bytes(tmp_path)


@pytest.mark.parametrize("shape", ["userinfo", "query"])
def test_credentials_in_base_url_are_masked_everywhere(
    app: cairn.App, server: FakeOpenAI, tmp_path: Path, shape: str
) -> None:
    host = server.url.removeprefix("http://")
    base_url = (f"http://azure-user:{SECRET}@{host}" if shape == "userinfo"
                else f"{server.url}?api-key={SECRET}")
    server.script(error(500, "boom"), error(404, "no such deployment"))
    chat = OpenAIChat("gpt-test", base_url=base_url)
    try:
        assert SECRET not in repr(chat)
        assert SECRET not in chat.base_url
        with pytest.raises(ModelUnavailable) as outage:
            chat.complete(ask())
        assert SECRET not in str(outage.value)
        assert "***" in str(outage.value)

        @app.workflow(name="wrong_deployment")
        def wrong_deployment(ctx: cairn.Context) -> str:
            return ctx.model(chat, [Message(role="user", content="hi")]).message.content or ""

        with pytest.raises(cairn.RunFailed, match="no such deployment") as failed:
            app.run(wrong_deployment, run_id="wd")
        assert SECRET not in str(failed.value)
        out = CliRunner().invoke(main, ["show", "wd", "--db", f"sqlite:///{tmp_path}/x.db"])
        assert "no such deployment" in " ".join(out.output.split())
        assert SECRET not in "".join(out.output.split())
    finally:
        chat.close()
    app.close()
    assert SECRET.encode() not in stored_bytes(tmp_path)
    # the credentials were still used
    if shape == "userinfo":
        assert server.requests[0].headers["authorization"].startswith("Basic ")
    else:
        assert server.requests[0].path == f"/v1/chat/completions?api-key={SECRET}"


def test_a_base_url_with_a_query_string_builds_a_correct_url(server: FakeOpenAI) -> None:
    """Azure OpenAI: ``.../deployments/NAME?api-version=...``."""
    host = server.url.removesuffix("/v1")
    server.script(completion("from azure"))
    with OpenAIChat("gpt-4o", base_url=f"{host}/openai/deployments/prod-4o/?api-version=2024-10-21",
                    extra_headers={"api-key": SECRET}) as chat:
        assert chat.complete(ask()).message.content == "from azure"
        assert SECRET not in repr(chat)
    assert server.requests[0].path == "/openai/deployments/prod-4o/chat/completions?api-version=2024-10-21"
    assert server.requests[0].headers["api-key"] == SECRET


def test_a_key_in_extra_headers_echoed_by_the_server_is_masked(server: FakeOpenAI) -> None:
    """Azure sends its key as an ``api-key`` header, not a bearer token."""
    server.script(error(401, f"Access denied due to invalid subscription key {SECRET}."))
    chat = OpenAIChat("gpt-4o", base_url=server.url, extra_headers={"api-key": SECRET})
    with chat, pytest.raises(ModelRequestError, match=r"invalid subscription key \*\*\*") as caught:
        chat.complete(ask())
    assert SECRET not in str(caught.value)


def test_a_short_user_name_does_not_garble_messages(server: FakeOpenAI) -> None:
    host = server.url.removeprefix("http://")
    server.script(error(400, "a bad request"))
    with OpenAIChat("m", base_url=f"http://a:{SECRET}@{host}") as chat:
        with pytest.raises(ModelRequestError, match="HTTP 400: a bad request") as caught:
            chat.complete(ask())
        assert chat.base_url.startswith("http://***@")
    assert SECRET not in str(caught.value)
